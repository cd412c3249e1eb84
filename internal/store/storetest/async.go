package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// The cases of async executions, node heartbeats and webhook secrets.

// accepted is an async execution as a batch or `"async": true` stores it.
func accepted(id, tenant string, at time.Time) store.Execution {
	return store.Execution{ID: id, Tenant: tenant, KeyID: "key_000000000001", RequestID: "req_" + id[4:],
		Language: "python", Image: "datasci", ImageVersion: "20250314T150926Z-1a2b3c", Status: store.StatusQueued,
		CreatedAt: at, Async: true, Request: []byte(`{"language":"python","code":"print(1)\u0000\xff"}`)}
}

// exeID is the n-th execution id of a case.
func exeID(n int) string { return fmt.Sprintf("exe_%032x", n) }

func execution2(t *testing.T, s store.Store, tenant, id string) store.Execution {
	t.Helper()
	e, err := s.Execution(t.Context(), tenant, id)
	must(t, "Execution "+id, err)
	return e
}

// asStored is e as Execution returns it after CreateExecution.
func asStored(e store.Execution) store.Execution {
	e.CreatedAt, e.StartedAt, e.FinishedAt = us(e.CreatedAt), us(e.StartedAt), time.Time{}
	if e.StartedAt.Equal(us(time.Time{})) {
		e.StartedAt = time.Time{}
	}
	return e
}

func testAsyncFieldsRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	withHook := accepted(exeID(1), "acme", t0)
	withHook.Owner, withHook.Reason = "node-a", "kept as given"
	withHook.Webhook = &store.Webhook{URL: "https://hooks.example.com/v1?token=a%20b", DeliveryID: "dlv_" + exeID(1)[4:],
		State: store.WebhookPending}
	plain := store.Execution{ID: exeID(2), Tenant: "acme", KeyID: "key_000000000001", RequestID: "req_2",
		Language: "python", Status: store.StatusRunning, CreatedAt: t0, StartedAt: t0.Add(time.Second), Owner: "node-b"}
	// A webhook without a URL yet is still a webhook: nil and empty differ.
	emptyHook := accepted(exeID(3), "acme", t0)
	emptyHook.Webhook = &store.Webhook{}
	for _, e := range []store.Execution{withHook, plain, emptyHook} {
		must(t, "CreateExecution", s.CreateExecution(ctx, e))
		if diff := cmp.Diff(asStored(e), execution2(t, s, "acme", e.ID), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("created %s (-want +got):\n%s", e.ID, diff)
		}
	}

	// SaveExecution keeps what it is given, webhook and request included,
	// over a created row and as a new row.
	done := withHook
	done.Status, done.Stdout, done.ExitCode, done.Reason = "succeeded", "1\n", 0, ""
	done.StartedAt, done.FinishedAt = t0.Add(time.Second), t0.Add(2*time.Second)
	done.Webhook = &store.Webhook{URL: "https://other.example.com/", DeliveryID: "dlv_x", State: store.WebhookFailed,
		Attempts: 7, LastStatus: 503, LastError: "503 Service Unavailable"}
	fresh := execution(exeID(4), "acme", t0)
	fresh.Async, fresh.Request, fresh.Owner, fresh.Reason = true, []byte("{}"), "node-c", "node node-c stopped"
	fresh.Status = "error"
	fresh.Webhook = &store.Webhook{URL: "https://h.example.com/", DeliveryID: "dlv_4", State: store.WebhookDelivered,
		Attempts: 1, LastStatus: 204}
	noHook := plain
	noHook.Status, noHook.FinishedAt, noHook.Owner = "failed", t0.Add(3*time.Second), ""
	for _, e := range []store.Execution{done, fresh, noHook} {
		must(t, "SaveExecution", s.SaveExecution(ctx, e))
		want := e
		want.CreatedAt, want.StartedAt, want.FinishedAt = us(e.CreatedAt), us(e.StartedAt), us(e.FinishedAt)
		if e.StartedAt.IsZero() {
			want.StartedAt = time.Time{}
		}
		if diff := cmp.Diff(want, execution2(t, s, "acme", e.ID), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("saved %s (-want +got):\n%s", e.ID, diff)
		}
	}
	// A final row is still refused, whatever the new fields say.
	again := done
	again.Webhook = nil
	if err := s.SaveExecution(ctx, again); err == nil {
		t.Errorf("SaveExecution over a finished async execution: no error")
	}
	if got := execution2(t, s, "acme", done.ID); got.Webhook == nil || got.Webhook.Attempts != 7 {
		t.Errorf("refused save changed the webhook: %+v", got.Webhook)
	}
}

