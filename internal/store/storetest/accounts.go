package storetest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

func testTenantSettings(t *testing.T, s store.Store) {
	ctx := t.Context()
	k := createKey(t, s, NewKey("key_000000000001", "acme", "free", "s1", t0))
	must(t, "CreateTenant", s.CreateTenant(ctx, store.Tenant{ID: "bare", Plan: "pro", CreatedAt: t0}))
	wantErr(t, "CreateTenant twice", s.CreateTenant(ctx, store.Tenant{ID: "bare", Plan: "free", CreatedAt: t0}), store.ErrExists)
	must(t, "SetPlan", s.SetPlan(ctx, "acme", "enterprise"))
	must(t, "SetTenantDisabled", s.SetTenantDisabled(ctx, "acme", true))
	wantErr(t, "SetPlan unknown", s.SetPlan(ctx, "nobody", "pro"), store.ErrNotFound)
	wantErr(t, "SetTenantDisabled unknown", s.SetTenantDisabled(ctx, "nobody", true), store.ErrNotFound)

	got, err := s.KeyByHash(ctx, sha256.Sum256([]byte("s1")))
	must(t, "KeyByHash", err)
	if got.ID != k.ID || got.Plan != "enterprise" || !got.TenantDisabled {
		t.Errorf("key of a disabled enterprise tenant = %+v, want plan enterprise, TenantDisabled", got)
	}
	ts, err := s.Tenants(ctx)
	must(t, "Tenants", err)
	want := []store.Tenant{
		{ID: "acme", Plan: "enterprise", Disabled: true, CreatedAt: us(t0)},
		{ID: "bare", Plan: "pro", CreatedAt: us(t0)},
	}
	if diff := cmp.Diff(want, ts); diff != "" {
		t.Errorf("Tenants (-want +got):\n%s", diff)
	}
	must(t, "SetTenantDisabled false", s.SetTenantDisabled(ctx, "acme", false))
	one, err := s.Tenant(ctx, "acme")
	must(t, "Tenant", err)
	if one.Disabled {
		t.Errorf("re-enabled tenant is still disabled")
	}
	_, err = s.Tenant(ctx, "nobody")
	wantErr(t, "Tenant unknown", err, store.ErrNotFound)
}

// testRotateNeverWritesPlan is the race of issue 13: rotations that read
// the plan before an operator changed it must never carry it back.
func testRotateNeverWritesPlan(t *testing.T, s store.Store) {
	ctx := t.Context()
	createKey(t, s, NewKey("key_000000000000", "acme", "enterprise", "k0", t0))
	const rounds = 30
	for r := range rounds {
		must(t, "SetPlan enterprise", s.SetPlan(ctx, "acme", "enterprise"))
		old := fmt.Sprintf("key_%012d", r)
		next := fmt.Sprintf("key_%012d", r+1)
		// The rotation carries the plan it read at authentication, the
		// operator moves the tenant to free, at the same moment.
		Parallel(2, func(i int) error {
			if i == 0 {
				_, err := s.RotateKey(ctx, old, NewKey(next, "acme", "enterprise", "k"+next, t0))
				return err
			}
			return s.SetPlan(ctx, "acme", "free")
		})
		tn, err := s.Tenant(ctx, "acme")
		must(t, "Tenant", err)
		if tn.Plan != "free" {
			t.Fatalf("round %d: plan after a rotation raced SetPlan(free) = %q, want free", r, tn.Plan)
		}
	}
}

func testTouchKey(t *testing.T, s store.Store) {
	ctx := t.Context()
	createKey(t, s, NewKey("key_000000000001", "acme", "free", "s1", t0))
	k, err := s.KeyByHash(ctx, sha256.Sum256([]byte("s1")))
	must(t, "KeyByHash", err)
	if !k.LastUsedAt.IsZero() {
		t.Errorf("new key LastUsedAt = %v, want zero", k.LastUsedAt)
	}
	later := t0.Add(time.Hour)
	must(t, "TouchKey", s.TouchKey(ctx, k.ID, later))
	must(t, "TouchKey earlier", s.TouchKey(ctx, k.ID, t0)) // never moves back
	keys, err := s.ListKeys(ctx, "acme")
	must(t, "ListKeys", err)
	if len(keys) != 1 || !keys[0].LastUsedAt.Equal(us(later)) {
		t.Errorf("ListKeys after TouchKey = %+v, want LastUsedAt %v", keys, us(later))
	}
}

func account(id, email, tenant string) store.Account {
	return store.Account{ID: id, Email: email, Name: "N " + id, PasswordHash: "$argon2id$x", Tenant: tenant, Role: store.RoleUser, CreatedAt: t0}
}

