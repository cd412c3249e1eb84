package execution

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// replayMetrics counts replays.
type replayMetrics struct{ replays atomic.Int64 }

func (m *replayMetrics) ObserveReplay()                                 { m.replays.Add(1) }
func (m *replayMetrics) ObserveExecution(string, string, time.Duration) {}

func keyed(key string) Request {
	req := request("")
	req.IdempotencyKey = key
	return req
}

func items(codes ...string) []Input {
	out := make([]Input, len(codes))
	for i, c := range codes {
		out[i] = request(c).Input
	}
	return out
}

func ids(exes []store.Execution) []string {
	out := make([]string, len(exes))
	for i, e := range exes {
		out[i] = e.ID
	}
	return out
}

func errKind(err error) (Kind, bool) {
	var e *Error
	if !errors.As(err, &e) {
		return 0, false
	}
	return e.Kind, true
}

// TestBatchIdempotencyReplay: the same key with the same items (after
// normalising, so "py" is "python") answers the executions first
// accepted, in order and as they are now, and reserves and queues
// nothing more.
func TestBatchIdempotencyReplay(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	m := &replayMetrics{}
	s.Service.metrics = m
	ctx := context.Background()
	c := caller("acme", 4)
	first, err := s.SubmitBatch(ctx, c, keyed("batch-1"), items("a", "b", "c"), nil)
	if err != nil || first.Replay {
		t.Fatalf("first batch: %+v %v", first, err)
	}
	if err := s.RunQueued(ctx, "acme", first.Executions[1].ID); err != nil {
		t.Fatal(err)
	}
	again := items("a", "b", "c")
	py := "py"
	again[2].Language = &py
	second, err := s.SubmitBatch(ctx, c, keyed("batch-1"), again, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Replay {
		t.Errorf("the repeat is not marked as a replay")
	}
	if diff := cmp.Diff(ids(first.Executions), ids(second.Executions)); diff != "" {
		t.Errorf("replayed ids (-first +replay):\n%s", diff)
	}
	var statuses []string
	for _, e := range second.Executions {
		statuses = append(statuses, e.Status)
	}
	if diff := cmp.Diff([]string{store.StatusQueued, "succeeded", store.StatusQueued}, statuses); diff != "" {
		t.Errorf("replayed statuses are not the current ones (-want +got):\n%s", diff)
	}
	var queued []string
	for _, j := range s.queue.runs {
		queued = append(queued, j.ExecutionID)
	}
	if diff := cmp.Diff(ids(first.Executions), queued); diff != "" {
		t.Errorf("queue (-want each job once +got):\n%s", diff)
	}
	if n := s.usage(t, "acme"); n != 3 {
		t.Errorf("usage %d; want the batch counted once (3)", n)
	}
	if n := s.store.Executions(); n != 3 {
		t.Errorf("stored %d executions; want 3", n)
	}
	if n := m.replays.Load(); n != 1 {
		t.Errorf("observed %d replays; want one for the batch", n)
	}
	// Without a key, the same items are a new batch.
	if out, err := s.SubmitBatch(ctx, c, request(""), items("a", "b", "c"), nil); err != nil || out.Replay || s.usage(t, "acme") != 6 {
		t.Errorf("a batch without a key: replay %v, %v, usage %d", out.Replay, err, s.usage(t, "acme"))
	}
}

// TestBatchIdempotencyConflict: a key answers only the request it was
// first used with; other items, another order, or a single request
// (async or sync) under a batch's key, and the reverse, are conflicts
// that accept nothing.
func TestBatchIdempotencyConflict(t *testing.T) {
	hooked := func(hook string, codes ...string) func(asyncService, Request) error {
		return func(s asyncService, req Request) error {
			var u *string
			if hook != "" {
				u = &hook
			}
			_, err := s.SubmitBatch(context.Background(), caller("acme", 4), req, items(codes...), u)
			return err
		}
	}
	batch := func(codes ...string) func(asyncService, Request) error { return hooked("", codes...) }
	submit := func(code string) func(asyncService, Request) error {
		return func(s asyncService, req Request) error {
			req.Input = request(code).Input
			_, err := s.Submit(context.Background(), caller("acme", 4), req)
			return err
		}
	}
	run := func(code string) func(asyncService, Request) error {
		return func(s asyncService, req Request) error {
			req.Input = request(code).Input
			_, err := s.Run(context.Background(), caller("acme", 4), req)
			return err
		}
	}
	for _, tc := range []struct {
		name          string
		first, second func(asyncService, Request) error
	}{
		{"other items", batch("a", "b"), batch("a", "c")},
		{"other order", batch("a", "b"), batch("b", "a")},
		{"fewer items", batch("a", "b"), batch("a")},
		{"more items", batch("a"), batch("a", "b")},
		{"another batch webhook", hooked("http://127.0.0.1:9/a", "a"), hooked("http://127.0.0.1:9/b", "a")},
		{"a batch webhook added", batch("a"), hooked("http://127.0.0.1:9/a", "a")},
		{"async single, then batch of it", submit("a"), batch("a")},
		{"batch of one, then async single of it", batch("a"), submit("a")},
		{"batch of one, then sync run of it", batch("a"), run("a")},
		{"sync run, then batch of it", run("a"), batch("a")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			guard := webhook.NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
			s := newAsyncService(t, nil, &Webhooks{Guard: guard, Client: webhook.NewClient(webhook.Options{Guard: guard})})
			if err := tc.first(s, keyed("k1")); err != nil {
				t.Fatal(err)
			}
			stored, used, queued := s.store.Executions(), s.usage(t, "acme"), len(s.queue.runs)
			err := tc.second(s, keyed("k1"))
			if k, ok := errKind(err); !ok || k != KindIdempotencyConflict {
				t.Fatalf("second request: %v; want an idempotency conflict", err)
			}
			if s.store.Executions() != stored || s.usage(t, "acme") != used || len(s.queue.runs) != queued || s.driver.runs.Load() > 1 {
				t.Errorf("the conflict accepted something: stored %d->%d, usage %d->%d, queued %d->%d, ran %d",
					stored, s.store.Executions(), used, s.usage(t, "acme"), queued, len(s.queue.runs), s.driver.runs.Load())
			}
		})
	}
}