// testImageRoundTrip: the image and its build id are written when an
// execution is accepted and kept through every later step, whether the
// row is created, claimed, aborted or saved, by each way of writing it.
func testImageRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	type image struct{ Name, Version string }
	for i, tc := range []struct {
		name   string
		accept func(e store.Execution) error
		finish func(e store.Execution) (store.Execution, error)
		image  image
	}{
		{"sync, saved", func(e store.Execution) error { e.Async = false; return s.CreateExecution(ctx, e) },
			func(e store.Execution) (store.Execution, error) {
				e.Status, e.FinishedAt = "succeeded", t0.Add(time.Second)
				return e, s.SaveExecution(ctx, e)
			}, image{"datasci", "20250314T150926Z-1a2b3c"}},
		{"unbuilt default image, saved without being created", func(store.Execution) error { return nil },
			func(e store.Execution) (store.Execution, error) {
				e.Status, e.FinishedAt = "failed", t0.Add(time.Second)
				return e, s.SaveExecution(ctx, e)
			}, image{"default", ""}},
		{"batch, claimed then aborted", func(e store.Execution) error { return s.CreateExecutions(ctx, []store.Execution{e}) },
			func(e store.Execution) (store.Execution, error) {
				if err := s.ClaimExecution(ctx, e.Tenant, e.ID, "node-a", t0); err != nil {
					return e, err
				}
				return s.AbortExecution(ctx, e.Tenant, e.ID, "error", "node stopped", []string{store.StatusRunning}, t0.Add(time.Second))
			}, image{"node ✓", "v2"}},
	} {
		e := accepted(exeID(i+1), "acme", t0)
		e.Image, e.ImageVersion = tc.image.Name, tc.image.Version
		must(t, tc.name+": accept", tc.accept(e))
		got, err := tc.finish(e)
		must(t, tc.name+": finish", err)
		for what, got := range map[string]store.Execution{"returned": got, "read back": execution2(t, s, "acme", e.ID)} {
			if diff := cmp.Diff(tc.image, image{got.Image, got.ImageVersion}); diff != "" {
				t.Errorf("%s: image of the %s execution (-want +got):\n%s", tc.name, what, diff)
			}
		}
	}
	// The lists carry them too.
	q := accepted(exeID(10), "acme", t0)
	must(t, "CreateExecution", s.CreateExecution(ctx, q))
	queued, err := s.QueuedAsync(ctx, t0.Add(time.Hour), 10)
	must(t, "QueuedAsync", err)
	if len(queued) != 1 || queued[0].Image != q.Image || queued[0].ImageVersion != q.ImageVersion {
		t.Errorf("QueuedAsync = %+v, want %s with image %s %s", queued, q.ID, q.Image, q.ImageVersion)
	}
	must(t, "ClaimExecution", s.ClaimExecution(ctx, "acme", q.ID, "node-b", t0))
	owned, err := s.OwnedExecutions(ctx, "node-b")
	must(t, "OwnedExecutions", err)
	if len(owned) != 1 || owned[0].Image != q.Image || owned[0].ImageVersion != q.ImageVersion {
		t.Errorf("OwnedExecutions = %+v, want %s with image %s %s", owned, q.ID, q.Image, q.ImageVersion)
	}
}

// testExecutionIsACopy: what a caller holds is not the stored row; an
// in-memory store must copy, as a database does.
func testExecutionIsACopy(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := accepted(exeID(1), "acme", t0)
	e.Webhook = &store.Webhook{URL: "https://h.example.com/", State: store.WebhookPending}
	must(t, "CreateExecution", s.CreateExecution(ctx, e))
	want := asStored(e)
	want.Webhook = &store.Webhook{URL: "https://h.example.com/", State: store.WebhookPending}
	want.Request = slices.Clone(e.Request)

	e.Webhook.State, e.Request[0] = store.WebhookFailed, 'X'
	got := execution2(t, s, "acme", e.ID)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after changing the created value (-want +got):\n%s", diff)
	}
	got.Webhook.Attempts, got.Request[1] = 9, 'Y'
	if diff := cmp.Diff(want, execution2(t, s, "acme", e.ID)); diff != "" {
		t.Errorf("after changing a returned value (-want +got):\n%s", diff)
	}
}

func testCreateExecutions(t *testing.T, s store.Store) {
	ctx := t.Context()
	batch := []store.Execution{accepted(exeID(1), "acme", t0), accepted(exeID(2), "acme", t0), accepted(exeID(3), "acme", t0)}
	batch[1].Webhook = &store.Webhook{URL: "https://h.example.com/", DeliveryID: "dlv_2", State: store.WebhookPending}
	must(t, "CreateExecutions", s.CreateExecutions(ctx, batch))
	for _, e := range batch {
		if diff := cmp.Diff(asStored(e), execution2(t, s, "acme", e.ID)); diff != "" {
			t.Errorf("batch item %s (-want +got):\n%s", e.ID, diff)
		}
	}
	must(t, "CreateExecutions of none", s.CreateExecutions(ctx, nil))

	final := accepted(exeID(12), "acme", t0)
	final.Status = "succeeded"
	for _, tc := range []struct {
		name  string
		batch []store.Execution
	}{
		{"an id already stored", []store.Execution{accepted(exeID(10), "acme", t0), accepted(exeID(2), "acme", t0)}},
		{"one id twice", []store.Execution{accepted(exeID(10), "acme", t0), accepted(exeID(11), "acme", t0), accepted(exeID(10), "acme", t0)}},
		{"a final status", []store.Execution{accepted(exeID(10), "acme", t0), accepted(exeID(11), "acme", t0), final}},
	} {
		if err := s.CreateExecutions(ctx, tc.batch); err == nil {
			t.Errorf("CreateExecutions with %s: no error", tc.name)
		}
		for _, e := range tc.batch {
			if e.ID == exeID(2) {
				continue
			}
			if _, err := s.Execution(ctx, "acme", e.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("CreateExecutions with %s stored %s: %v", tc.name, e.ID, err)
			}
		}
	}
	if got := execution2(t, s, "acme", exeID(2)); got.Status != store.StatusQueued || got.Webhook == nil {
		t.Errorf("refused batch changed the stored %s: %+v", exeID(2), got)
	}
}

func testClaimExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := accepted(exeID(1), "acme", t0)
	must(t, "CreateExecution", s.CreateExecution(ctx, e))
	at := t0.Add(time.Second)
	must(t, "ClaimExecution", s.ClaimExecution(ctx, "acme", e.ID, "node-a", at))
	want := asStored(e)
	want.Status, want.StartedAt, want.Owner = store.StatusRunning, us(at), "node-a"
	if diff := cmp.Diff(want, execution2(t, s, "acme", e.ID)); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}

	done := execution(exeID(2), "acme", t0)
	must(t, "SaveExecution", s.SaveExecution(ctx, done))
	for _, tc := range []struct {
		name, tenant, id string
		want             error
	}{
		{"twice", "acme", e.ID, store.ErrNotQueued},
		{"finished", "acme", done.ID, store.ErrFinished},
		{"another tenant's", "other", e.ID, store.ErrNotFound},
		{"unknown", "acme", exeID(3), store.ErrNotFound},
	} {
		wantErr(t, "ClaimExecution "+tc.name, s.ClaimExecution(ctx, tc.tenant, tc.id, "node-b", t0.Add(time.Hour)), tc.want)
	}
	if diff := cmp.Diff(want, execution2(t, s, "acme", e.ID)); diff != "" {
		t.Errorf("after refused claims (-want +got):\n%s", diff)
	}
}

func testClaimExecutionConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := accepted(exeID(1), "acme", t0)
	must(t, "CreateExecution", s.CreateExecution(ctx, e))
	const n = 20
	errs := Parallel(n, func(i int) error {
		return s.ClaimExecution(ctx, "acme", e.ID, fmt.Sprint("node-", i), t0.Add(time.Duration(i)*time.Second))
	})
	ok, refused := CountErrs(t, errs, store.ErrNotQueued)
	if ok != 1 || refused != n-1 {
		t.Fatalf("%d parallel claims: %d won, %d refused; want 1, %d", n, ok, refused, n-1)
	}
	winner := slices.IndexFunc(errs, func(err error) bool { return err == nil })
	got := execution2(t, s, "acme", e.ID)
	if got.Owner != fmt.Sprint("node-", winner) || !got.StartedAt.Equal(us(t0.Add(time.Duration(winner)*time.Second))) {
		t.Errorf("claimed row has owner %q, started %v; want the winner's (node-%d)", got.Owner, got.StartedAt, winner)
	}
}

func testAbortExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	queued := accepted(exeID(1), "acme", t0)
	running := accepted(exeID(2), "acme", t0)
	running.Status, running.StartedAt, running.Owner = store.StatusRunning, t0, "node-a"
	for _, e := range []store.Execution{queued, running} {
		must(t, "CreateExecution", s.CreateExecution(ctx, e))
	}
	at := t0.Add(time.Minute)
	fromQueued := []string{store.StatusQueued}

	got, err := s.AbortExecution(ctx, "acme", queued.ID, store.StatusCanceled, "canceled while queued", fromQueued, at)
	must(t, "AbortExecution", err)
	want := asStored(queued)
	want.Status, want.Reason, want.FinishedAt = store.StatusCanceled, "canceled while queued", us(at)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AbortExecution returned (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, execution2(t, s, "acme", queued.ID)); diff != "" {
		t.Errorf("aborted row (-want +got):\n%s", diff)
	}

	// A running one is not aborted as queued; it is as running.
	got, err = s.AbortExecution(ctx, "acme", running.ID, store.StatusCanceled, "x", fromQueued, at)
	wantErr(t, "AbortExecution from the wrong status", err, store.ErrNotQueued)
	if got.Status != store.StatusRunning || got.ID != running.ID {
		t.Errorf("AbortExecution from the wrong status returned %s %q, want the running row", got.ID, got.Status)
	}
	wantErr(t, "AbortExecution from no status", func() error {
		_, err := s.AbortExecution(ctx, "acme", running.ID, "error", "x", nil, at)
		return err
	}(), store.ErrNotQueued)
	got, err = s.AbortExecution(ctx, "acme", running.ID, "error", "node node-a stopped",
		[]string{store.StatusQueued, store.StatusRunning}, at)
	must(t, "AbortExecution of a running execution", err)
	if got.Status != "error" || got.Reason != "node node-a stopped" || got.Owner != "node-a" || !got.FinishedAt.Equal(us(at)) {
		t.Errorf("aborted running execution = %+v", got)
	}

	// Finished (by abort or by save), unknown, another tenant's.
	got, err = s.AbortExecution(ctx, "acme", queued.ID, "error", "again", fromQueued, at.Add(time.Second))
	wantErr(t, "AbortExecution of an aborted execution", err, store.ErrFinished)
	if got.Status != store.StatusCanceled || got.Reason != "canceled while queued" {
		t.Errorf("AbortExecution of a finished execution returned %q %q, want the stored row", got.Status, got.Reason)
	}
	_, err = s.AbortExecution(ctx, "other", running.ID, "error", "x", fromQueued, at)
	wantErr(t, "AbortExecution of another tenant's execution", err, store.ErrNotFound)
	_, err = s.AbortExecution(ctx, "acme", exeID(9), "error", "x", fromQueued, at)
	wantErr(t, "AbortExecution of an unknown execution", err, store.ErrNotFound)

	// Only to a final status, and never adding usage.
	third := accepted(exeID(3), "acme", t0)
	must(t, "CreateExecution", s.CreateExecution(ctx, third))
	if _, err := s.AbortExecution(ctx, "acme", third.ID, store.StatusRunning, "x", fromQueued, at); err == nil {
		t.Errorf("AbortExecution to a status that is not final: no error")
	}
	if got := execution2(t, s, "acme", third.ID); got.Status != store.StatusQueued {
		t.Errorf("refused abort left status %q, want queued", got.Status)
	}
	if u := usage(t, s, "acme", "2025-03-14"); u != (store.DayUsage{}) {
		t.Errorf("usage after aborts = %+v, want none", u)
	}
	// The node that ran it finds it settled and cannot save over it.
	late := execution(running.ID, "acme", t0)
	if err := s.SaveExecution(ctx, late); err == nil {
		t.Errorf("SaveExecution over an aborted execution: no error")
	}
}

