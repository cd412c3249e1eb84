// Package storetest is the behaviour suite every store.Store must pass.
// The SQLite and PostgreSQL stores run the same cases, so the API can rely
// on one set of semantics: the sentinel errors, UTC days, microsecond
// times, and the atomicity of quota, key-limit, rate-window and
// idempotency updates under many goroutines at once.
package storetest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// NewStore returns an empty store for one test and arranges for it to be
// closed (and its database removed) when the test ends.
type NewStore func(t *testing.T) store.Store

// Run runs every case, each on a fresh store from newStore.
func Run(t *testing.T, newStore NewStore) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newStore(t))
		})
	}
}

var cases = []struct {
	name string
	run  func(t *testing.T, s store.Store)
}{
	{"CreateKeyAndLookUp", testCreateKeyAndLookUp},
	{"TimesAreUTCMicroseconds", testTimesAreUTCMicroseconds},
	{"KeyByHashUnknown", testKeyByHashUnknown},
	{"CreateKeyPlan", testCreateKeyPlan},
	{"CreateKeyDuplicates", testCreateKeyDuplicates},
	{"RevokeKey", testRevokeKey},
	{"MaxActiveKeys", testMaxActiveKeys},
	{"MaxActiveKeysConcurrent", testMaxActiveKeysConcurrent},
	{"RotateKey", testRotateKey},
	{"RotateKeyAtLimit", testRotateKeyAtLimit},
	{"RotateKeyRefused", testRotateKeyRefused},
	{"RotateKeyConcurrent", testRotateKeyConcurrent},
	{"ListKeys", testListKeys},
	{"ReserveExecution", testReserveExecution},
	{"ReserveExecutionConcurrent", testReserveExecutionConcurrent},
	{"RefundExecution", testRefundExecution},
	{"InvalidDay", testInvalidDay},
	{"CountRequest", testCountRequest},
	{"CountRequestConcurrent", testCountRequestConcurrent},
	{"SaveAndGetExecution", testSaveAndGetExecution},
	{"SaveExecutionDuplicate", testSaveExecutionDuplicate},
	{"ExecutionLifecycle", testExecutionLifecycle},
	{"ExecutionLifecycleRefusals", testExecutionLifecycleRefusals},
	{"DeleteExecution", testDeleteExecution},
	{"UsageByUTCDay", testUsageByUTCDay},
	{"Purge", testPurge},
	{"ClaimIdempotency", testClaimIdempotency},
	{"ClaimIdempotencyStale", testClaimIdempotencyStale},
	{"ClaimIdempotencyAbandoned", testClaimIdempotencyAbandoned},
	{"ReleaseIdempotency", testReleaseIdempotency},
	{"CompleteIdempotencyUnknown", testCompleteIdempotencyUnknown},
	{"ClaimIdempotencyConcurrent", testClaimIdempotencyConcurrent},
	{"AsyncFieldsRoundTrip", testAsyncFieldsRoundTrip},
	{"ImageRoundTrip", testImageRoundTrip},
	{"ExecutionIsACopy", testExecutionIsACopy},
	{"CreateExecutions", testCreateExecutions},
	{"ClaimExecution", testClaimExecution},
	{"ClaimExecutionConcurrent", testClaimExecutionConcurrent},
	{"AbortExecution", testAbortExecution},
	{"AbortExecutionConcurrent", testAbortExecutionConcurrent},
	{"AbortSettlesIdempotency", testAbortSettlesIdempotency},
	{"ReserveExecutions", testReserveExecutions},
	{"ReserveExecutionsConcurrent", testReserveExecutionsConcurrent},
	{"OwnedExecutions", testOwnedExecutions},
	{"QueuedAsync", testQueuedAsync},
	{"UpdateWebhook", testUpdateWebhook},
	{"Heartbeats", testHeartbeats},
	{"WebhookSecret", testWebhookSecret},
	{"WebhookSecretConcurrent", testWebhookSecretConcurrent},
	{"PurgeRequest", testPurgeRequest},
	{"TenantSettings", testTenantSettings},
	{"RotateNeverWritesPlan", testRotateNeverWritesPlan},
	{"TouchKey", testTouchKey},
	{"Accounts", testAccounts},
	{"AccountsConcurrent", testAccountsConcurrent},
	{"Sessions", testSessions},
	{"Tokens", testTokens},
	{"TokenUsedOnce", testTokenUsedOnce},
	{"PurgeExpired", testPurgeExpired},
}

// t0 has sub-microsecond digits on purpose: stores keep microseconds.
var t0 = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

// us is t0 (or any time) as a store returns it.
func us(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// NewKey builds a NewKey whose hash is the SHA-256 of secret.
func NewKey(id, tenant, plan, secret string, at time.Time) store.NewKey {
	return store.NewKey{ID: id, Tenant: tenant, Plan: plan, Hash: sha256.Sum256([]byte(secret)), CreatedAt: at}
}

// Parallel calls fn(0..n-1) on n goroutines released at once, and returns
// the errors by index.
func Parallel(n int, fn func(i int) error) []error {
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// CountErrs counts nil errors and errors matching target; any other error
// fails the test.
func CountErrs(t *testing.T, errs []error, target error) (ok, matched int) {
	t.Helper()
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, target):
			matched++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	return ok, matched
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: error = %v, want %v", what, err, target)
	}
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func createKey(t *testing.T, s store.Store, k store.NewKey) store.Key {
	t.Helper()
	got, err := s.CreateKey(t.Context(), k)
	must(t, "CreateKey "+k.ID, err)
	return got
}

func activeKeys(t *testing.T, s store.Store, tenant string) int {
	t.Helper()
	keys, err := s.ListKeys(t.Context(), tenant)
	must(t, "ListKeys", err)
	n := 0
	for _, k := range keys {
		if k.RevokedAt.IsZero() {
			n++
		}
	}
	return n
}

func testCreateKeyAndLookUp(t *testing.T, s store.Store) {
	ctx := t.Context()
	nk := NewKey("key_000000000001", "acme", "free", "secret-1", t0)
	got, err := s.CreateKey(ctx, nk)
	must(t, "CreateKey", err)
	want := store.Key{ID: nk.ID, Tenant: "acme", Plan: "free", CreatedAt: us(t0)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("CreateKey (-want +got):\n%s", diff)
	}
	got, err = s.KeyByHash(ctx, nk.Hash)
	must(t, "KeyByHash", err)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("KeyByHash (-want +got):\n%s", diff)
	}
	keys, err := s.ListKeys(ctx, "acme")
	must(t, "ListKeys", err)
	if diff := cmp.Diff([]store.Key{want}, keys); diff != "" {
		t.Errorf("ListKeys (-want +got):\n%s", diff)
	}
}

