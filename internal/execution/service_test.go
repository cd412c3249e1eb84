package execution

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
)

// fakeDriver stands in for a sandbox at the Driver seam. Code "block"
// runs until the test releases it or its context ends (as a real driver
// kills the sandbox then); anything else succeeds at once.
type fakeDriver struct {
	started chan string // spec.ID of every run that starts
	runs    atomic.Int64
	mu      sync.Mutex
	release map[string]chan struct{}
}

func newFakeDriver() *fakeDriver {
	return &fakeDriver{started: make(chan string, 16), release: map[string]chan struct{}{}}
}

func (d *fakeDriver) Name() string                      { return "fake" }
func (d *fakeDriver) Reap(context.Context) (int, error) { return 0, nil }

func (d *fakeDriver) gate(id string) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.release[id] == nil {
		d.release[id] = make(chan struct{})
	}
	return d.release[id]
}

// finish lets the blocked run id end.
func (d *fakeDriver) finish(id string) { close(d.gate(id)) }

func (d *fakeDriver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	d.runs.Add(1)
	d.started <- spec.ID
	res := engine.Result{Status: engine.StatusSucceeded, Stdout: "done\n", Duration: time.Second,
		Usage: engine.Usage{SandboxSeconds: 1, CPUSeconds: 0.5}}
	if spec.Code != "block" {
		return res, nil
	}
	select {
	case <-d.gate(spec.ID):
		return res, nil
	case <-ctx.Done():
		// Killed: what ran so far is reported, as the drivers do.
		res.Status, res.ExitCode, res.Stdout = engine.StatusFailed, 137, "partial\n"
		return res, nil
	}
}

// failingStore fails chosen writes at the Store seam, as a full disk does.
type failingStore struct {
	store.Store
	failCreate, failSave atomic.Bool
}

var errDiskFull = errors.New("disk I/O error: database or disk is full")

func (s *failingStore) CreateExecution(ctx context.Context, e store.Execution) error {
	if s.failCreate.Load() {
		return errDiskFull
	}
	return s.Store.CreateExecution(ctx, e)
}

func (s *failingStore) SaveExecution(ctx context.Context, e store.Execution) error {
	if s.failSave.Load() {
		return errDiskFull
	}
	return s.Store.SaveExecution(ctx, e)
}

// CompleteIdempotency fails with SaveExecution: a full disk takes every
// write after the run.
func (s *failingStore) CompleteIdempotency(ctx context.Context, tenant, key, id string) error {
	if s.failSave.Load() {
		return errDiskFull
	}
	return s.Store.CompleteIdempotency(ctx, tenant, key, id)
}

func (s *failingStore) RefundExecution(ctx context.Context, tenant, day string) error {
	if s.failSave.Load() {
		return errDiskFull
	}
	return s.Store.RefundExecution(ctx, tenant, day)
}

var day0 = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

type testService struct {
	*Service
	store  *failingStore
	driver *fakeDriver
}

// newTestService is a Service over an engine of slots sandbox slots, with
// config's queue places per slot and a minute's queue timeout.
func newTestService(t *testing.T, slots int) testService {
	t.Helper()
	st := &failingStore{Store: storefake.New()}
	d := newFakeDriver()
	eo := enginetest.Options(slots)
	eo.QueueTimeout = time.Minute
	s, err := New(Options{
		Store:      st,
		Engine:     enginetest.New(t, d, eo),
		Languages:  []engine.Language{{Name: "python", File: "main.py"}},
		CancelPoll: 5 * time.Millisecond,
		Now:        func() time.Time { return day0 },
	})
	if err != nil {
		t.Fatal(err)
	}
	return testService{Service: s, store: st, driver: d}
}

func caller(tenant string, maxConcurrent int) Caller {
	p := config.DefaultPlans()["pro"]
	p.MaxConcurrent = maxConcurrent
	return Caller{Key: store.Key{ID: "key_000000000001", Tenant: tenant, Plan: "pro"}, Plan: p}
}

func request(code string) Request {
	lang := "python"
	return Request{Input: Input{Language: &lang, Code: &code}, RequestID: "req_1"}
}

type result struct {
	out Outcome
	err error
}

// start runs req in the background; its outcome arrives on the channel.
func (s testService) start(c Caller, req Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		out, err := s.Run(context.Background(), c, req)
		ch <- result{out, err}
	}()
	return ch
}

