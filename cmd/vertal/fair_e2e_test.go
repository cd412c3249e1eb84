package main

// End-to-end tests of fairness between tenants on the smallest documented
// host: a real `vertal serve` with 2 sandbox slots, one tenant saturating
// a queue, another asking for a little.

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// twoTenants starts a 2-slot server with args and makes a pro key for
// tenants "heavy" and "light"; it returns the API's base URL and the keys.
func twoTenants(t *testing.T, args ...string) (base, heavy, light string) {
	t.Helper()
	p := startServer(t, t.TempDir(), nil, append([]string{"--max-concurrent", "2"}, args...)...)
	return p.url + "/api", tenantKey(t, p, "heavy", "pro"), tenantKey(t, p, "light", "pro")
}

// tenantKey makes a key for tenant on plan with the operator command.
func tenantKey(t *testing.T, p *serverProc, tenant, plan string) string {
	t.Helper()
	out, _, err := p.vertal(t, nil, "create-key", tenant, "--plan", plan)
	key := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(key, "kubo_sk_") {
		t.Fatalf("create-key %s: %v %q", tenant, err, out)
	}
	return key
}

// waitFor polls cond until it holds, for at most a minute.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	e2etest.WaitFor(t, time.Minute, 20*time.Millisecond, cond)
}

// post sends one JSON request for a load-generating goroutine, which must
// not call t.Fatal: a transport error is status 0.
func post(u, key string, body any) (int, map[string]any) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest("POST", u, bytes.NewReader(b))
	if err != nil {
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m
}

// TestFairSyncSlotsE2E: on a node with 2 slots and 8 queue places, a pro
// tenant (its plan's share: 4 slots, 16 queue places) with 10 busy
// clients must not starve a second tenant: its print(1) requests are
// served at least 90% of the time.
func TestFairSyncSlotsE2E(t *testing.T) {
	needE2E(t)
	base, heavy, light := twoTenants(t, "--max-queue", "8")

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var heavyServed, heavyRefused atomic.Int64
	for range 10 {
		wg.Go(func() {
			for ctx.Err() == nil {
				status, body := post(base+"/v1/executions", heavy, map[string]any{"language": "python", "code": "import time\ntime.sleep(2)"})
				switch status {
				case 200:
					heavyServed.Add(1)
				case 503, 429:
					heavyRefused.Add(1)
					time.Sleep(100 * time.Millisecond) // a busy client, not a tight loop
				default:
					t.Errorf("heavy: %d %v", status, body)
					return
				}
			}
		})
	}
	// The heavy tenant holds both slots and the whole queue first.
	waitFor(t, func() bool { return heavyServed.Load() >= 2 })

	const n = 40
	served := 0
	codes := map[int]int{}
	for range n {
		r := call(t, "POST", base+"/v1/executions", light, map[string]any{"language": "python", "code": "print(1)"}, nil)
		codes[r.status]++
		if r.status == 200 && r.body["status"] == "succeeded" && r.body["stdout"] == "1\n" {
			served++
		}
	}
	stop()
	wg.Wait()
	t.Logf("light tenant served %d of %d (statuses %v); heavy served %d, refused %d meanwhile", served, n, codes, heavyServed.Load(), heavyRefused.Load())
	if served*10 < n*9 {
		t.Errorf("light tenant served %d of %d, want at least 90%%", served, n)
	}
	if heavyServed.Load() == 0 {
		t.Errorf("the heavy tenant was never served")
	}
}

