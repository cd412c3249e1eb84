package api

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

func TestIdempotentReplay(t *testing.T) {
	env := newEnv(t)
	other, _ := env.newKey("globex", "pro")
	hdr := map[string]string{"Idempotency-Key": "order-1234"}
	first := env.run("python", "print(6 * 7)", hdr)
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	a := decode(t, first)
	if _, ok := a["idempotent_replay"]; ok {
		t.Errorf("first answer is marked as a replay")
	}

	// Same key, same request (an alias and the explicit default timeout
	// make no difference): the first result, marked, no new run, no quota.
	second := env.do(request{method: "POST", path: "/api/v1/executions", header: hdr,
		body: `{"language":"py","code":"print(6 * 7)","timeout_s":10}`})
	b := decode(t, second)
	if second.status != 200 || b["idempotent_replay"] != true {
		t.Fatalf("replay: %d %s", second.status, second.body)
	}
	if b["request_id"] != second.header.Get("X-Request-ID") {
		t.Errorf("replay request_id %v is not this request's", b["request_id"])
	}
	delete(a, "request_id")
	delete(b, "request_id")
	delete(b, "idempotent_replay")
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("replay differs (-first +replay):\n%s", diff)
	}
	if n := env.driver.runs.Load(); n != 1 {
		t.Errorf("ran %d times", n)
	}
	if u := decode(t, env.do(request{path: "/v1/usage"})); u["today"].(map[string]any)["executions"] != 1.0 {
		t.Errorf("replay used quota: %v", u["today"])
	}

	// Same key, different body.
	for _, body := range []string{
		`{"language":"python","code":"print(6 * 8)"}`,
		`{"language":"python","code":"print(6 * 7)","timeout_s":11}`,
		`{"language":"python","code":"print(6 * 7)","stdin":"x"}`,
		`{"language":"bash","code":"print(6 * 7)"}`,
	} {
		r := env.do(request{method: "POST", path: "/v1/executions", header: hdr, body: body})
		if r.status != 409 || errCode(t, r) != "idempotency_conflict" {
			t.Errorf("%s: %d %s", body, r.status, r.body)
		}
	}
	// Keys are scoped to the tenant.
	r := env.do(request{method: "POST", path: "/v1/executions", key: other, header: hdr, body: `{"language":"python","code":"print(6 * 8)"}`})
	if r.status != 200 || decode(t, r)["idempotent_replay"] != nil {
		t.Errorf("other tenant: %d %s", r.status, r.body)
	}
	if n := env.driver.runs.Load(); n != 2 {
		t.Errorf("ran %d times, want 2", n)
	}
}

// TestIdempotentParallel: many requests with one key arrive while the first
// is still running; the code runs once and every request gets its result.
func TestIdempotentParallel(t *testing.T) {
	env := newEnv(t)
	env.driver.started = make(chan string, 100)
	hdr := map[string]string{"Idempotency-Key": "job-42"}
	const n = 20
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = env.run("python", "block", hdr)
		}()
	}
	<-env.driver.started
	// Every other request has looked at the store and is waiting.
	waitFor(t, func() bool { return env.store.claims.Load() >= n })
	env.driver.release()
	wg.Wait()
	replays, ids := 0, map[any]bool{}
	for _, r := range results {
		if r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		m := decode(t, r)
		ids[m["id"]] = true
		if m["idempotent_replay"] == true {
			replays++
		}
	}
	if len(ids) != 1 || replays != n-1 || env.driver.runs.Load() != 1 {
		t.Errorf("ids %v, replays %d, runs %d", ids, replays, env.driver.runs.Load())
	}
}