// testAbortExecutionConcurrent: nodes settling one execution, and claims
// racing a cancel of a queued one, have exactly one winner.
func testAbortExecutionConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 20
	running := accepted(exeID(1), "acme", t0)
	running.Status, running.Owner = store.StatusRunning, "node-dead"
	must(t, "CreateExecution", s.CreateExecution(ctx, running))
	errs := Parallel(n, func(i int) error {
		_, err := s.AbortExecution(ctx, "acme", running.ID, "error", fmt.Sprint("settled by node-", i),
			[]string{store.StatusRunning}, t0)
		return err
	})
	if ok, finished := CountErrs(t, errs, store.ErrFinished); ok != 1 || finished != n-1 {
		t.Errorf("%d parallel aborts: %d won, %d ErrFinished; want 1, %d", n, ok, finished, n-1)
	}
	winner := slices.IndexFunc(errs, func(err error) bool { return err == nil })
	if got := execution2(t, s, "acme", running.ID); got.Reason != fmt.Sprint("settled by node-", winner) {
		t.Errorf("reason = %q, want the winner's (node-%d)", got.Reason, winner)
	}

	queued := accepted(exeID(2), "acme", t0)
	must(t, "CreateExecution", s.CreateExecution(ctx, queued))
	errs = Parallel(n, func(i int) error {
		if i%2 == 0 {
			return s.ClaimExecution(ctx, "acme", queued.ID, fmt.Sprint("node-", i), t0)
		}
		_, err := s.AbortExecution(ctx, "acme", queued.ID, store.StatusCanceled, "canceled while queued",
			[]string{store.StatusQueued}, t0)
		return err
	})
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrNotQueued) && !errors.Is(err, store.ErrFinished):
			t.Errorf("racer %d: %v", i, err)
		}
	}
	if won != 1 {
		t.Errorf("%d claims and cancels racing: %d won, want 1", n, won)
	}
}

func testReserveExecutions(t *testing.T, s store.Store) {
	ctx := t.Context()
	const day = "2025-03-14"
	steps := []struct {
		name     string
		n, limit int64
		want     int64 // the count after; with wantErr, the count that stays
		wantErr  error
	}{
		{"3 of 5", 3, 5, 3, nil},
		{"3 more of 5", 3, 5, 3, store.ErrQuotaExceeded},
		{"exactly the rest", 2, 5, 5, nil},
		{"1 over", 1, 5, 5, store.ErrQuotaExceeded},
		{"a raised limit", 2, 7, 7, nil},
	}
	for _, st := range steps {
		used, err := s.ReserveExecutions(ctx, "acme", day, st.n, st.limit)
		if st.wantErr != nil {
			wantErr(t, "ReserveExecutions "+st.name, err, st.wantErr)
		} else if err != nil || used != st.want {
			t.Errorf("ReserveExecutions %s = %d, %v; want %d, nil", st.name, used, err, st.want)
		}
		if u := usage(t, s, "acme", day); u.Executions != st.want {
			t.Errorf("after %s: Usage.Executions = %d, want %d", st.name, u.Executions, st.want)
		}
	}
	// A batch larger than the whole quota, or any batch on a quota of 0,
	// counts nothing even on a fresh day.
	for _, tc := range []struct {
		tenant   string
		n, limit int64
	}{{"fresh", 6, 5}, {"zero", 1, 0}} {
		_, err := s.ReserveExecutions(ctx, tc.tenant, day, tc.n, tc.limit)
		wantErr(t, fmt.Sprintf("ReserveExecutions(%d of %d)", tc.n, tc.limit), err, store.ErrQuotaExceeded)
		if u := usage(t, s, tc.tenant, day); u.Executions != 0 {
			t.Errorf("refused batch of %s counted %d", tc.tenant, u.Executions)
		}
	}
	for _, n := range []int64{0, -3} {
		if _, err := s.ReserveExecutions(ctx, "acme", day, n, 100); err == nil || errors.Is(err, store.ErrQuotaExceeded) {
			t.Errorf("ReserveExecutions(n=%d) error = %v, want a non-quota error", n, err)
		}
	}
	if u := usage(t, s, "acme", day); u.Executions != 7 {
		t.Errorf("after invalid counts: Usage.Executions = %d, want 7", u.Executions)
	}
	_, err := s.ReserveExecutions(ctx, "acme", "2025-3-14", 1, 10)
	if err == nil || errors.Is(err, store.ErrQuotaExceeded) {
		t.Errorf("ReserveExecutions on an invalid day: error = %v, want a non-quota error", err)
	}

	must(t, "RefundExecutions", s.RefundExecutions(ctx, "acme", day, 4))
	if u := usage(t, s, "acme", day); u.Executions != 3 {
		t.Errorf("after refunding 4: Usage.Executions = %d, want 3", u.Executions)
	}
	must(t, "RefundExecutions of 0", s.RefundExecutions(ctx, "acme", day, 0))
	must(t, "RefundExecutions of more than reserved", s.RefundExecutions(ctx, "acme", day, 10))
	must(t, "RefundExecutions of nothing", s.RefundExecutions(ctx, "nobody", day, 2))
	if u := usage(t, s, "acme", day); u.Executions != 0 {
		t.Errorf("after refunding more than reserved: Usage.Executions = %d, want 0", u.Executions)
	}
	if err := s.RefundExecutions(ctx, "acme", day, -1); err == nil {
		t.Errorf("RefundExecutions(-1): no error")
	}
	if err := s.RefundExecutions(ctx, "acme", "today", 1); err == nil {
		t.Errorf("RefundExecutions on an invalid day: no error")
	}
}