// TestFairAsyncE2E: with one async worker, a batch of 20 `sleep 3` from
// one tenant must not hold another tenant's single job until the batch is
// done: it starts as soon as the worker is free (within 2 s of the end of
// the job it waited for, by the stored timestamps), with most of the
// batch still queued. A tenant's backlog is capped.
func TestFairAsyncE2E(t *testing.T) {
	needE2E(t)
	base, heavy, light := twoTenants(t, "--async-workers", "1")

	var items []any
	for range 20 {
		items = append(items, map[string]any{"language": "bash", "code": "sleep 3"})
	}
	r := call(t, "POST", base+"/v1/executions/batch", heavy, map[string]any{"executions": items}, nil)
	if r.status != 202 {
		t.Fatalf("batch of 20: %d %s", r.status, r.raw)
	}
	var batch []string
	for _, e := range r.body["executions"].([]any) {
		batch = append(batch, e.(map[string]any)["id"].(string))
	}
	// The worker is busy with the batch before the other tenant asks.
	waitFor(t, func() bool {
		return call(t, "GET", base+"/v1/executions/"+batch[0], heavy, nil, nil).body["status"] == "running"
	})
	id := submit(t, base, light, map[string]any{"language": "bash", "code": "echo b"})
	b := waitFinal(t, base, light, []string{id}, false, 2*time.Minute)[id]
	if b["status"] != "succeeded" || b["stdout"] != "b\n" {
		t.Fatalf("light tenant's job: %v", b)
	}
	started := stamp(t, b["started_at"])

	// The worker became free when the last batch job before it ended
	// (the stamps are whole seconds, so "before" is "not after").
	var free time.Time
	after := 0
	for _, hid := range batch {
		e := call(t, "GET", base+"/v1/executions/"+hid, heavy, nil, nil).body
		switch s, f := e["started_at"], e["finished_at"]; {
		case s == nil || stamp(t, s).After(started):
			after++
		case f != nil && stamp(t, f).After(free) && !stamp(t, f).After(started):
			free = stamp(t, f)
		}
	}
	t.Logf("light tenant's job started %v after the worker was free, with %d of the batch of 20 not yet started", started.Sub(free), after)
	if free.IsZero() || started.Sub(free) > 2*time.Second {
		t.Errorf("light tenant's job started at %v, the worker was free at %v", started, free)
	}
	if after < 15 {
		t.Errorf("only %d of the batch started after the light tenant's job, want most of it", after)
	}

	// The heavy tenant's backlog is capped: the queue refuses more.
	refused := false
	for range 5 {
		r := call(t, "POST", base+"/v1/executions/batch", heavy, map[string]any{"executions": items}, nil)
		if r.status == 429 && r.code() == "rate_limited" && strings.Contains(r.raw, "waiting to run") {
			refused = true
			break
		}
		if r.status != 202 {
			t.Fatalf("batch: %d %s", r.status, r.raw)
		}
	}
	if !refused {
		t.Errorf("120 queued executions of one tenant were all accepted")
	}
}

// stamp reads a Unix-seconds timestamp from a response.
func stamp(t *testing.T, v any) time.Time {
	t.Helper()
	sec, ok := v.(float64)
	if !ok {
		t.Fatalf("timestamp %v is not a number", v)
	}
	return time.Unix(int64(sec), 0)
}

// TestFairWebhooksE2E: one tenant's 20 webhooks to a receiver that hangs
// must not hold another tenant's delivery: it arrives within 5 s of its
// execution's end.
func TestFairWebhooksE2E(t *testing.T) {
	needE2E(t)
	base, heavy, light := twoTenants(t, "--webhook-allow-cidr", "127.0.0.0/8")

	var hanging atomic.Int64
	hang := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hanging.Add(1)
		<-r.Context().Done()
	})}
	hangLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hang.Serve(hangLn)
	defer hang.Close()
	rcv := newReceiver(t, "127.0.0.1:0")

	var items []any
	for range 20 {
		items = append(items, map[string]any{"language": "bash", "code": "echo a"})
	}
	r := call(t, "POST", base+"/v1/executions/batch", heavy, map[string]any{"executions": items, "webhook_url": "http://" + hangLn.Addr().String() + "/hook"}, nil)
	if r.status != 202 {
		t.Fatalf("batch of 20: %d %s", r.status, r.raw)
	}
	var batch []string
	for _, e := range r.body["executions"].([]any) {
		batch = append(batch, e.(map[string]any)["id"].(string))
	}
	// All 20 of the heavy tenant's deliveries are queued or hanging
	// before the other tenant asks.
	waitFinal(t, base, heavy, batch, false, time.Minute)
	waitFor(t, func() bool { return hanging.Load() >= 2 })
	id := submit(t, base, light, map[string]any{"language": "bash", "code": "echo b", "webhook_url": rcv.url + "/ok"})
	var got time.Time
	waitFor(t, func() bool {
		if len(rcv.deliveries(id)) > 0 {
			got = time.Now()
			return true
		}
		return false
	})
	b := waitFinal(t, base, light, []string{id}, true, time.Minute)[id]
	finished := stamp(t, b["finished_at"])
	t.Logf("light tenant's webhook arrived %v after its execution finished; the hanging receiver had %d requests", got.Sub(finished).Round(100*time.Millisecond), hanging.Load())
	if w := b["webhook"].(map[string]any); w["state"] != "delivered" || got.Sub(finished) > 5*time.Second {
		t.Errorf("light tenant's webhook %v arrived at %v, its execution finished at %v", w, got, finished)
	}
}