func testAccounts(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := account("acc_1", "ann@example.com", "ann")
	must(t, "CreateAccount", s.CreateAccount(ctx, a, "free"))
	tn, err := s.Tenant(ctx, "ann")
	must(t, "Tenant of a new account", err)
	if tn.Plan != "free" {
		t.Errorf("new account's tenant plan = %q, want free", tn.Plan)
	}
	wantErr(t, "same email", s.CreateAccount(ctx, account("acc_2", "ann@example.com", "other"), "free"), store.ErrExists)
	wantErr(t, "same tenant", s.CreateAccount(ctx, account("acc_3", "bob@example.com", "ann"), "free"), store.ErrExists)

	// An existing tenant (made by create-key) is attached and keeps its plan.
	createKey(t, s, NewKey("key_000000000001", "legacy", "pro", "s1", t0))
	must(t, "attach", s.CreateAccount(ctx, account("acc_4", "lee@example.com", "legacy"), "free"))
	if tn, _ := s.Tenant(ctx, "legacy"); tn.Plan != "pro" {
		t.Errorf("attached tenant's plan = %q, want pro kept", tn.Plan)
	}

	got, err := s.AccountByEmail(ctx, "ANN@example.com")
	must(t, "AccountByEmail", err)
	want := a
	want.CreatedAt = us(t0)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AccountByEmail (-want +got):\n%s", diff)
	}
	must(t, "SetPassword", s.SetPassword(ctx, "acc_1", "$argon2id$y"))
	must(t, "MarkVerified", s.MarkVerified(ctx, "acc_1", t0.Add(time.Minute)))
	must(t, "MarkVerified again", s.MarkVerified(ctx, "acc_1", t0.Add(time.Hour)))
	must(t, "SetRole", s.SetRole(ctx, "acc_1", store.RoleOperator))
	got, err = s.AccountByID(ctx, "acc_1")
	must(t, "AccountByID", err)
	if got.PasswordHash != "$argon2id$y" || !got.VerifiedAt.Equal(us(t0.Add(time.Minute))) || got.Role != store.RoleOperator {
		t.Errorf("account after updates = %+v", got)
	}
	_, err = s.AccountByID(ctx, "acc_9")
	wantErr(t, "AccountByID unknown", err, store.ErrNotFound)
	_, err = s.AccountByEmail(ctx, "nobody@example.com")
	wantErr(t, "AccountByEmail unknown", err, store.ErrNotFound)
	wantErr(t, "SetPassword unknown", s.SetPassword(ctx, "acc_9", "h"), store.ErrNotFound)
	all, err := s.ListAccounts(ctx)
	must(t, "ListAccounts", err)
	if len(all) != 2 || all[0].Email != "ann@example.com" || all[1].Email != "lee@example.com" {
		t.Errorf("ListAccounts = %+v, want ann then lee", all)
	}
}

func testAccountsConcurrent(t *testing.T, s store.Store) {
	const n = 8
	errs := Parallel(n, func(i int) error {
		return s.CreateAccount(t.Context(), account(fmt.Sprint("acc_", i), "same@example.com", fmt.Sprint("t", i)), "free")
	})
	ok, exists := CountErrs(t, errs, store.ErrExists)
	if ok != 1 || exists != n-1 {
		t.Errorf("%d concurrent sign-ups with one email: %d ok, %d exists; want 1, %d", n, ok, exists, n-1)
	}
}

func testSessions(t *testing.T, s store.Store) {
	ctx := t.Context()
	must(t, "CreateAccount", s.CreateAccount(ctx, account("acc_1", "ann@example.com", "ann"), "free"))
	h1, h2 := sha256.Sum256([]byte("s1")), sha256.Sum256([]byte("s2"))
	se := store.Session{Hash: h1, AccountID: "acc_1", CSRF: "c1", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	must(t, "CreateSession", s.CreateSession(ctx, se))
	must(t, "CreateSession 2", s.CreateSession(ctx, store.Session{Hash: h2, AccountID: "acc_1", CSRF: "c2", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}))
	got, err := s.SessionByHash(ctx, h1, t0.Add(time.Minute))
	must(t, "SessionByHash", err)
	want := se
	want.CreatedAt, want.ExpiresAt = us(se.CreatedAt), us(se.ExpiresAt)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SessionByHash (-want +got):\n%s", diff)
	}
	_, err = s.SessionByHash(ctx, h1, t0.Add(time.Hour))
	wantErr(t, "expired session", err, store.ErrNotFound)
	must(t, "DeleteSession", s.DeleteSession(ctx, h1))
	_, err = s.SessionByHash(ctx, h1, t0)
	wantErr(t, "deleted session", err, store.ErrNotFound)
	must(t, "DeleteSession again", s.DeleteSession(ctx, h1))
	must(t, "DeleteSessions", s.DeleteSessions(ctx, "acc_1"))
	_, err = s.SessionByHash(ctx, h2, t0)
	wantErr(t, "session after DeleteSessions", err, store.ErrNotFound)
}