// TestBatchIdempotencyParallel: repeats that arrive while the first batch
// is being accepted wait for it and replay it: one batch is accepted,
// and every answer holds its ids.
func TestBatchIdempotencyParallel(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	start := time.Now()
	s.Service.now = func() time.Time { return day0.Add(time.Since(start)) }
	ctx := context.Background()
	const n = 8
	answers := make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.SubmitBatch(ctx, caller("acme", 4), keyed("k1"), items("a", "b", "c"), nil)
			answers[i], errs[i] = ids(out.Executions), err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if diff := cmp.Diff(answers[0], answers[i]); diff != "" {
			t.Errorf("request %d answered other ids (-first +this):\n%s", i, diff)
		}
	}
	if s.usage(t, "acme") != 3 || len(s.queue.runs) != 3 || s.store.Executions() != 3 {
		t.Errorf("usage %d, queued %d, stored %d; want one batch of 3", s.usage(t, "acme"), len(s.queue.runs), s.store.Executions())
	}
}

// TestBatchIdempotencyRelease: a batch refused for its quota or because
// it could not be queued gives its key up, so a corrected retry with the
// same key runs (and is not a replay); an invalid batch never claims it.
func TestBatchIdempotencyRelease(t *testing.T) {
	plans := config.DefaultPlans()
	small := plans["pro"]
	small.ExecutionsPerDay = 2
	plans["small"] = small
	c := caller("acme", 4)
	c.Key.Plan, c.Plan = "small", small
	bad := items("a", "b")
	bad[1].Code = nil
	for _, tc := range []struct {
		name    string
		refused []Input
		before  func(asyncService)
		want    Kind
	}{
		{"over the quota", items("a", "b", "c"), nil, KindQuotaExceeded},
		{"invalid item", bad, nil, KindInvalidRequest},
		{"queue down", items("a", "b"), func(s asyncService) { s.queue.fail = true }, KindUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newAsyncService(t, plans, nil)
			ctx := context.Background()
			if tc.before != nil {
				tc.before(s)
			}
			_, err := s.SubmitBatch(ctx, c, keyed("k1"), tc.refused, nil)
			if k, ok := errKind(err); !ok || k != tc.want {
				t.Fatalf("refused batch: %v; want kind %d", err, tc.want)
			}
			s.queue.fail = false
			out, err := s.SubmitBatch(ctx, c, keyed("k1"), items("a", "b"), nil)
			if err != nil || out.Replay || len(out.Executions) != 2 {
				t.Fatalf("corrected retry with the same key: %+v %v", out, err)
			}
			if s.usage(t, "acme") != 2 || len(s.queue.runs) != 2 {
				t.Errorf("after the retry: usage %d, queued %d; want 2 and 2", s.usage(t, "acme"), len(s.queue.runs))
			}
		})
	}
}

// TestBatchIdempotencyInProgress: while the key's first batch is still
// being accepted (its claim holds no ids yet), a repeat waits, then
// answers idempotency_in_progress with a Retry-After.
func TestBatchIdempotencyInProgress(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	s.Service.opts.IdempotencyWait = 30 * time.Millisecond
	start := time.Now()
	s.Service.now = func() time.Time { return day0.Add(time.Since(start)) } // the wait must end
	ctx := context.Background()
	c := caller("acme", 4)
	in := items("a", "b")
	ps := make([]prepared, len(in))
	for i := range in {
		var err error
		if ps[i], err = s.prepare(c, in[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, claimed, err := s.store.ClaimIdempotency(ctx, "acme", "k1", batchHash(ps, []string{"", ""}), day0, day0.Add(-IdempotencyTTL), day0.Add(-time.Hour)); err != nil || !claimed {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	_, err := s.SubmitBatch(ctx, c, keyed("k1"), in, nil)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindIdempotencyInProgress || e.RetryAfter != 1 {
		t.Fatalf("err %v; want idempotency_in_progress with Retry-After 1", err)
	}
	if s.store.Executions() != 0 || s.usage(t, "acme") != 0 {
		t.Errorf("the waiting batch accepted something")
	}
}

// TestIDsRoundTrip: the record of a batch keeps its ids in order, and a
// single request's record is its one id.
func TestIDsRoundTrip(t *testing.T) {
	for _, exes := range [][]store.Execution{
		{{ID: newID()}},
		{{ID: newID()}, {ID: newID()}, {ID: newID()}},
	} {
		rec := joinIDs(exes)
		if len(exes) == 1 && rec != exes[0].ID {
			t.Errorf("single record %q; want the bare id %q", rec, exes[0].ID)
		}
		if diff := cmp.Diff(ids(exes), splitIDs(rec)); diff != "" {
			t.Errorf("round trip of %q (-want +got):\n%s", rec, diff)
		}
	}
}