func testTimesAreUTCMicroseconds(t *testing.T, s store.Store) {
	ctx := t.Context()
	zone := time.FixedZone("UTC-5", -5*3600)
	at := time.Date(2025, 3, 14, 22, 30, 0, 999999999, zone)
	_, err := s.CreateKey(ctx, NewKey("key_000000000001", "acme", "free", "s", at))
	must(t, "CreateKey", err)
	got, err := s.KeyByHash(ctx, sha256.Sum256([]byte("s")))
	must(t, "KeyByHash", err)
	if want := at.Truncate(time.Microsecond); !got.CreatedAt.Equal(want) {
		t.Errorf("CreatedAt = %v, want %v", got.CreatedAt, want)
	}
	if loc := got.CreatedAt.Location(); loc != time.UTC {
		t.Errorf("CreatedAt location = %v, want UTC", loc)
	}
}

func testKeyByHashUnknown(t *testing.T, s store.Store) {
	_, err := s.KeyByHash(t.Context(), sha256.Sum256([]byte("nobody")))
	wantErr(t, "KeyByHash of an unknown hash", err, store.ErrNotFound)
}

func testCreateKeyPlan(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := NewKey("key_000000000001", "acme", "free", "s1", t0)
	createKey(t, s, first)

	// A later key never changes the plan: only SetPlan does (issue 13).
	k2 := createKey(t, s, NewKey("key_000000000002", "acme", "enterprise", "s2", t0.Add(time.Second)))
	if k2.Plan != "free" {
		t.Errorf("key created with another plan: Plan = %q, want the tenant's free", k2.Plan)
	}
	must(t, "SetPlan", s.SetPlan(ctx, "acme", "pro"))
	got, err := s.KeyByHash(ctx, first.Hash)
	must(t, "KeyByHash", err)
	if got.Plan != "pro" {
		t.Errorf("first key's plan after SetPlan = %q, want pro", got.Plan)
	}

	// An empty plan keeps the tenant's plan.
	k3 := createKey(t, s, NewKey("key_000000000003", "acme", "", "s3", t0.Add(2*time.Second)))
	if k3.Plan != "pro" {
		t.Errorf("key with empty plan: Plan = %q, want pro", k3.Plan)
	}

	// A new tenant has no plan to keep.
	if _, err := s.CreateKey(ctx, NewKey("key_000000000004", "newco", "", "s4", t0)); err == nil {
		t.Errorf("CreateKey for a new tenant without a plan: no error")
	}
	if _, err := s.KeyByHash(ctx, sha256.Sum256([]byte("s4"))); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("refused key is stored: KeyByHash error = %v", err)
	}
}

func testCreateKeyDuplicates(t *testing.T, s store.Store) {
	ctx := t.Context()
	createKey(t, s, NewKey("key_000000000001", "acme", "free", "s1", t0))
	for _, nk := range []store.NewKey{
		NewKey("key_000000000002", "acme", "free", "s1", t0),  // same hash
		NewKey("key_000000000001", "acme", "free", "s2", t0),  // same id
		NewKey("key_000000000003", "other", "free", "s1", t0), // same hash, other tenant
	} {
		if _, err := s.CreateKey(ctx, nk); err == nil {
			t.Errorf("CreateKey(%s) with a duplicate: no error", nk.ID)
		}
	}
	keys, err := s.ListKeys(ctx, "")
	must(t, "ListKeys", err)
	if len(keys) != 1 {
		t.Errorf("ListKeys after refused duplicates: %d keys, want 1", len(keys))
	}
}

func testRevokeKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	nk := NewKey("key_000000000001", "acme", "free", "s1", t0)
	createKey(t, s, nk)
	at := t0.Add(time.Hour)
	must(t, "RevokeKey", s.RevokeKey(ctx, nk.ID, at))

	_, err := s.KeyByHash(ctx, nk.Hash)
	wantErr(t, "KeyByHash of a revoked key", err, store.ErrNotFound)
	wantErr(t, "RevokeKey twice", s.RevokeKey(ctx, nk.ID, at), store.ErrNotFound)
	wantErr(t, "RevokeKey of an unknown id", s.RevokeKey(ctx, "key_ffffffffffff", at), store.ErrNotFound)

	keys, err := s.ListKeys(ctx, "acme")
	must(t, "ListKeys", err)
	want := []store.Key{{ID: nk.ID, Tenant: "acme", Plan: "free", CreatedAt: us(t0), RevokedAt: us(at)}}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("ListKeys (-want +got):\n%s", diff)
	}
}

func testMaxActiveKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range store.MaxActiveKeys {
		createKey(t, s, NewKey(fmt.Sprintf("key_a%011d", i), "acme", "free", fmt.Sprint("a", i), t0))
	}
	_, err := s.CreateKey(ctx, NewKey("key_a99999999999", "acme", "free", "a-extra", t0))
	wantErr(t, "CreateKey over the limit", err, store.ErrTooManyKeys)

	// The limit is per tenant.
	createKey(t, s, NewKey("key_b00000000000", "other", "free", "b0", t0))

	// Revoked keys do not count.
	must(t, "RevokeKey", s.RevokeKey(ctx, "key_a00000000000", t0))
	createKey(t, s, NewKey("key_a99999999999", "acme", "free", "a-extra", t0))
	if n := activeKeys(t, s, "acme"); n != store.MaxActiveKeys {
		t.Errorf("active keys = %d, want %d", n, store.MaxActiveKeys)
	}
}

func testMaxActiveKeysConcurrent(t *testing.T, s store.Store) {
	const n = 20
	errs := Parallel(n, func(i int) error {
		_, err := s.CreateKey(t.Context(), NewKey(fmt.Sprintf("key_%012d", i), "acme", "free", fmt.Sprint("s", i), t0))
		return err
	})
	ok, refused := CountErrs(t, errs, store.ErrTooManyKeys)
	if ok != store.MaxActiveKeys || refused != n-store.MaxActiveKeys {
		t.Errorf("%d parallel CreateKey: %d created, %d refused; want %d, %d", n, ok, refused, store.MaxActiveKeys, n-store.MaxActiveKeys)
	}
	if got := activeKeys(t, s, "acme"); got != store.MaxActiveKeys {
		t.Errorf("active keys = %d, want %d", got, store.MaxActiveKeys)
	}
}

func testRotateKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	old := NewKey("key_000000000001", "acme", "pro", "old", t0)
	createKey(t, s, old)
	at := t0.Add(time.Hour)
	nk := NewKey("key_000000000002", "acme", "", "new", at)
	got, err := s.RotateKey(ctx, old.ID, nk)
	must(t, "RotateKey", err)
	want := store.Key{ID: nk.ID, Tenant: "acme", Plan: "pro", CreatedAt: us(at)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RotateKey (-want +got):\n%s", diff)
	}

	_, err = s.KeyByHash(ctx, old.Hash)
	wantErr(t, "KeyByHash of the rotated-out key", err, store.ErrNotFound)
	got, err = s.KeyByHash(ctx, nk.Hash)
	must(t, "KeyByHash of the new key", err)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("KeyByHash of the new key (-want +got):\n%s", diff)
	}
	keys, err := s.ListKeys(ctx, "acme")
	must(t, "ListKeys", err)
	wantKeys := []store.Key{
		{ID: old.ID, Tenant: "acme", Plan: "pro", CreatedAt: us(t0), RevokedAt: us(at)},
		want,
	}
	if diff := cmp.Diff(wantKeys, keys); diff != "" {
		t.Errorf("ListKeys (-want +got):\n%s", diff)
	}
}

func testRotateKeyAtLimit(t *testing.T, s store.Store) {
	for i := range store.MaxActiveKeys {
		createKey(t, s, NewKey(fmt.Sprintf("key_%012d", i), "acme", "free", fmt.Sprint("s", i), t0))
	}
	_, err := s.RotateKey(t.Context(), "key_000000000000", NewKey("key_999999999999", "acme", "free", "new", t0))
	must(t, "RotateKey with the maximum of active keys", err)
	if n := activeKeys(t, s, "acme"); n != store.MaxActiveKeys {
		t.Errorf("active keys = %d, want %d", n, store.MaxActiveKeys)
	}
}

func testRotateKeyRefused(t *testing.T, s store.Store) {
	ctx := t.Context()
	createKey(t, s, NewKey("key_acme00000001", "acme", "free", "acme1", t0))
	createKey(t, s, NewKey("key_acme00000002", "acme", "free", "acme2", t0))
	must(t, "RevokeKey", s.RevokeKey(ctx, "key_acme00000002", t0))
	createKey(t, s, NewKey("key_othr00000001", "other", "free", "other1", t0))

	for _, tc := range []struct {
		name, oldID string
	}{
		{"unknown key", "key_ffffffffffff"},
		{"revoked key", "key_acme00000002"},
		{"other tenant's key", "key_othr00000001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nk := NewKey("key_new000000001", "acme", "free", "new-"+tc.name, t0)
			_, err := s.RotateKey(ctx, tc.oldID, nk)
			wantErr(t, "RotateKey", err, store.ErrNotFound)
			if _, err := s.KeyByHash(ctx, nk.Hash); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("refused rotation stored the new key: KeyByHash error = %v", err)
			}
		})
	}
	if _, err := s.KeyByHash(ctx, sha256.Sum256([]byte("other1"))); err != nil {
		t.Errorf("other tenant's key after a refused rotation: %v", err)
	}
	if _, err := s.KeyByHash(ctx, sha256.Sum256([]byte("acme1"))); err != nil {
		t.Errorf("acme's active key after refused rotations: %v", err)
	}
}

func testRotateKeyConcurrent(t *testing.T, s store.Store) {
	createKey(t, s, NewKey("key_000000000000", "acme", "free", "old", t0))
	const n = 10
	errs := Parallel(n, func(i int) error {
		_, err := s.RotateKey(t.Context(), "key_000000000000", NewKey(fmt.Sprintf("key_new%09d", i), "acme", "free", fmt.Sprint("new", i), t0))
		return err
	})
	ok, refused := CountErrs(t, errs, store.ErrNotFound)
	if ok != 1 || refused != n-1 {
		t.Errorf("%d parallel rotations of one key: %d succeeded, %d refused; want 1, %d", n, ok, refused, n-1)
	}
	if got := activeKeys(t, s, "acme"); got != 1 {
		t.Errorf("active keys = %d, want 1", got)
	}
}

func testListKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	createKey(t, s, NewKey("key_a00000000002", "a", "free", "a2", t0.Add(time.Second)))
	createKey(t, s, NewKey("key_a00000000001", "a", "free", "a1", t0))
	createKey(t, s, NewKey("key_b00000000001", "b", "enterprise", "b1", t0))
	must(t, "RevokeKey", s.RevokeKey(ctx, "key_b00000000001", t0.Add(time.Minute)))

	a1 := store.Key{ID: "key_a00000000001", Tenant: "a", Plan: "free", CreatedAt: us(t0)}
	a2 := store.Key{ID: "key_a00000000002", Tenant: "a", Plan: "free", CreatedAt: us(t0.Add(time.Second))}
	b1 := store.Key{ID: "key_b00000000001", Tenant: "b", Plan: "enterprise", CreatedAt: us(t0), RevokedAt: us(t0.Add(time.Minute))}
	for _, tc := range []struct {
		tenant string
		want   []store.Key
	}{
		{"a", []store.Key{a1, a2}},
		{"b", []store.Key{b1}},
		{"", []store.Key{a1, b1, a2}}, // by creation time, then id
		{"nobody", nil},
	} {
		got, err := s.ListKeys(ctx, tc.tenant)
		must(t, "ListKeys", err)
		if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("ListKeys(%q) (-want +got):\n%s", tc.tenant, diff)
		}
	}
}

func usage(t *testing.T, s store.Store, tenant, day string) store.DayUsage {
	t.Helper()
	u, err := s.Usage(t.Context(), tenant, day)
	must(t, "Usage", err)
	return u
}

func testReserveExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	const day = "2025-03-14"
	for want := int64(1); want <= 3; want++ {
		used, err := s.ReserveExecution(ctx, "acme", day, 3)
		must(t, "ReserveExecution", err)
		if used != want {
			t.Errorf("ReserveExecution = %d, want %d", used, want)
		}
	}
	for range 2 {
		_, err := s.ReserveExecution(ctx, "acme", day, 3)
		wantErr(t, "ReserveExecution over the limit", err, store.ErrQuotaExceeded)
	}
	if u := usage(t, s, "acme", day); u.Executions != 3 {
		t.Errorf("Usage.Executions = %d, want 3 (refusals must not count)", u.Executions)
	}
	// A raised limit (plan upgrade) applies at once.
	if used, err := s.ReserveExecution(ctx, "acme", day, 4); err != nil || used != 4 {
		t.Errorf("ReserveExecution with a raised limit = %d, %v; want 4, nil", used, err)
	}
	// Days and tenants count apart.
	for _, tc := range []struct{ tenant, day string }{{"acme", "2025-03-15"}, {"other", day}} {
		if used, err := s.ReserveExecution(ctx, tc.tenant, tc.day, 3); err != nil || used != 1 {
			t.Errorf("ReserveExecution(%s, %s) = %d, %v; want 1, nil", tc.tenant, tc.day, used, err)
		}
	}
	_, err := s.ReserveExecution(ctx, "zero", day, 0)
	wantErr(t, "ReserveExecution with limit 0", err, store.ErrQuotaExceeded)
	if u := usage(t, s, "zero", day); u.Executions != 0 {
		t.Errorf("Usage.Executions with limit 0 = %d, want 0", u.Executions)
	}
}

func testReserveExecutionConcurrent(t *testing.T, s store.Store) {
	const (
		n     = 150
		limit = 100
		day   = "2025-03-14"
	)
	used := make([]int64, n)
	errs := Parallel(n, func(i int) error {
		var err error
		used[i], err = s.ReserveExecution(t.Context(), "acme", day, limit)
		return err
	})
	ok, refused := CountErrs(t, errs, store.ErrQuotaExceeded)
	if ok != limit || refused != n-limit {
		t.Fatalf("%d parallel reservations on a quota of %d: %d ran, %d refused", n, limit, ok, refused)
	}
	var counts []int64
	for i, err := range errs {
		if err == nil {
			counts = append(counts, used[i])
		}
	}
	slices.Sort(counts)
	want := make([]int64, limit)
	for i := range want {
		want[i] = int64(i + 1)
	}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("returned counts (-want +got):\n%s", diff)
	}
	if u := usage(t, s, "acme", day); u.Executions != limit {
		t.Errorf("Usage.Executions = %d, want %d", u.Executions, limit)
	}
}

func testRefundExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	const day = "2025-03-14"
	for range 2 {
		_, err := s.ReserveExecution(ctx, "acme", day, 2)
		must(t, "ReserveExecution", err)
	}
	must(t, "RefundExecution", s.RefundExecution(ctx, "acme", day))
	if used, err := s.ReserveExecution(ctx, "acme", day, 2); err != nil || used != 2 {
		t.Errorf("ReserveExecution after a refund = %d, %v; want 2, nil", used, err)
	}
	// Refunding more than was reserved, or nothing at all, never goes below zero.
	for range 3 {
		must(t, "RefundExecution", s.RefundExecution(ctx, "acme", day))
		must(t, "RefundExecution of nothing", s.RefundExecution(ctx, "nobody", day))
	}
	for tenant, want := range map[string]int64{"acme": 0, "nobody": 0} {
		if u := usage(t, s, tenant, day); u.Executions != want {
			t.Errorf("Usage(%s).Executions = %d, want %d", tenant, u.Executions, want)
		}
	}
}

func testInvalidDay(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, day := range []string{"", "today", "2025-13-01", "2025-3-14", "2025-03-14T00:00:00Z"} {
		if _, err := s.ReserveExecution(ctx, "acme", day, 10); err == nil || errors.Is(err, store.ErrQuotaExceeded) {
			t.Errorf("ReserveExecution(day %q) error = %v, want a non-quota error", day, err)
		}
		if err := s.RefundExecution(ctx, "acme", day); err == nil {
			t.Errorf("RefundExecution(day %q): no error", day)
		}
		if _, err := s.Usage(ctx, "acme", day); err == nil {
			t.Errorf("Usage(day %q): no error", day)
		}
	}
}

func testCountRequest(t *testing.T, s store.Store) {
	ctx := t.Context()
	w := t0.Truncate(time.Minute)
	// The same instant in another zone is the same window.
	sameInParis := w.In(time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		tenant string
		window time.Time
		want   int64
	}{
		{"acme", w, 1},
		{"acme", w, 2},
		{"acme", sameInParis, 3},
		{"acme", w.Add(time.Minute), 1},
		{"other", w, 1},
		{"acme", w, 4},
	} {
		got, err := s.CountRequest(ctx, tc.tenant, tc.window)
		must(t, "CountRequest", err)
		if got != tc.want {
			t.Errorf("CountRequest(%s, %v) = %d, want %d", tc.tenant, tc.window, got, tc.want)
		}
	}
}

func testCountRequestConcurrent(t *testing.T, s store.Store) {
	const n = 50
	w := t0.Truncate(time.Minute)
	counts := make([]int64, n)
	errs := Parallel(n, func(i int) error {
		var err error
		counts[i], err = s.CountRequest(t.Context(), "acme", w)
		return err
	})
	for _, err := range errs {
		must(t, "CountRequest", err)
	}
	slices.Sort(counts)
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i + 1)
	}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("counts of %d parallel requests (-want +got):\n%s", n, diff)
	}
}

func execution(id, tenant string, at time.Time) store.Execution {
	return store.Execution{
		ID:              id,
		Tenant:          tenant,
		KeyID:           "key_000000000001",
		RequestID:       "req_0123456789abcdef0123456789abcdef",
		Language:        "python",
		Image:           "default",
		ImageVersion:    "20250301T000000Z-0f0f0f",
		Status:          "succeeded",
		Stdout:          "hello\n",
		Stderr:          "warning\n",
		ExitCode:        0,
		DurationMS:      42,
		SandboxSeconds:  0.5,
		CPUSeconds:      0.25,
		PeakMemoryBytes: 12 << 20,
		CreatedAt:       at,
	}
}

func testSaveAndGetExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := execution("exe_0123456789abcdef0123456789abcdef", "acme", t0)
	// User code prints anything: NUL, invalid UTF-8, multi-byte runes.
	e.Stdout = "nul\x00 invalid \xff\xfe ok ✓ 日本\n"
	e.Stderr = "Traceback (most recent call last):\n  ZeroDivisionError\n"
	e.Status, e.ExitCode, e.Truncated = "failed", 1, true
	// Returned files are bytes (a PNG), in the order the driver gave them.
	e.Files = []store.File{
		{Path: "out/chart.png", Content: []byte("\x89PNG\r\n\x1a\n\x00\xff")},
		{Path: "a.csv", Content: []byte("a,b\n1,2\n")},
		{Path: "empty", Content: []byte{}},
	}
	e.FilesTruncated = true
	// The network record is the service's JSON, kept as it is.
	e.Network = `{"allow":["pypi.org"],"bytes_in":12,"bytes_out":3,"connections":1,"refused":0,"attempts":[]}`
	must(t, "SaveExecution", s.SaveExecution(ctx, e))

	got, err := s.Execution(ctx, "acme", e.ID)
	must(t, "Execution", err)
	want := e
	want.CreatedAt = us(e.CreatedAt)
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Execution (-want +got):\n%s", diff)
	}
	// Its network bytes are metered with it.
	if u := usage(t, s, "acme", e.CreatedAt.UTC().Format(time.DateOnly)); u.NetworkBytesIn != 12 || u.NetworkBytesOut != 3 {
		t.Errorf("Usage network bytes = %d in, %d out; want 12, 3", u.NetworkBytesIn, u.NetworkBytesOut)
	}

	_, err = s.Execution(ctx, "other", e.ID)
	wantErr(t, "Execution of another tenant's id", err, store.ErrNotFound)
	_, err = s.Execution(ctx, "acme", "exe_ffffffffffffffffffffffffffffffff")
	wantErr(t, "Execution of an unknown id", err, store.ErrNotFound)
}

func testSaveExecutionDuplicate(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := execution("exe_0123456789abcdef0123456789abcdef", "acme", t0)
	must(t, "SaveExecution", s.SaveExecution(ctx, e))
	if err := s.SaveExecution(ctx, e); err == nil {
		t.Fatalf("SaveExecution of a duplicate id: no error")
	}
	// The refused copy adds no metering.
	if u := usage(t, s, "acme", "2025-03-14"); u.SandboxSeconds != 0.5 {
		t.Errorf("Usage.SandboxSeconds = %v, want 0.5", u.SandboxSeconds)
	}
}

// testExecutionLifecycle: queued, then running, then finished, one row
// throughout; metering is added once, when it finishes.
func testExecutionLifecycle(t *testing.T, s store.Store) {
	ctx := t.Context()
	done := execution("exe_0123456789abcdef0123456789abcdef", "acme", t0)
	accepted := store.Execution{ID: done.ID, Tenant: done.Tenant, KeyID: done.KeyID, RequestID: done.RequestID,
		Language: done.Language, Status: store.StatusQueued, CreatedAt: t0}
	must(t, "CreateExecution", s.CreateExecution(ctx, accepted))
	if err := s.CreateExecution(ctx, accepted); err == nil {
		t.Errorf("CreateExecution of a duplicate id: no error")
	}
	steps := []struct {
		name string
		do   func() error
		want store.Execution
	}{
		{"queued", func() error { return nil },
			store.Execution{ID: done.ID, Tenant: "acme", KeyID: done.KeyID, RequestID: done.RequestID, Language: "python",
				Status: store.StatusQueued, CreatedAt: us(t0)}},
		{"running", func() error { return s.StartExecution(ctx, "acme", done.ID, t0.Add(time.Second)) },
			store.Execution{ID: done.ID, Tenant: "acme", KeyID: done.KeyID, RequestID: done.RequestID, Language: "python",
				Status: store.StatusRunning, CreatedAt: us(t0), StartedAt: us(t0.Add(time.Second))}},
		{"cancel requested", func() error { _, err := s.RequestCancel(ctx, "acme", done.ID); return err },
			store.Execution{ID: done.ID, Tenant: "acme", KeyID: done.KeyID, RequestID: done.RequestID, Language: "python",
				Status: store.StatusRunning, CreatedAt: us(t0), StartedAt: us(t0.Add(time.Second)), CancelRequested: true}},
		{"canceled", func() error {
			e := done
			e.Status, e.StartedAt, e.FinishedAt = store.StatusCanceled, t0.Add(time.Second), t0.Add(3*time.Second)
			return s.SaveExecution(ctx, e)
		}, func() store.Execution {
			e := done
			e.Status, e.CreatedAt, e.StartedAt, e.FinishedAt = store.StatusCanceled, us(t0), us(t0.Add(time.Second)), us(t0.Add(3*time.Second))
			e.CancelRequested = true
			return e
		}()},
	}
	for _, step := range steps {
		must(t, step.name, step.do())
		got, err := s.Execution(ctx, "acme", done.ID)
		must(t, "Execution", err)
		if diff := cmp.Diff(step.want, got); diff != "" {
			t.Errorf("after %s: Execution (-want +got):\n%s", step.name, diff)
		}
		// Metering only once the execution has finished.
		want := 0.0
		if store.Final(step.want.Status) {
			want = done.SandboxSeconds
		}
		if u := usage(t, s, "acme", "2025-03-14"); u.SandboxSeconds != want {
			t.Errorf("after %s: Usage.SandboxSeconds = %v, want %v", step.name, u.SandboxSeconds, want)
		}
	}
}