func testReserveExecutionsConcurrent(t *testing.T, s store.Store) {
	const (
		n, batch, limit = 30, 4, 50
		day             = "2025-03-14"
	)
	used := make([]int64, n)
	errs := Parallel(n, func(i int) error {
		var err error
		used[i], err = s.ReserveExecutions(t.Context(), "acme", day, batch, limit)
		return err
	})
	ok, refused := CountErrs(t, errs, store.ErrQuotaExceeded)
	if ok != limit/batch || refused != n-limit/batch {
		t.Fatalf("%d parallel batches of %d on a quota of %d: %d counted, %d refused; want %d, %d",
			n, batch, limit, ok, refused, limit/batch, n-limit/batch)
	}
	var counts []int64
	for i, err := range errs {
		if err == nil {
			counts = append(counts, used[i])
		}
	}
	slices.Sort(counts)
	for i, c := range counts {
		if c != int64(batch*(i+1)) {
			t.Fatalf("sorted counts = %v, want %d, %d, ...", counts, batch, 2*batch)
		}
	}
	if u := usage(t, s, "acme", day); u.Executions != limit/batch*batch {
		t.Errorf("Usage.Executions = %d, want %d", u.Executions, limit/batch*batch)
	}
}

func ids(es []store.Execution) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

func testOwnedExecutions(t *testing.T, s store.Store) {
	ctx := t.Context()
	mk := func(n int, tenant, status, owner string) store.Execution {
		e := accepted(exeID(n), tenant, t0)
		e.Status, e.Owner, e.Async = status, owner, owner == ""
		return e
	}
	for _, e := range []store.Execution{
		mk(5, "acme", store.StatusRunning, "node-a"),
		mk(2, "acme", store.StatusQueued, "node-a"), // a sync one waiting for a slot
		mk(9, "other", store.StatusRunning, "node-a"),
		mk(3, "acme", store.StatusRunning, "node-b"),
		mk(4, "acme", store.StatusQueued, ""), // async, in the queue
	} {
		must(t, "CreateExecution", s.CreateExecution(ctx, e))
	}
	finished := execution(exeID(1), "acme", t0)
	finished.Owner = "node-a"
	must(t, "SaveExecution", s.SaveExecution(ctx, finished))
	aborted := mk(6, "acme", store.StatusRunning, "node-a")
	must(t, "CreateExecution", s.CreateExecution(ctx, aborted))
	_, err := s.AbortExecution(ctx, "acme", aborted.ID, "error", "x", []string{store.StatusRunning}, t0)
	must(t, "AbortExecution", err)
	must(t, "ClaimExecution", s.ClaimExecution(ctx, "acme", exeID(4), "node-b", t0))

	for _, tc := range []struct {
		node string
		want []string
	}{
		{"node-a", []string{exeID(2), exeID(5), exeID(9)}}, // across tenants, by id
		{"node-b", []string{exeID(3), exeID(4)}},
		{"node-c", nil},
	} {
		got, err := s.OwnedExecutions(ctx, tc.node)
		must(t, "OwnedExecutions", err)
		if diff := cmp.Diff(tc.want, ids(got), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("OwnedExecutions(%s) (-want +got):\n%s", tc.node, diff)
		}
	}
	got, err := s.OwnedExecutions(ctx, "node-b")
	must(t, "OwnedExecutions", err)
	want := asStored(accepted(exeID(4), "acme", t0))
	want.Status, want.Owner, want.StartedAt = store.StatusRunning, "node-b", us(t0)
	if len(got) == 2 {
		if diff := cmp.Diff(want, got[1]); diff != "" {
			t.Errorf("OwnedExecutions row (-want +got):\n%s", diff)
		}
	}
}