func (s testService) status(t *testing.T, c Caller, id string) string {
	t.Helper()
	e, err := s.Get(context.Background(), c, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return e.Status
}

func (s testService) executions(t *testing.T, c Caller) int64 {
	t.Helper()
	u, _, err := s.Usage(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return u.Executions
}

func kindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return -1
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLifecycle: an execution is stored when accepted, shows running while
// its sandbox runs, and its final state when it ends.
func TestLifecycle(t *testing.T) {
	s := newTestService(t, 1)
	c := caller("acme", 1)
	done := s.start(c, request("block"))
	id := <-s.driver.started
	running, err := s.Get(context.Background(), c, id)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Execution{ID: id, Tenant: "acme", KeyID: "key_000000000001", RequestID: "req_1", Language: "python", Image: "default",
		Status: store.StatusRunning, CreatedAt: day0, StartedAt: day0}
	if diff := cmp.Diff(want, running); diff != "" {
		t.Errorf("while running (-want +got):\n%s", diff)
	}
	s.driver.finish(id)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	want.Status, want.Stdout, want.DurationMS, want.SandboxSeconds, want.CPUSeconds, want.FinishedAt = "succeeded", "done\n", 1000, 1, 0.5, day0
	if diff := cmp.Diff(want, r.out.Execution); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	stored, _ := s.Get(context.Background(), c, id)
	if diff := cmp.Diff(want, stored); diff != "" {
		t.Errorf("stored (-want +got):\n%s", diff)
	}
}

// TestCancel: cancel of a running execution kills it and ends it as
// canceled, counted; of a queued one ends it without running, not
// counted; of a finished one is refused.
func TestCancel(t *testing.T) {
	s := newTestService(t, 1)
	ctx := context.Background()
	c := caller("acme", 1)
	first := s.start(c, request("block"))
	runningID := <-s.driver.started
	second := s.start(c, request("block"))
	var queuedID string
	waitFor(t, "second execution queued", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for id := range s.active {
			if id != runningID {
				queuedID = id
			}
		}
		return queuedID != ""
	})
	if got := s.status(t, c, queuedID); got != store.StatusQueued {
		t.Fatalf("second execution is %s, want queued", got)
	}

	// Cancel the queued one first: it must never start, even once the
	// slot frees up.
	e, err := s.Cancel(ctx, c, queuedID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != store.StatusCanceled || !e.StartedAt.IsZero() || e.FinishedAt.IsZero() {
		t.Errorf("canceled while queued: %+v", e)
	}
	if r := <-second; r.err != nil || r.out.Execution.Status != store.StatusCanceled {
		t.Errorf("queued run: %+v %v", r.out.Execution, r.err)
	}
	e, err = s.Cancel(ctx, c, runningID)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != store.StatusCanceled || e.Stdout != "partial\n" || e.ExitCode != 137 || e.SandboxSeconds != 1 {
		t.Errorf("canceled while running: %+v", e)
	}
	if r := <-first; r.err != nil || r.out.Execution.Status != store.StatusCanceled {
		t.Errorf("running run: %+v %v", r.out.Execution, r.err)
	}
	if n := s.driver.runs.Load(); n != 1 {
		t.Errorf("driver ran %d times, want 1 (the queued one never)", n)
	}
	if n := s.executions(t, c); n != 1 {
		t.Errorf("quota used %d, want 1 (the one whose sandbox started)", n)
	}
	for _, tc := range []struct {
		name string
		c    Caller
		id   string
		want Kind
	}{
		{"finished", c, runningID, KindExecutionFinished},
		{"other tenant", caller("globex", 1), queuedID, KindNotFound},
		{"unknown", c, "exe_00000000000000000000000000000000", KindNotFound},
		{"malformed", c, "exe_../x", KindNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Cancel(ctx, tc.c, tc.id); kindOf(err) != tc.want {
				t.Errorf("Cancel: %v, want kind %d", err, tc.want)
			}
		})
	}
}

// TestCancelFromAnotherNode: a cancel recorded in the store (by another
// node's API) reaches the node running the execution through its poll.
func TestCancelFromAnotherNode(t *testing.T) {
	s := newTestService(t, 1)
	c := caller("acme", 1)
	done := s.start(c, request("block"))
	id := <-s.driver.started
	if _, err := s.store.RequestCancel(context.Background(), "acme", id); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.out.Execution.Status != store.StatusCanceled {
		t.Fatalf("got %+v %v, want canceled", r.out.Execution, r.err)
	}
}

// TestNothingAcknowledgedUnstored: when the store cannot record an
// execution, the caller gets KindUnavailable, the quota is given back, no
// id that GET cannot find is handed out, and the Idempotency-Key is
// released so that a retry runs.
func TestNothingAcknowledgedUnstored(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fail     func(*failingStore) *atomic.Bool
		wantRuns int64
	}{
		{"accepting", func(s *failingStore) *atomic.Bool { return &s.failCreate }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestService(t, 1)
			ctx := context.Background()
			c := caller("acme", 1)
			req := request("print(1)")
			req.IdempotencyKey = "k1"
			var accepted []string
			req.Accepted = func(id string) { accepted = append(accepted, id) }
			tc.fail(s.store).Store(true)
			_, err := s.Run(ctx, c, req)
			if kindOf(err) != KindUnavailable || !errors.Is(err, errDiskFull) {
				t.Fatalf("Run: %v, want KindUnavailable wrapping the store's error", err)
			}
			if n := s.driver.runs.Load(); n != tc.wantRuns {
				t.Errorf("driver ran %d times, want %d", n, tc.wantRuns)
			}
			if n := s.executions(t, c); n != 0 {
				t.Errorf("quota used %d after the failure, want 0", n)
			}
			for _, id := range accepted {
				if _, err := s.Get(ctx, c, id); kindOf(err) != KindNotFound {
					t.Errorf("execution %s of the failed request: Get = %v, want not found", id, err)
				}
			}
			// The disk has room again: the retry runs (not 409, not a replay).
			tc.fail(s.store).Store(false)
			out, err := s.Run(ctx, c, req)
			if err != nil || out.Replay || out.Execution.Status != "succeeded" {
				t.Fatalf("retry: %+v %v", out, err)
			}
			if n := s.executions(t, c); n != 1 {
				t.Errorf("quota used %d after the retry, want 1", n)
			}
		})
	}
}