// testExecutionLifecycleRefusals: a finished execution cannot be started,
// canceled, deleted or saved again; another tenant's is not found.
func testExecutionLifecycleRefusals(t *testing.T, s store.Store) {
	ctx := t.Context()
	done := execution("exe_0123456789abcdef0123456789abcdef", "acme", t0)
	must(t, "SaveExecution", s.SaveExecution(ctx, done))
	running := store.Execution{ID: "exe_11111111111111111111111111111111", Tenant: "acme", KeyID: done.KeyID,
		RequestID: done.RequestID, Language: "python", Status: store.StatusRunning, CreatedAt: t0, StartedAt: t0}
	must(t, "CreateExecution", s.CreateExecution(ctx, running))

	got, err := s.RequestCancel(ctx, "acme", done.ID)
	wantErr(t, "RequestCancel of a finished execution", err, store.ErrFinished)
	if got.Status != "succeeded" {
		t.Errorf("RequestCancel of a finished execution returned status %q, want succeeded", got.Status)
	}
	wantErr(t, "StartExecution of a finished execution", s.StartExecution(ctx, "acme", done.ID, t0), store.ErrFinished)
	wantErr(t, "DeleteExecution of a finished execution", s.DeleteExecution(ctx, "acme", done.ID), store.ErrFinished)
	_, err = s.RequestCancel(ctx, "other", running.ID)
	wantErr(t, "RequestCancel of another tenant's execution", err, store.ErrNotFound)
	_, err = s.RequestCancel(ctx, "acme", "exe_ffffffffffffffffffffffffffffffff")
	wantErr(t, "RequestCancel of an unknown execution", err, store.ErrNotFound)
	wantErr(t, "StartExecution of another tenant's execution", s.StartExecution(ctx, "other", running.ID, t0), store.ErrNotFound)
	wantErr(t, "DeleteExecution of another tenant's execution", s.DeleteExecution(ctx, "other", running.ID), store.ErrNotFound)
	other := done
	other.ID, other.Tenant = running.ID, "other"
	if err := s.SaveExecution(ctx, other); err == nil {
		t.Errorf("SaveExecution over another tenant's running execution: no error")
	}
	got, err = s.Execution(ctx, "acme", running.ID)
	must(t, "Execution", err)
	if got.Status != store.StatusRunning {
		t.Errorf("status after the refusals = %q, want running", got.Status)
	}
}

func testDeleteExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	queued := store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Tenant: "acme", KeyID: "key_000000000001",
		RequestID: "req_1", Language: "python", Status: store.StatusQueued, CreatedAt: t0}
	must(t, "CreateExecution", s.CreateExecution(ctx, queued))
	must(t, "DeleteExecution", s.DeleteExecution(ctx, "acme", queued.ID))
	_, err := s.Execution(ctx, "acme", queued.ID)
	wantErr(t, "Execution after DeleteExecution", err, store.ErrNotFound)
	wantErr(t, "DeleteExecution again", s.DeleteExecution(ctx, "acme", queued.ID), store.ErrNotFound)
}

func testUsageByUTCDay(t *testing.T, s store.Store) {
	ctx := t.Context()
	eastern := time.FixedZone("UTC-5", -5*3600)
	saves := []struct {
		tenant  string
		at      time.Time
		sandbox float64
		cpu     float64
	}{
		{"acme", time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC), 1, 0.5},                 // first instant of the 14th
		{"acme", time.Date(2025, 3, 14, 23, 59, 59, 999999000, time.UTC), 0.25, 0.125}, // last microsecond of the 14th
		{"acme", time.Date(2025, 3, 14, 19, 0, 0, 0, eastern), 2, 1},                   // the 15th in UTC
		{"acme", time.Date(2025, 3, 15, 0, 0, 0, 0, time.UTC), 4, 2},
		{"other", time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC), 8, 4},
	}
	for i, sv := range saves {
		e := execution(fmt.Sprintf("exe_%032d", i), sv.tenant, sv.at)
		e.SandboxSeconds, e.CPUSeconds = sv.sandbox, sv.cpu
		must(t, "SaveExecution", s.SaveExecution(ctx, e))
	}
	// Executions counts reservations, not saves.
	for range 2 {
		_, err := s.ReserveExecution(ctx, "acme", "2025-03-15", 10)
		must(t, "ReserveExecution", err)
	}
	for _, tc := range []struct {
		tenant, day string
		want        store.DayUsage
	}{
		{"acme", "2025-03-14", store.DayUsage{SandboxSeconds: 1.25, CPUSeconds: 0.625}},
		{"acme", "2025-03-15", store.DayUsage{Executions: 2, SandboxSeconds: 6, CPUSeconds: 3}},
		{"acme", "2025-03-13", store.DayUsage{}},
		{"other", "2025-03-14", store.DayUsage{SandboxSeconds: 8, CPUSeconds: 4}},
		{"nobody", "2025-03-14", store.DayUsage{}},
	} {
		if diff := cmp.Diff(tc.want, usage(t, s, tc.tenant, tc.day)); diff != "" {
			t.Errorf("Usage(%s, %s) (-want +got):\n%s", tc.tenant, tc.day, diff)
		}
	}
}