// TestIdempotentInProgress: when the first request runs longer than the
// bounded wait, the second gets 409 idempotency_in_progress, and the code
// still ran only once.
func TestIdempotentInProgress(t *testing.T) {
	env := newEnv(t, withService(func(o *execution.Options) { o.IdempotencyWait = 30 * time.Millisecond }))
	env.driver.started = make(chan string, 10)
	hdr := map[string]string{"Idempotency-Key": "slow-1"}
	first := env.goRun("python", "block", hdr)
	<-env.driver.started
	r := env.run("python", "block", hdr)
	if r.status != 409 || errCode(t, r) != "idempotency_in_progress" || r.header.Get("Retry-After") == "" {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	env.driver.release()
	if f := <-first; f.status != 200 {
		t.Fatalf("first: %d", f.status)
	}
	r = env.run("python", "block", hdr)
	if r.status != 200 || decode(t, r)["idempotent_replay"] != true {
		t.Errorf("after: %d %s", r.status, r.body)
	}
	if env.driver.runs.Load() != 1 {
		t.Errorf("runs %d", env.driver.runs.Load())
	}
}

// TestIdempotencyReleasedWhenNothingRan: a request refused after its claim
// (platform error, quota, overload) gives the key back, so a retry runs.
func TestIdempotencyReleasedWhenNothingRan(t *testing.T) {
	env := newEnv(t)
	hdr := map[string]string{"Idempotency-Key": "retry-me"}
	if r := env.run("python", "crash", hdr); r.status != 500 {
		t.Fatalf("crash: %d", r.status)
	}
	// Same body after the platform failed: runs again (the fake crashes
	// again, proving it ran) rather than replaying or waiting.
	if r := env.run("python", "crash", hdr); r.status != 500 || errCode(t, r) != "sandbox_error" {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	if env.driver.runs.Load() != 2 {
		t.Errorf("runs %d", env.driver.runs.Load())
	}
	// And a different body may now use the key.
	if r := env.run("python", "print(6 * 7)", hdr); r.status != 200 {
		t.Errorf("new body: %d %s", r.status, r.body)
	}
}

// TestIdempotencyWaiterTakesOverReleasedClaim: the waiter runs the code
// itself when the first request gives its claim up.
func TestIdempotencyWaiterTakesOverReleasedClaim(t *testing.T) {
	env := newEnv(t)
	ctx := context.Background()
	body := `{"language":"python","code":"print(6 * 7)"}`
	// An earlier request with this body holds the key.
	env.holdKey(t, "k1", body)
	done := make(chan response, 1)
	go func() {
		done <- env.do(request{method: "POST", path: "/v1/executions", body: body, header: map[string]string{"Idempotency-Key": "k1"}})
	}()
	waitFor(t, func() bool { return env.store.claims.Load() >= 3 }) // ours, and the waiter's second look
	if n := env.driver.runs.Load(); n != 0 {
		t.Fatalf("the waiter ran while the key was held")
	}
	// The earlier request ran nothing and gives the key up.
	if err := env.store.ReleaseIdempotency(ctx, "acme", "k1"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.status != 200 || decode(t, r)["idempotent_replay"] != nil || env.driver.runs.Load() != 1 {
		t.Errorf("got %d %s, runs %d", r.status, r.body, env.driver.runs.Load())
	}
}

// holdKey claims key for body in tenant acme's name, as a request with
// that body does while it runs (or forever, if its process died).
func (e *testEnv) holdKey(t *testing.T, key, body string) {
	t.Helper()
	req, err := e.srv.decodeForTest(body)
	if err != nil {
		t.Fatal(err)
	}
	if _, claimed, err := e.store.ClaimIdempotency(context.Background(), "acme", key, req.hash, e.clock.Now(), time.Time{}, time.Time{}); err != nil || !claimed {
		t.Fatal(claimed, err)
	}
}

// decodeForTest validates a body as a pro caller would send it.
func (s *Server) decodeForTest(body string) (struct{ hash string }, error) {
	r, _ := http.NewRequest("POST", "/v1/executions", stringsReader(body))
	r.Header.Set("Content-Type", "application/json")
	c := &Caller{Plan: planPro()}
	in, _, err := s.decodeExecution(nil, r, c)
	if err != nil {
		return struct{ hash string }{}, err
	}
	h, err := s.exec.RequestHash(*c, in)
	return struct{ hash string }{h}, err
}

// TestIdempotencyReleasedOnQuotaAndOverload: refusals after the claim give
// the key back too.
func TestIdempotencyReleasedOnQuotaAndOverload(t *testing.T) {
	plans := config.DefaultPlans()
	plans["one"] = config.Plan{ExecutionsPerDay: 1, RequestsPerMinute: 100, MaxTimeoutS: 10, MemoryMB: 64}
	env := newEnv(t, withPlans(plans), withEngine(engine.Options{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Millisecond}))
	key, _ := env.newKey("one", "one")
	body := `{"language":"python","code":"print(6 * 7)"}`
	env.do(request{method: "POST", path: "/v1/executions", key: key, body: body})
	r := env.do(request{method: "POST", path: "/v1/executions", key: key, body: body, header: map[string]string{"Idempotency-Key": "q"}})
	if r.status != 429 {
		t.Fatalf("quota: %d %s", r.status, r.body)
	}
	if _, claimed, _ := env.store.ClaimIdempotency(context.Background(), "one", "q", "other", time.Now(), time.Now().Add(-time.Hour), time.Time{}); !claimed {
		t.Errorf("quota refusal kept the key claimed")
	}

	env.driver.started = make(chan string, 1)
	done := env.goRun("python", "block", nil)
	<-env.driver.started
	r = env.run("python", "print(6 * 7)", map[string]string{"Idempotency-Key": "o"})
	env.driver.release()
	<-done
	if r.status != 503 {
		t.Fatalf("overload: %d %s", r.status, r.body)
	}
	if _, claimed, _ := env.store.ClaimIdempotency(context.Background(), "acme", "o", "other", time.Now(), time.Now().Add(-time.Hour), time.Time{}); !claimed {
		t.Errorf("overload refusal kept the key claimed")
	}
}

// TestIdempotencyAbandonedClaim: a claim left running by a server process
// that was killed blocks its key only until no request could still hold
// it (queue wait + longest plan timeout + margins), not for the 24 h a
// completed key is kept; a completed key keeps replaying for those 24 h.
func TestIdempotencyAbandonedClaim(t *testing.T) {
	env := newEnv(t, withService(func(o *execution.Options) { o.IdempotencyWait = 20 * time.Millisecond }))
	body := `{"language":"python","code":"print(6 * 7)"}`
	// The dead process's claim: never completed, never released.
	env.holdKey(t, "orphan", body)
	hdr := map[string]string{"Idempotency-Key": "orphan"}
	post := func() response {
		return env.do(request{method: "POST", path: "/v1/executions", body: body, header: hdr})
	}
	abandon := env.srv.exec.ClaimAbandonAfter()
	// enterprise allows 300 s; the server was given a 1 s queue timeout;
	// then a minute's run margin and a minute's slack.
	if want := time.Second + 300*time.Second + 2*time.Minute; abandon != want {
		t.Errorf("claimAbandonAfter = %v, want %v", abandon, want)
	}

	steps := []struct {
		name       string
		advance    time.Duration // clock jump before the request
		wantStatus int
		wantCode   string
		wantReplay bool
		wantRuns   int64
	}{
		{name: "young claim", advance: abandon - 5*time.Second, wantStatus: 409, wantCode: "idempotency_in_progress"},
		{name: "abandoned claim", advance: 10 * time.Second, wantStatus: 200, wantRuns: 1},
		{name: "replay", advance: time.Second, wantStatus: 200, wantReplay: true, wantRuns: 1},
		{name: "completed key, 23 h on", advance: 23 * time.Hour, wantStatus: 200, wantReplay: true, wantRuns: 1},
		{name: "completed key, 24 h on", advance: time.Hour, wantStatus: 200, wantRuns: 2},
	}
	for _, st := range steps {
		env.clock.Advance(st.advance)
		r := post()
		if r.status != st.wantStatus {
			t.Fatalf("%s: status %d %s, want %d", st.name, r.status, r.body, st.wantStatus)
		}
		if st.wantCode != "" {
			if code := errCode(t, r); code != st.wantCode {
				t.Errorf("%s: code %s, want %s", st.name, code, st.wantCode)
			}
		} else if replay := decode(t, r)["idempotent_replay"] == true; replay != st.wantReplay {
			t.Errorf("%s: idempotent_replay %v, want %v", st.name, replay, st.wantReplay)
		}
		if n := env.driver.runs.Load(); n != st.wantRuns {
			t.Errorf("%s: %d runs, want %d", st.name, n, st.wantRuns)
		}
	}
}