// TestResultOfARunThatCannotBeStored: the store fills up while the code
// runs. The caller gets the result of the run, which happened (not "not
// run"), the quota counts it exactly once, and once the store has room the
// result is stored and the Idempotency-Key replays it.
func TestResultOfARunThatCannotBeStored(t *testing.T) {
	saveRetryFirst, saveRetryMax = time.Millisecond, 5*time.Millisecond
	s := newTestService(t, 1)
	ctx := context.Background()
	c := caller("acme", 1)
	req := request("print(1)")
	req.IdempotencyKey = "k1"
	s.store.failSave.Store(true)
	out, err := s.Run(ctx, c, req)
	if err != nil || out.Execution.Status != "succeeded" || out.Execution.Stdout == "" {
		t.Fatalf("Run with a full store: %+v %v; want the result of the run", out.Execution, err)
	}
	id := out.Execution.ID
	if n := s.driver.runs.Load(); n != 1 {
		t.Errorf("driver ran %d times, want 1", n)
	}
	if n := s.executions(t, c); n != 1 {
		t.Errorf("quota used %d while the result waits for the store, want 1", n)
	}
	if e, err := s.Get(ctx, c, id); err != nil || e.Status != store.StatusRunning {
		t.Errorf("while the store is full: Get = %v %v, want the running row", e.Status, err)
	}
	s.store.failSave.Store(false)
	waitFor(t, "the result stored", func() bool {
		e, err := s.Get(ctx, c, id)
		return err == nil && e.Status == "succeeded" && e.Stdout == out.Execution.Stdout
	})
	again, err := s.Run(ctx, c, req)
	if err != nil || !again.Replay || again.Execution.ID != id {
		t.Fatalf("retry with the key: %+v %v; want a replay of %s", again, err, id)
	}
	if n := s.executions(t, c); n != 1 || s.driver.runs.Load() != 1 {
		t.Errorf("after the retry: quota %d, runs %d; want 1 and 1", n, s.driver.runs.Load())
	}
}

// TestFairAdmission: a tenant holding its whole share of slots (and
// queueing more) does not keep a second tenant from being served, and its
// queued executions run in turn once slots free up.
func TestFairAdmission(t *testing.T) {
	s := newTestService(t, 2)
	a, b := caller("a", 1), caller("b", 1)
	aFirst := s.start(a, request("block"))
	aRunning := <-s.driver.started
	// a's next two wait: a may hold one slot, though one is free.
	aMore := []<-chan result{s.start(a, request("block")), s.start(a, request("block"))}
	waitFor(t, "a's two queued", func() bool { return s.engine.Stats().Waiting == 2 })
	// b is served at once, on the free slot.
	bDone := s.start(b, request("block"))
	bRunning := <-s.driver.started
	if got := s.status(t, b, bRunning); got != store.StatusRunning {
		t.Errorf("b's execution is %s while a saturates its share, want running", got)
	}
	states := map[string]int{}
	s.mu.Lock()
	ids := make([]string, 0, len(s.active))
	for id := range s.active {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		if id == bRunning {
			continue
		}
		states[s.status(t, a, id)]++
	}
	if diff := cmp.Diff(map[string]int{store.StatusRunning: 1, store.StatusQueued: 2}, states); diff != "" {
		t.Errorf("a's executions (-want +got):\n%s", diff)
	}
	// a's first ends: its next queued one runs; b is untouched.
	s.driver.finish(aRunning)
	<-aFirst
	next := <-s.driver.started
	s.driver.finish(next)
	last := <-s.driver.started
	s.driver.finish(last)
	s.driver.finish(bRunning)
	for _, ch := range append(aMore, bDone) {
		if r := <-ch; r.err != nil || r.out.Execution.Status != "succeeded" {
			t.Errorf("run: %+v %v", r.out.Execution, r.err)
		}
	}
}
