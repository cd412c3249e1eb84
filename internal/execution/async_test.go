package execution

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/queue"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// fakeQueue records what the service queues; tests work the jobs by
// calling RunQueued and DeliverWebhook themselves.
type fakeQueue struct {
	mu         sync.Mutex
	runs       []queue.RunArgs
	deliveries []queue.DeliverArgs
	fail       bool
}

func (q *fakeQueue) EnqueueRuns(_ context.Context, jobs []queue.RunArgs) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.fail {
		return errors.New("queue down")
	}
	q.runs = append(q.runs, jobs...)
	return nil
}

func (q *fakeQueue) EnqueueDelivery(_ context.Context, d queue.DeliverArgs) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.deliveries = append(q.deliveries, d)
	return nil
}

type asyncService struct {
	*Service
	store  *storefake.Store
	driver *fakeDriver
	queue  *fakeQueue
	now    *time.Time
}

func newAsyncService(t *testing.T, plans map[string]config.Plan, hooks *Webhooks) asyncService {
	t.Helper()
	st := storefake.New()
	d := newFakeDriver()
	q := &fakeQueue{}
	now := day0
	if plans == nil {
		plans = config.DefaultPlans()
	}
	s, err := New(Options{
		Store:      st,
		Engine:     enginetest.New(t, d, engine.Options{MaxConcurrent: 4, MaxQueue: 16, QueueTimeout: time.Minute}),
		Languages:  []engine.Language{{Name: "python", File: "main.py"}},
		Plans:      plans,
		CancelPoll: 5 * time.Millisecond,
		NodeID:     "node-a",
		Queue:      q,
		Webhooks:   hooks,
		Render: func(e store.Execution) ([]byte, error) {
			return []byte(`{"id":"` + e.ID + `","status":"` + e.Status + `"}`), nil
		},
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	return asyncService{Service: s, store: st, driver: d, queue: q, now: &now}
}

func (s asyncService) usage(t *testing.T, tenant string) int64 {
	t.Helper()
	u, err := s.store.Usage(context.Background(), tenant, day0.Format(time.DateOnly))
	if err != nil {
		t.Fatal(err)
	}
	return u.Executions
}

// submit accepts code as tenant acme's async execution.
func (s asyncService) submit(t *testing.T, code string) store.Execution {
	t.Helper()
	out, err := s.Submit(context.Background(), caller("acme", 4), request(code))
	if err != nil {
		t.Fatal(err)
	}
	return out.Execution
}

func (s asyncService) get(t *testing.T, tenant, id string) store.Execution {
	t.Helper()
	e, err := s.store.Execution(context.Background(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestSubmitRunsExactlyOnce: an async execution is stored queued with its
// quota reserved and one job queued; two workers racing for it run it
// once, and it ends stored with its result.
func TestSubmitRunsExactlyOnce(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	ctx := context.Background()
	e := s.submit(t, "print(1)")
	if e.Status != store.StatusQueued || !e.Async || len(s.queue.runs) != 1 || s.queue.runs[0].ExecutionID != e.ID {
		t.Fatalf("accepted %+v, queued %v", e, s.queue.runs)
	}
	if n := s.usage(t, "acme"); n != 1 {
		t.Errorf("usage %d; want the reservation counted at acceptance", n)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.RunQueued(ctx, "acme", e.ID); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := s.driver.runs.Load(); n != 1 {
		t.Errorf("ran %d times; want once", n)
	}
	got := s.get(t, "acme", e.ID)
	if got.Status != "succeeded" || got.Stdout != "done\n" || got.Owner != "node-a" {
		t.Errorf("stored %+v", got)
	}
	if n := s.usage(t, "acme"); n != 1 {
		t.Errorf("usage %d after the run; want 1", n)
	}
	if err := s.RunQueued(ctx, "acme", e.ID); err != nil || s.driver.runs.Load() != 1 {
		t.Errorf("a late retry of the job: %v, runs %d", err, s.driver.runs.Load())
	}
}

// TestSubmitBatch: validation is all or nothing with the bad index named,
// the quota is reserved for the whole batch or not at all.
func TestSubmitBatch(t *testing.T) {
	plans := config.DefaultPlans()
	small := plans["pro"]
	small.ExecutionsPerDay = 5
	plans["small"] = small
	s := newAsyncService(t, plans, nil)
	ctx := context.Background()
	c := caller("acme", 4)
	c.Key.Plan, c.Plan = "small", small
	item := func(code string) Input { return request(code).Input }
	out, err := s.SubmitBatch(ctx, c, request(""), []Input{item("a"), item("b"), item("c")}, nil)
	exes := out.Executions
	if err != nil || len(exes) != 3 || s.usage(t, "acme") != 3 || len(s.queue.runs) != 3 {
		t.Fatalf("batch of 3: %v, %d exes, usage %d, queued %d", err, len(exes), s.usage(t, "acme"), len(s.queue.runs))
	}
	for i, e := range exes {
		if s.queue.runs[i].ExecutionID != e.ID {
			t.Errorf("order: job %d is %s, execution %s", i, s.queue.runs[i].ExecutionID, e.ID)
		}
	}
	bad := item("x")
	bad.Code = nil
	_, err = s.SubmitBatch(ctx, c, request(""), []Input{item("a"), bad}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindInvalidRequest || !strings.HasPrefix(e.Msg, "executions[1]: code") {
		t.Errorf("bad item: %v", err)
	}
	_, err = s.SubmitBatch(ctx, c, request(""), []Input{item("a"), item("b"), item("c")}, nil)
	if !errors.As(err, &e) || e.Kind != KindQuotaExceeded {
		t.Errorf("over the quota: %v", err)
	}
	many := make([]Input, MaxBatch+1)
	for i := range many {
		many[i] = item("x")
	}
	if _, err := s.SubmitBatch(ctx, c, request(""), many, nil); !errors.As(err, &e) || e.Kind != KindInvalidRequest {
		t.Errorf("%d items: %v", len(many), err)
	}
	if n, q := s.usage(t, "acme"), len(s.queue.runs); n != 3 || q != 3 || s.store.Executions() != 3 {
		t.Errorf("after the refusals: usage %d, queued %d, stored %d; want 3 of each", n, q, s.store.Executions())
	}
}

// TestSubmitQueueDown: nothing is acknowledged that is not queued.
func TestSubmitQueueDown(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	s.queue.fail = true
	_, err := s.Submit(context.Background(), caller("acme", 4), request("print(1)"))
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindUnavailable {
		t.Fatalf("err %v; want unavailable", err)
	}
	if s.usage(t, "acme") != 0 || s.store.Executions() != 0 {
		t.Errorf("usage %d, stored %d; want nothing left", s.usage(t, "acme"), s.store.Executions())
	}
}

// TestCancelQueuedAsync: canceled while queued, it never runs and is
// refunded; the job that comes later does nothing.
func TestCancelQueuedAsync(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	ctx := context.Background()
	c := caller("acme", 4)
	out, err := s.Submit(ctx, c, request("print(1)"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Cancel(ctx, c, out.Execution.ID)
	if err != nil || got.Status != store.StatusCanceled || got.Reason == "" {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	if s.usage(t, "acme") != 0 {
		t.Errorf("usage %d; want the canceled queued run refunded", s.usage(t, "acme"))
	}
	if err := s.RunQueued(ctx, "acme", out.Execution.ID); err != nil || s.driver.runs.Load() != 0 {
		t.Errorf("the job after the cancel: %v, runs %d", err, s.driver.runs.Load())
	}
}

// TestSettleStoppedNode: a node that stopped leaves executions running;
// they end as error with a reason, their quota refunded exactly once
// however many nodes settle them, and a result the stopped node still
// saves afterwards does not replace the settled one.
func TestSettleStoppedNode(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	ctx := context.Background()
	id := s.submit(t, "print(1)").ID
	if err := s.store.ClaimExecution(ctx, "acme", id, "node-b", day0); err != nil {
		t.Fatal(err)
	}
	for range 2 { // two nodes see node-b stopped
		s.settle(ctx, "node-b", "the node running it stopped")
	}
	got := s.get(t, "acme", id)
	if got.Status != statusError || got.Reason != "the node running it stopped" || got.FinishedAt.IsZero() {
		t.Errorf("settled %+v", got)
	}
	if n := s.usage(t, "acme"); n != 0 {
		t.Errorf("usage %d; want the reservation refunded once", n)
	}
	late := got
	late.Status, late.Stdout = "succeeded", "late\n"
	if err := s.store.SaveExecution(ctx, late); err == nil {
		t.Errorf("a late save over the settled execution was accepted")
	}
	if err := s.RunQueued(ctx, "acme", id); err != nil || s.driver.runs.Load() != 0 {
		t.Errorf("the rescued job: %v, runs %d", err, s.driver.runs.Load())
	}
}

// TestRunQueuedPlatformError: the sandbox failed, so the execution ends as
// error with a reason and is not counted.
func TestRunQueuedPlatformError(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	s.Service.engine = enginetest.New(t, failDriver{}, engine.Options{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Minute})
	ctx := context.Background()
	id := s.submit(t, "print(1)").ID
	if err := s.RunQueued(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	got := s.get(t, "acme", id)
	if got.Status != statusError || !strings.Contains(got.Reason, "not counted") || s.usage(t, "acme") != 0 {
		t.Errorf("stored %+v, usage %d", got, s.usage(t, "acme"))
	}
}

type failDriver struct{}

func (failDriver) Name() string                      { return "fail" }
func (failDriver) Reap(context.Context) (int, error) { return 0, nil }
func (failDriver) Run(context.Context, engine.Spec) (engine.Result, error) {
	return engine.Result{}, errors.New("runtime missing")
}

// TestSyncRefusesWebhook: a webhook is for async executions only.
func TestSyncRefusesWebhook(t *testing.T) {
	s := newAsyncService(t, nil, nil)
	req := request("print(1)")
	u := "https://example.com/hook"
	req.Input.WebhookURL = &u
	_, err := s.Run(context.Background(), caller("acme", 4), req)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindInvalidRequest || !strings.Contains(e.Msg, "async") {
		t.Errorf("err %v", err)
	}
}

// TestDeliverWebhook: the final execution is POSTed signed to a receiver
// on loopback (allowed for the test); a 500 is retried, the state
// recorded at each attempt, and a receiver still failing after RetryFor
// leaves the delivery failed.
func TestDeliverWebhook(t *testing.T) {
	var mu sync.Mutex
	answers := []int{500, 200}
	var bodies []string
	var sigs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(b))
		sigs = append(sigs, r.Header.Get(webhook.HeaderSignature))
		code := 500
		if len(answers) > 0 {
			code, answers = answers[0], answers[1:]
		}
		w.WriteHeader(code)
	}))
	defer srv.Close()
	guard := webhook.NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	hooks := &Webhooks{Guard: guard, Client: webhook.NewClient(webhook.Options{Guard: guard}), RetryFor: time.Hour}
	s := newAsyncService(t, nil, hooks)
	ctx := context.Background()
	c := caller("acme", 4)
	req := request("print(1)")
	u := srv.URL + "/hook"
	req.Input.WebhookURL = &u
	out, err := s.Submit(ctx, c, req)
	if err != nil {
		t.Fatal(err)
	}
	id := out.Execution.ID
	if err := s.RunQueued(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	if len(s.queue.deliveries) != 1 {
		t.Fatalf("deliveries queued %v; want one", s.queue.deliveries)
	}
	if err := s.DeliverWebhook(ctx, "acme", id, 1, day0); err == nil {
		t.Errorf("a 500 answer was not an error to retry")
	}
	if w := s.get(t, "acme", id).Webhook; w.State != store.WebhookPending || w.Attempts != 1 || w.LastStatus != 500 || w.LastError == "" {
		t.Errorf("after the 500: %+v", w)
	}
	if err := s.DeliverWebhook(ctx, "acme", id, 2, day0); err != nil {
		t.Errorf("second attempt: %v", err)
	}
	if w := s.get(t, "acme", id).Webhook; w.State != store.WebhookDelivered || w.Attempts != 2 || w.LastStatus != 200 {
		t.Errorf("after the 200: %+v", w)
	}
	secret, _, err := s.WebhookSecret(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(bodies) != 2 || !strings.Contains(bodies[1], id) || webhook.Verify(secret, sigs[1], []byte(bodies[1]), time.Hour, time.Now()) != nil {
		t.Errorf("bodies %q signatures %q", bodies, sigs)
	}
	mu.Unlock()

	// A receiver that stays down: failed once RetryFor has passed.
	out2, err := s.Submit(ctx, c, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RunQueued(ctx, "acme", out2.Execution.ID); err != nil {
		t.Fatal(err)
	}
	*s.now = day0.Add(2 * time.Hour)
	err = s.DeliverWebhook(ctx, "acme", out2.Execution.ID, 7, day0)
	if w := s.get(t, "acme", out2.Execution.ID).Webhook; err == nil || w.State != store.WebhookFailed || w.Attempts != 7 {
		t.Errorf("after RetryFor: %v %+v", err, w)
	}
}

// TestSubmitRefusesPrivateWebhook: without an allowed range, loopback is
// refused at submit, with the field named.
func TestSubmitRefusesPrivateWebhook(t *testing.T) {
	guard := webhook.NewGuard(nil, nil)
	s := newAsyncService(t, nil, &Webhooks{Guard: guard, Client: webhook.NewClient(webhook.Options{Guard: guard})})
	for _, u := range []string{"https://127.0.0.1/x", "https://[::1]/x", "https://127.1.2.3/x", "https://localhost/x", "http://example.com/x"} {
		req := request("print(1)")
		req.Input.WebhookURL = &u
		_, err := s.Submit(context.Background(), caller("acme", 4), req)
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindInvalidRequest || !strings.HasPrefix(e.Msg, "webhook_url: ") {
			t.Errorf("%s: %v", u, err)
		}
	}
	if s.store.Executions() != 0 || s.usage(t, "acme") != 0 {
		t.Errorf("a refused webhook left something behind")
	}
}