func testQueuedAsync(t *testing.T, s store.Store) {
	ctx := t.Context()
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	for _, e := range []store.Execution{
		accepted(exeID(1), "acme", sec(-1)),
		accepted(exeID(2), "other", sec(-3)),
		accepted(exeID(4), "acme", sec(-2)),
		accepted(exeID(3), "acme", sec(-2)), // the same instant: by id
		accepted(exeID(5), "acme", sec(0)),  // not before t0
		accepted(exeID(6), "acme", sec(-9)), // claimed below
		accepted(exeID(7), "acme", sec(-9)), // canceled below
	} {
		must(t, "CreateExecution", s.CreateExecution(ctx, e))
	}
	sync := accepted(exeID(8), "acme", sec(-9))
	sync.Async = false
	must(t, "CreateExecution", s.CreateExecution(ctx, sync))
	must(t, "ClaimExecution", s.ClaimExecution(ctx, "acme", exeID(6), "node-a", t0))
	_, err := s.AbortExecution(ctx, "acme", exeID(7), store.StatusCanceled, "x", []string{store.StatusQueued}, t0)
	must(t, "AbortExecution", err)

	for _, tc := range []struct {
		before time.Time
		limit  int
		want   []string
	}{
		{t0, 10, []string{exeID(2), exeID(3), exeID(4), exeID(1)}},
		{t0, 2, []string{exeID(2), exeID(3)}},
		{sec(-2), 10, []string{exeID(2)}},
		{sec(1), 10, []string{exeID(2), exeID(3), exeID(4), exeID(1), exeID(5)}},
		{t0, 0, nil},
		{t0, -1, nil},
	} {
		got, err := s.QueuedAsync(ctx, tc.before, tc.limit)
		must(t, "QueuedAsync", err)
		if diff := cmp.Diff(tc.want, ids(got), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("QueuedAsync(%v, %d) (-want +got):\n%s", tc.before.Sub(t0), tc.limit, diff)
		}
	}
	// acme: 1, 3, 4 and 5 queued (6 claimed, 7 canceled, 8 sync).
	for tenant, want := range map[string]int64{"acme": 4, "other": 1, "nobody": 0} {
		n, err := s.CountQueuedAsync(ctx, tenant)
		must(t, "CountQueuedAsync", err)
		if n != want {
			t.Errorf("CountQueuedAsync(%s) = %d, want %d", tenant, n, want)
		}
	}
	got, err := s.QueuedAsync(ctx, t0, 1)
	must(t, "QueuedAsync", err)
	if diff := cmp.Diff([]store.Execution{asStored(accepted(exeID(2), "other", sec(-3)))}, got); diff != "" {
		t.Errorf("QueuedAsync row (-want +got):\n%s", diff)
	}
}

func testUpdateWebhook(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := execution(exeID(1), "acme", t0)
	e.Webhook = &store.Webhook{URL: "https://h.example.com/", DeliveryID: "dlv_1", State: store.WebhookPending}
	must(t, "SaveExecution", s.SaveExecution(ctx, e))
	noHook := execution(exeID(2), "acme", t0)
	must(t, "SaveExecution", s.SaveExecution(ctx, noHook))

	for _, w := range []store.Webhook{
		{URL: "https://h.example.com/", DeliveryID: "dlv_1", State: store.WebhookPending, Attempts: 1, LastStatus: 500, LastError: "500 Internal Server Error"},
		{URL: "https://h.example.com/", DeliveryID: "dlv_1", State: store.WebhookPending, Attempts: 2, LastError: "dial tcp: i/o timeout"},
		{URL: "https://h.example.com/", DeliveryID: "dlv_1", State: store.WebhookDelivered, Attempts: 3, LastStatus: 200},
	} {
		must(t, "UpdateWebhook", s.UpdateWebhook(ctx, "acme", e.ID, w))
		got := execution2(t, s, "acme", e.ID)
		if diff := cmp.Diff(&w, got.Webhook); diff != "" {
			t.Errorf("webhook after UpdateWebhook (-want +got):\n%s", diff)
		}
		if got.Status != e.Status || got.Stdout != e.Stdout {
			t.Errorf("UpdateWebhook changed the execution: %q %q", got.Status, got.Stdout)
		}
	}
	w := store.Webhook{URL: "https://evil.example.com/", State: store.WebhookFailed}
	wantErr(t, "UpdateWebhook of an execution without one", s.UpdateWebhook(ctx, "acme", noHook.ID, w), store.ErrNotFound)
	wantErr(t, "UpdateWebhook of another tenant's", s.UpdateWebhook(ctx, "other", e.ID, w), store.ErrNotFound)
	wantErr(t, "UpdateWebhook of an unknown execution", s.UpdateWebhook(ctx, "acme", exeID(3), w), store.ErrNotFound)
	if got := execution2(t, s, "acme", noHook.ID); got.Webhook != nil {
		t.Errorf("refused UpdateWebhook gave a webhook: %+v", got.Webhook)
	}
	if got := execution2(t, s, "acme", e.ID); got.Webhook.State != store.WebhookDelivered {
		t.Errorf("refused UpdateWebhook changed another tenant's webhook: %+v", got.Webhook)
	}
}