func testPurge(t *testing.T, s store.Store) {
	ctx := t.Context()
	old, recent := t0.Add(-48*time.Hour), t0
	cutoff := t0.Add(-24 * time.Hour)

	oldExe := execution("exe_00000000000000000000000000000001", "acme", old)
	newExe := execution("exe_00000000000000000000000000000002", "acme", recent)
	oldExe.Files = []store.File{{Path: "secret.txt", Content: []byte("old data")}}
	newExe.Files = []store.File{{Path: "report.txt", Content: []byte("new data")}}
	oldExe.FilesTruncated = true
	must(t, "SaveExecution", s.SaveExecution(ctx, oldExe))
	must(t, "SaveExecution", s.SaveExecution(ctx, newExe))
	oldDay, newDay := old.Format(time.DateOnly), recent.Format(time.DateOnly)
	usageBefore := []store.DayUsage{usage(t, s, "acme", oldDay), usage(t, s, "acme", newDay)}

	_, _, err := s.ClaimIdempotency(ctx, "acme", "old-key", "h", old, time.Time{}, time.Time{})
	must(t, "ClaimIdempotency", err)
	_, _, err = s.ClaimIdempotency(ctx, "acme", "new-key", "h", recent, time.Time{}, time.Time{})
	must(t, "ClaimIdempotency", err)
	oldWindow, newWindow := old.Truncate(time.Minute), recent.Truncate(time.Minute)
	for range 3 {
		_, err := s.CountRequest(ctx, "acme", oldWindow)
		must(t, "CountRequest", err)
		_, err = s.CountRequest(ctx, "acme", newWindow)
		must(t, "CountRequest", err)
	}

	n, err := s.Purge(ctx, cutoff)
	must(t, "Purge", err)
	if n != 1 {
		t.Errorf("Purge = %d, want 1", n)
	}
	if n, err := s.Purge(ctx, cutoff); err != nil || n != 0 {
		t.Errorf("second Purge = %d, %v; want 0, nil", n, err)
	}

	// Output and files are gone, the row and its metering stay.
	got, err := s.Execution(ctx, "acme", oldExe.ID)
	must(t, "Execution of a purged execution", err)
	want := oldExe
	want.Stdout, want.Stderr, want.Files, want.CreatedAt, want.Purged = "", "", nil, us(old), true
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("purged execution (-want +got):\n%s", diff)
	}
	got, err = s.Execution(ctx, "acme", newExe.ID)
	must(t, "Execution", err)
	if got.Stdout != newExe.Stdout || got.Stderr != newExe.Stderr || !cmp.Equal(got.Files, newExe.Files) {
		t.Errorf("recent execution lost its output: %q, %q, %v", got.Stdout, got.Stderr, got.Files)
	}
	usageAfter := []store.DayUsage{usage(t, s, "acme", oldDay), usage(t, s, "acme", newDay)}
	if diff := cmp.Diff(usageBefore, usageAfter); diff != "" {
		t.Errorf("metering changed by Purge (-before +after):\n%s", diff)
	}

	// The old idempotency record is gone even to a caller that never
	// considers records stale; the recent one stays.
	_, claimed, err := s.ClaimIdempotency(ctx, "acme", "old-key", "h", t0, time.Time{}, time.Time{})
	must(t, "ClaimIdempotency", err)
	if !claimed {
		t.Errorf("old idempotency key survived Purge")
	}
	_, claimed, err = s.ClaimIdempotency(ctx, "acme", "new-key", "h", t0, time.Time{}, time.Time{})
	must(t, "ClaimIdempotency", err)
	if claimed {
		t.Errorf("recent idempotency key was purged")
	}

	if c, err := s.CountRequest(ctx, "acme", oldWindow); err != nil || c != 1 {
		t.Errorf("CountRequest in a purged window = %d, %v; want 1, nil", c, err)
	}
	if c, err := s.CountRequest(ctx, "acme", newWindow); err != nil || c != 4 {
		t.Errorf("CountRequest in a recent window = %d, %v; want 4, nil", c, err)
	}
}

// claim never treats a running claim as abandoned; claimAbandoned does.
func claim(t *testing.T, s store.Store, tenant, key, hash string, now, staleBefore time.Time) (store.Idempotency, bool) {
	t.Helper()
	return claimAbandoned(t, s, tenant, key, hash, now, staleBefore, time.Time{})
}

func claimAbandoned(t *testing.T, s store.Store, tenant, key, hash string, now, staleBefore, abandonedBefore time.Time) (store.Idempotency, bool) {
	t.Helper()
	rec, claimed, err := s.ClaimIdempotency(t.Context(), tenant, key, hash, now, staleBefore, abandonedBefore)
	must(t, "ClaimIdempotency", err)
	return rec, claimed
}

func testClaimIdempotency(t *testing.T, s store.Store) {
	ctx := t.Context()
	stale := t0.Add(-24 * time.Hour)
	first := store.Idempotency{Tenant: "acme", Key: "order-42", BodyHash: "hash-a", CreatedAt: us(t0)}

	steps := []struct {
		name        string
		tenant      string
		hash        string
		now         time.Time
		complete    string // execution id to complete with before the claim
		wantClaimed bool
		wantRec     store.Idempotency
	}{
		{name: "first claim", tenant: "acme", hash: "hash-a", now: t0, wantClaimed: true, wantRec: first},
		{name: "while running", tenant: "acme", hash: "hash-a", now: t0.Add(time.Second), wantRec: first},
		{name: "other body while running", tenant: "acme", hash: "hash-b", now: t0.Add(time.Second), wantRec: first},
		{name: "after completion", tenant: "acme", hash: "hash-a", now: t0.Add(time.Second), complete: "exe_1",
			wantRec: store.Idempotency{Tenant: "acme", Key: "order-42", BodyHash: "hash-a", ExecutionID: "exe_1", CreatedAt: us(t0)}},
		{name: "other tenant, same key", tenant: "other", hash: "hash-b", now: t0.Add(time.Second), wantClaimed: true,
			wantRec: store.Idempotency{Tenant: "other", Key: "order-42", BodyHash: "hash-b", CreatedAt: us(t0.Add(time.Second))}},
	}
	for _, st := range steps {
		if st.complete != "" {
			must(t, "CompleteIdempotency", s.CompleteIdempotency(ctx, "acme", "order-42", st.complete))
		}
		rec, claimed := claim(t, s, st.tenant, "order-42", st.hash, st.now, stale)
		if claimed != st.wantClaimed {
			t.Errorf("%s: claimed = %v, want %v", st.name, claimed, st.wantClaimed)
		}
		if diff := cmp.Diff(st.wantRec, rec); diff != "" {
			t.Errorf("%s: record (-want +got):\n%s", st.name, diff)
		}
	}
}

func testClaimIdempotencyStale(t *testing.T, s store.Store) {
	ctx := t.Context()
	claim(t, s, "acme", "k", "hash-a", t0, time.Time{})
	must(t, "CompleteIdempotency", s.CompleteIdempotency(ctx, "acme", "k", "exe_1"))

	// Created exactly at staleBefore is still live.
	if _, claimed := claim(t, s, "acme", "k", "hash-b", t0.Add(time.Hour), t0); claimed {
		t.Errorf("record created at staleBefore was replaced")
	}
	// Created before staleBefore counts as absent, completed or not.
	later := t0.Add(25 * time.Hour)
	rec, claimed := claim(t, s, "acme", "k", "hash-b", later, t0.Add(time.Microsecond))
	if !claimed {
		t.Fatalf("stale record was not replaced")
	}
	want := store.Idempotency{Tenant: "acme", Key: "k", BodyHash: "hash-b", CreatedAt: us(later)}
	if diff := cmp.Diff(want, rec); diff != "" {
		t.Errorf("replacing record (-want +got):\n%s", diff)
	}
	// The replacement is a live claim like any other.
	if _, claimed := claim(t, s, "acme", "k", "hash-b", later, t0.Add(time.Microsecond)); claimed {
		t.Errorf("replacement was claimed twice")
	}
}