func testTokens(t *testing.T, s store.Store) {
	ctx := t.Context()
	h := sha256.Sum256([]byte("invite"))
	tok := store.Token{Hash: h, Kind: store.TokenInvite, Email: "ann@example.com", Tenant: "legacy", Plan: "pro", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	must(t, "CreateToken", s.CreateToken(ctx, tok))
	_, err := s.UseToken(ctx, h, store.TokenReset, t0)
	wantErr(t, "UseToken of another kind", err, store.ErrNotFound)
	_, err = s.PeekToken(ctx, h, store.TokenInvite, t0.Add(time.Hour))
	wantErr(t, "PeekToken expired", err, store.ErrNotFound)
	want := tok
	want.CreatedAt, want.ExpiresAt = us(tok.CreatedAt), us(tok.ExpiresAt)
	got, err := s.PeekToken(ctx, h, store.TokenInvite, t0)
	must(t, "PeekToken", err)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PeekToken (-want +got):\n%s", diff)
	}
	got, err = s.UseToken(ctx, h, store.TokenInvite, t0)
	must(t, "UseToken", err)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("UseToken (-want +got):\n%s", diff)
	}
	_, err = s.UseToken(ctx, h, store.TokenInvite, t0)
	wantErr(t, "UseToken twice", err, store.ErrNotFound)
	_, err = s.PeekToken(ctx, h, store.TokenInvite, t0)
	wantErr(t, "PeekToken of a used token", err, store.ErrNotFound)
}

func testTokenUsedOnce(t *testing.T, s store.Store) {
	h := sha256.Sum256([]byte("reset"))
	must(t, "CreateToken", s.CreateToken(t.Context(), store.Token{Hash: h, Kind: store.TokenReset, AccountID: "acc_1", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}))
	const n = 10
	errs := Parallel(n, func(int) error {
		_, err := s.UseToken(t.Context(), h, store.TokenReset, t0)
		return err
	})
	ok, refused := CountErrs(t, errs, store.ErrNotFound)
	if ok != 1 || refused != n-1 {
		t.Errorf("%d concurrent uses of one token: %d ok, %d refused; want 1, %d", n, ok, refused, n-1)
	}
}

// testPurgeExpired: expired sessions and used or expired tokens go; live
// ones stay and still work.
func testPurgeExpired(t *testing.T, s store.Store) {
	ctx := t.Context()
	must(t, "CreateAccount", s.CreateAccount(ctx, account("acc_1", "ann@example.com", "ann"), "free"))
	now := t0.Add(time.Hour)
	h := func(name string) [32]byte { return sha256.Sum256([]byte(name)) }
	for name, expires := range map[string]time.Time{"expired": now.Add(-time.Second), "at-now": now, "live": now.Add(time.Second)} {
		must(t, "CreateSession "+name, s.CreateSession(ctx, store.Session{Hash: h("session " + name), AccountID: "acc_1", CSRF: "c",
			CreatedAt: t0, ExpiresAt: expires}))
	}
	for _, tok := range []struct {
		name    string
		kind    string
		expires time.Time
		used    bool
	}{
		{"expired invite", store.TokenInvite, now.Add(-time.Minute), false},
		{"used verify", store.TokenVerify, now.Add(time.Hour), true},
		{"expired reset", store.TokenReset, now, false},
		{"live invite", store.TokenInvite, now.Add(time.Hour), false},
		{"live reset", store.TokenReset, now.Add(time.Hour), false},
	} {
		must(t, "CreateToken "+tok.name, s.CreateToken(ctx, store.Token{Hash: h(tok.name), Kind: tok.kind, Email: "ann@example.com",
			AccountID: "acc_1", CreatedAt: t0, ExpiresAt: tok.expires}))
		if tok.used {
			_, err := s.UseToken(ctx, h(tok.name), tok.kind, t0)
			must(t, "UseToken "+tok.name, err)
		}
	}
	sessions, tokens, err := s.PurgeExpired(ctx, now)
	must(t, "PurgeExpired", err)
	if sessions != 2 || tokens != 3 {
		t.Errorf("PurgeExpired deleted %d sessions and %d tokens, want 2 and 3", sessions, tokens)
	}
	if _, err := s.SessionByHash(ctx, h("session live"), now); err != nil {
		t.Errorf("the live session after the purge: %v", err)
	}
	for _, live := range []struct{ name, kind string }{{"live invite", store.TokenInvite}, {"live reset", store.TokenReset}} {
		if _, err := s.PeekToken(ctx, h(live.name), live.kind, now); err != nil {
			t.Errorf("%s after the purge: %v", live.name, err)
		}
	}
	// What is gone is gone: a second purge at the same time finds nothing.
	if sessions, tokens, err := s.PurgeExpired(ctx, now); err != nil || sessions != 0 || tokens != 0 {
		t.Errorf("second PurgeExpired = %d, %d, %v; want 0, 0", sessions, tokens, err)
	}
	// Nothing outlives its time: the expired rows are not merely hidden.
	if _, err := s.SessionByHash(ctx, h("session expired"), t0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an expired session after the purge, looked up at an earlier time: %v, want ErrNotFound (deleted)", err)
	}
}