func testHeartbeats(t *testing.T, s store.Store) {
	ctx := t.Context()
	minute := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	stale := func(before time.Time, want ...string) {
		t.Helper()
		got, err := s.StaleNodes(ctx, before)
		must(t, "StaleNodes", err)
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("StaleNodes(%v) (-want +got):\n%s", before.Sub(t0), diff)
		}
	}
	stale(t0)
	must(t, "Heartbeat", s.Heartbeat(ctx, "node-c", "", minute(0)))
	must(t, "Heartbeat", s.Heartbeat(ctx, "node-a", "http://10.0.0.1:8080", minute(-3)))
	must(t, "Heartbeat", s.Heartbeat(ctx, "node-b", "", minute(-2)))
	stale(minute(-1), "node-a", "node-b")
	stale(t0, "node-a", "node-b") // a heartbeat exactly at before is fresh
	stale(minute(-3))
	must(t, "Heartbeat", s.Heartbeat(ctx, "node-a", "http://10.0.0.2:8080", minute(0)))
	stale(minute(-1), "node-b")
	// The address is the last heartbeat's; a node without one has "".
	if a, err := s.NodeAddress(ctx, "node-a"); a != "http://10.0.0.2:8080" || err != nil {
		t.Errorf("NodeAddress(node-a) = %q, %v", a, err)
	}
	if a, err := s.NodeAddress(ctx, "node-c"); a != "" || err != nil {
		t.Errorf("NodeAddress(node-c) = %q, %v", a, err)
	}
	must(t, "ForgetNode", s.ForgetNode(ctx, "node-b"))
	stale(minute(1), "node-a", "node-c")
	if _, err := s.NodeAddress(ctx, "node-b"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("NodeAddress of a forgotten node: %v, want ErrNotFound", err)
	}
	must(t, "ForgetNode of an unknown node", s.ForgetNode(ctx, "node-z"))
	// A forgotten node that beats again is back.
	must(t, "Heartbeat", s.Heartbeat(ctx, "node-b", "", minute(-5)))
	stale(minute(-1), "node-b")
}

func testWebhookSecret(t *testing.T, s store.Store) {
	ctx := t.Context()
	made := 0
	create := func(secret string) func() string {
		return func() string { made++; return secret }
	}
	get := func(tenant string, create func() string, at time.Time) (string, time.Time) {
		t.Helper()
		secret, created, err := s.WebhookSecret(ctx, tenant, create, at)
		must(t, "WebhookSecret", err)
		return secret, created
	}
	for _, tc := range []struct {
		name, tenant, offer string
		at                  time.Time
		want                string
		wantCreated         time.Time
	}{
		{"first use", "acme", "whsec_1", t0, "whsec_1", us(t0)},
		{"again", "acme", "whsec_2", t0.Add(time.Hour), "whsec_1", us(t0)},
		{"another tenant", "other", "whsec_3", t0.Add(time.Minute), "whsec_3", us(t0.Add(time.Minute))},
	} {
		secret, created := get(tc.tenant, create(tc.offer), tc.at)
		if secret != tc.want || !created.Equal(tc.wantCreated) || created.Location() != time.UTC {
			t.Errorf("%s: WebhookSecret = %q, %v; want %q, %v", tc.name, secret, created, tc.want, tc.wantCreated)
		}
	}
	if made < 2 {
		t.Errorf("create was called %d times, want at least once per new tenant", made)
	}

	rotated := t0.Add(2 * time.Hour)
	must(t, "RotateWebhookSecret", s.RotateWebhookSecret(ctx, "acme", "whsec_4", rotated))
	if secret, created := get("acme", create("whsec_5"), t0.Add(3*time.Hour)); secret != "whsec_4" || !created.Equal(us(rotated)) {
		t.Errorf("after rotation: WebhookSecret = %q, %v; want whsec_4, %v", secret, created, us(rotated))
	}
	if secret, _ := get("other", create("whsec_6"), t0); secret != "whsec_3" {
		t.Errorf("rotation of acme changed other's secret to %q", secret)
	}
	// Rotating before first use creates the secret.
	must(t, "RotateWebhookSecret", s.RotateWebhookSecret(ctx, "new", "whsec_7", t0))
	if secret, _ := get("new", create("whsec_8"), t0); secret != "whsec_7" {
		t.Errorf("secret rotated in before first use = %q, want whsec_7", secret)
	}
}

func testWebhookSecretConcurrent(t *testing.T, s store.Store) {
	const n = 20
	secrets := make([]string, n)
	errs := Parallel(n, func(i int) error {
		var err error
		secrets[i], _, err = s.WebhookSecret(t.Context(), "acme", func() string { return fmt.Sprint("whsec_", i) },
			t0.Add(time.Duration(i)*time.Second))
		return err
	})
	for _, err := range errs {
		must(t, "WebhookSecret", err)
	}
	// One offer won, and every caller got it.
	first := secrets[0]
	offered := make([]string, n)
	for i := range offered {
		offered[i] = fmt.Sprint("whsec_", i)
	}
	if !slices.Contains(offered, first) {
		t.Fatalf("secret %q is none of the ones offered", first)
	}
	for i, sec := range secrets {
		if sec != first {
			t.Fatalf("%d parallel first uses got different secrets: %d has %q, 0 has %q", n, i, sec, first)
		}
	}
	got, _, err := s.WebhookSecret(t.Context(), "acme", func() string { return "whsec_late" }, t0)
	must(t, "WebhookSecret", err)
	if got != first {
		t.Errorf("stored secret = %q, want %q", got, first)
	}
}