// testClaimIdempotencyAbandoned: a running claim older than abandonedBefore
// belongs to a request that died; it is replaced long before a completed
// record of the same age would be, which stays until staleBefore.
func testClaimIdempotencyAbandoned(t *testing.T, s store.Store) {
	ctx := t.Context()
	const abandonAfter = 3 * time.Minute
	stale := func(now time.Time) time.Time { return now.Add(-24 * time.Hour) }
	abandoned := func(now time.Time) time.Time { return now.Add(-abandonAfter) }
	claim(t, s, "acme", "running", "hash-a", t0, time.Time{})
	claim(t, s, "acme", "done", "hash-a", t0, time.Time{})
	must(t, "CompleteIdempotency", s.CompleteIdempotency(ctx, "acme", "done", "exe_1"))

	steps := []struct {
		name        string
		key         string
		now         time.Time
		wantClaimed bool
		wantRec     store.Idempotency
	}{
		{name: "running, exactly at the threshold", key: "running", now: t0.Add(abandonAfter),
			wantRec: store.Idempotency{Tenant: "acme", Key: "running", BodyHash: "hash-a", CreatedAt: us(t0)}},
		{name: "completed, past the running threshold", key: "done", now: t0.Add(abandonAfter + time.Second),
			wantRec: store.Idempotency{Tenant: "acme", Key: "done", BodyHash: "hash-a", ExecutionID: "exe_1", CreatedAt: us(t0)}},
		{name: "completed, 23 h later", key: "done", now: t0.Add(23 * time.Hour),
			wantRec: store.Idempotency{Tenant: "acme", Key: "done", BodyHash: "hash-a", ExecutionID: "exe_1", CreatedAt: us(t0)}},
		{name: "running, past the threshold", key: "running", now: t0.Add(abandonAfter + time.Second), wantClaimed: true,
			wantRec: store.Idempotency{Tenant: "acme", Key: "running", BodyHash: "hash-b", CreatedAt: us(t0.Add(abandonAfter + time.Second))}},
		{name: "the new claim is live", key: "running", now: t0.Add(abandonAfter + 2*time.Second),
			wantRec: store.Idempotency{Tenant: "acme", Key: "running", BodyHash: "hash-b", CreatedAt: us(t0.Add(abandonAfter + time.Second))}},
		{name: "completed, past staleBefore", key: "done", now: t0.Add(24*time.Hour + time.Second), wantClaimed: true,
			wantRec: store.Idempotency{Tenant: "acme", Key: "done", BodyHash: "hash-b", CreatedAt: us(t0.Add(24*time.Hour + time.Second))}},
	}
	for _, st := range steps {
		rec, claimed := claimAbandoned(t, s, "acme", st.key, "hash-b", st.now, stale(st.now), abandoned(st.now))
		if claimed != st.wantClaimed {
			t.Errorf("%s: claimed = %v, want %v", st.name, claimed, st.wantClaimed)
		}
		if diff := cmp.Diff(st.wantRec, rec); diff != "" {
			t.Errorf("%s: record (-want +got):\n%s", st.name, diff)
		}
	}
}

func testReleaseIdempotency(t *testing.T, s store.Store) {
	ctx := t.Context()
	claim(t, s, "acme", "k", "hash-a", t0, time.Time{})
	must(t, "ReleaseIdempotency", s.ReleaseIdempotency(ctx, "acme", "k"))
	// After a release a retry, even with another body, runs.
	rec, claimed := claim(t, s, "acme", "k", "hash-b", t0.Add(time.Second), time.Time{})
	if !claimed || rec.BodyHash != "hash-b" {
		t.Errorf("claim after release = %+v, %v; want a new claim for hash-b", rec, claimed)
	}
	must(t, "ReleaseIdempotency of an unknown key", s.ReleaseIdempotency(ctx, "acme", "nope"))

	// A completed record must keep replaying: release leaves it alone.
	must(t, "CompleteIdempotency", s.CompleteIdempotency(ctx, "acme", "k", "exe_1"))
	must(t, "ReleaseIdempotency of a completed key", s.ReleaseIdempotency(ctx, "acme", "k"))
	rec, claimed = claim(t, s, "acme", "k", "hash-b", t0.Add(2*time.Second), time.Time{})
	if claimed || rec.ExecutionID != "exe_1" {
		t.Errorf("completed record after release = %+v, claimed %v; want exe_1, not claimed", rec, claimed)
	}
	// Another tenant cannot release this tenant's claim.
	claim(t, s, "acme", "running", "h", t0, time.Time{})
	must(t, "ReleaseIdempotency", s.ReleaseIdempotency(ctx, "other", "running"))
	if _, claimed := claim(t, s, "acme", "running", "h", t0, time.Time{}); claimed {
		t.Errorf("another tenant released acme's claim")
	}
}

func testCompleteIdempotencyUnknown(t *testing.T, s store.Store) {
	ctx := t.Context()
	wantErr(t, "CompleteIdempotency of an unknown key", s.CompleteIdempotency(ctx, "acme", "nope", "exe_1"), store.ErrNotFound)
	claim(t, s, "acme", "k", "h", t0, time.Time{})
	wantErr(t, "CompleteIdempotency of another tenant's key", s.CompleteIdempotency(ctx, "other", "k", "exe_1"), store.ErrNotFound)
}

func testClaimIdempotencyConcurrent(t *testing.T, s store.Store) {
	const n = 50
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T)
	}{
		{"fresh key", func(*testing.T) {}},
		{"stale record", func(t *testing.T) {
			claim(t, s, "acme", "stale record", "old", t0.Add(-48*time.Hour), time.Time{})
		}},
		{"abandoned claim", func(t *testing.T) {
			claim(t, s, "acme", "abandoned claim", "old", t0.Add(-time.Hour), time.Time{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup(t)
			claimed := make([]bool, n)
			errs := Parallel(n, func(i int) error {
				rec, c, err := s.ClaimIdempotency(t.Context(), "acme", tc.name, "hash", t0, t0.Add(-24*time.Hour), t0.Add(-3*time.Minute))
				if err == nil && !c && (rec.BodyHash != "hash" || rec.ExecutionID != "") {
					err = fmt.Errorf("losing claimer saw %+v", rec)
				}
				claimed[i] = c
				return err
			})
			for _, err := range errs {
				must(t, "ClaimIdempotency", err)
			}
			if got := len(slices.DeleteFunc(claimed, func(c bool) bool { return !c })); got != 1 {
				t.Errorf("%d parallel claims: %d claimed, want exactly 1", n, got)
			}
		})
	}
}