// testPurgeRequest: Purge blanks the stored request (the user's code) of
// old executions, whatever their status, and leaves recent ones.
func testPurgeRequest(t *testing.T, s store.Store) {
	ctx := t.Context()
	old := accepted(exeID(1), "acme", t0.Add(-48*time.Hour))
	oldDone := execution(exeID(2), "acme", t0.Add(-48*time.Hour))
	oldDone.Async, oldDone.Request = true, []byte(`{"code":"secret"}`)
	oldDone.Webhook = &store.Webhook{URL: "https://h.example.com/", State: store.WebhookDelivered, Attempts: 1, LastStatus: 200}
	recent := accepted(exeID(3), "acme", t0)
	cutoff := t0.Add(-24 * time.Hour)
	// Created at the cutoff as the store keeps it (to the microsecond):
	// not before it.
	atCutoff := accepted(exeID(4), "acme", cutoff)
	must(t, "CreateExecution", s.CreateExecution(ctx, old))
	must(t, "SaveExecution", s.SaveExecution(ctx, oldDone))
	must(t, "CreateExecution", s.CreateExecution(ctx, recent))
	must(t, "CreateExecution", s.CreateExecution(ctx, atCutoff))

	n, err := s.Purge(ctx, cutoff)
	must(t, "Purge", err)
	if n != 2 {
		t.Errorf("Purge = %d, want 2", n)
	}
	for _, id := range []string{old.ID, oldDone.ID} {
		if got := execution2(t, s, "acme", id); len(got.Request) != 0 || !got.Purged {
			t.Errorf("purged %s: Request = %q, Purged = %v; want none, true", id, got.Request, got.Purged)
		}
	}
	if got := execution2(t, s, "acme", oldDone.ID); !cmp.Equal(got.Webhook, oldDone.Webhook) || !got.Async {
		t.Errorf("Purge changed the delivery state or async: %+v, %v", got.Webhook, got.Async)
	}
	for _, e := range []store.Execution{recent, atCutoff} {
		if got := execution2(t, s, "acme", e.ID); !cmp.Equal(got.Request, e.Request) || got.Purged {
			t.Errorf("execution created at %v lost its request: %q, purged %v", e.CreatedAt.Sub(t0), got.Request, got.Purged)
		}
	}
}

// testAbortSettlesIdempotency: settling an execution that a running
// idempotency claim accepted (a node that crashed mid-run) completes the
// claim with it, so the retry replays it at once; a claim that was taken
// over, completed already, or belongs to another key is left alone.
func testAbortSettlesIdempotency(t *testing.T, s store.Store) {
	ctx := t.Context()
	claim := func(key string, at time.Time, abandonedBefore time.Time) (store.Idempotency, bool) {
		t.Helper()
		rec, claimed, err := s.ClaimIdempotency(ctx, "acme", key, "h", at, time.Time{}, abandonedBefore)
		must(t, "ClaimIdempotency "+key, err)
		return rec, claimed
	}
	running := func(id, key string) store.Execution {
		e := accepted(id, "acme", t0)
		e.Status, e.StartedAt, e.Owner, e.IdempotencyKey = store.StatusRunning, t0, "node-a", key
		must(t, "CreateExecution "+id, s.CreateExecution(ctx, e))
		return e
	}
	abort := func(id string) {
		t.Helper()
		_, err := s.AbortExecution(ctx, "acme", id, "error", "the server restarted", []string{store.StatusRunning}, t0.Add(time.Second))
		must(t, "AbortExecution "+id, err)
	}

	// The crash case: claimed, accepted, never completed; settled.
	claim("crashed", t0, time.Time{})
	running(exeID(1), "crashed")
	if got := execution2(t, s, "acme", exeID(1)); got.IdempotencyKey != "" {
		t.Errorf("IdempotencyKey read back as %q; it is not stored on the execution", got.IdempotencyKey)
	}
	abort(exeID(1))
	if rec, claimed := claim("crashed", t0.Add(2*time.Second), time.Time{}); claimed || rec.ExecutionID != exeID(1) {
		t.Errorf("retry after the settling: claimed=%v record %+v, want a replay of %s", claimed, rec, exeID(1))
	}

	// A key that accepted nothing and one of another execution stay running.
	claim("other", t0, time.Time{})
	running(exeID(2), "")
	abort(exeID(2))
	if rec, claimed := claim("other", t0.Add(2*time.Second), time.Time{}); claimed || rec.ExecutionID != "" {
		t.Errorf("unrelated claim after a settling: claimed=%v record %+v, want it still running", claimed, rec)
	}

	// A claim taken over (abandoned) forgets what the old one accepted.
	claim("taken", t0, time.Time{})
	running(exeID(3), "taken")
	if _, claimed := claim("taken", t0.Add(time.Hour), t0.Add(time.Minute)); !claimed {
		t.Fatal("an abandoned claim was not taken over")
	}
	abort(exeID(3))
	if rec, _ := claim("taken", t0.Add(time.Hour+time.Second), time.Time{}); rec.ExecutionID != "" {
		t.Errorf("settling the old claim's execution completed the new claim: %+v", rec)
	}

	// A completed claim keeps its execution.
	claim("done", t0, time.Time{})
	running(exeID(4), "done")
	must(t, "CompleteIdempotency", s.CompleteIdempotency(ctx, "acme", "done", exeID(5)))
	abort(exeID(4))
	if rec, _ := claim("done", t0.Add(2*time.Second), time.Time{}); rec.ExecutionID != exeID(5) {
		t.Errorf("a completed claim changed on a settling: %+v", rec)
	}
}
