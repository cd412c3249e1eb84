package main

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestSandboxFairnessE2E: a free tenant flooding its sandbox with slow
// commands gets its plan's share (one running, a short queue, the rest a
// fast 503 overloaded with Retry-After), and a pro tenant's command in
// its own sandbox is served while the flood still runs.
func TestSandboxFairnessE2E(t *testing.T) {
	needE2E(t)
	p, heavy, light, hid, lid := twoSandboxes(t, "flooder", "free", "neighbour", "pro")

	const flood = 8
	type answer struct {
		status int
		retry  string
		raw    string
	}
	answers := make(chan answer, flood)
	var served atomic.Int32
	for range flood {
		go func() {
			r := sbxCall(t, p, heavy, "POST", hid, "/commands", map[string]any{"cmd": "sleep 2", "timeout_s": 10})
			if r.status == 200 {
				served.Add(1)
			}
			answers <- answer{r.status, r.header.Get("Retry-After"), r.raw}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the flood holds its slot and queue
	out := sbxRun(t, p, light, lid, "echo served")
	if out["stdout"] != "served\n" {
		t.Fatalf("light tenant: %v", out)
	}
	// The flood's admitted commands run one after another, 2 s each: the
	// light tenant must have been answered before they are all done.
	done, refused := int(served.Load()), 0
	statuses := map[int]int{}
	for range flood {
		a := <-answers
		statuses[a.status]++
		switch a.status {
		case 200:
		case 503:
			refused++
			if a.retry == "" || !strings.Contains(a.raw, `"overloaded"`) {
				t.Errorf("refusal without Retry-After or code overloaded: %q %s", a.retry, a.raw)
			}
		default:
			t.Errorf("flood answer %d %s", a.status, a.raw)
		}
	}
	t.Logf("flood: %v; %d of its commands had ended when the light tenant's was served", statuses, done)
	if done >= statuses[200] {
		t.Errorf("the light tenant was served only after the flood's %d admitted commands ended", statuses[200])
	}
	if refused == 0 || statuses[200] == 0 {
		t.Errorf("flood statuses %v: want some served and some refused with 503 (one running and a queue of four on the free plan)", statuses)
	}
}

// twoSandboxes starts a server with tenants a and b on their plans, each
// with a sandbox: their keys and sandbox ids.
func twoSandboxes(t *testing.T, a, aPlan, b, bPlan string) (p *serverProc, aKey, bKey, aID, bID string) {
	t.Helper()
	p = startServer(t, t.TempDir(), nil)
	aKey, bKey = tenantKey(t, p, a, aPlan), tenantKey(t, p, b, bPlan)
	return p, aKey, bKey, createSandbox(t, p, aKey, map[string]any{"timeout_s": 300}), createSandbox(t, p, bKey, map[string]any{"timeout_s": 300})
}

// TestSandboxSlotHeldWithinPlanE2E runs the attack on a 2-slot node: two
// free tenants each ask a foreground command (and a cell) to hold a slot
// for an hour, which would leave everyone else a 503 for that hour. The
// plan's max_timeout_s (10 s) bounds them as it bounds an execution: the
// hour is refused before anything runs, and a command that names no
// timeout is stopped at the plan's 10 s, not at 60.
func TestSandboxSlotHeldWithinPlanE2E(t *testing.T) {
	needE2E(t)
	p, a, b, aid, bid := twoSandboxes(t, "holder-a", "free", "holder-b", "free")
	for _, tc := range []struct{ key, id string }{{a, aid}, {b, bid}} {
		r := sbxCall(t, p, tc.key, "POST", tc.id, "/commands", map[string]any{"cmd": "sleep 3600", "timeout_s": 3600})
		if r.status != 400 || r.body["error"].(map[string]any)["code"] != "invalid_timeout" || !strings.Contains(r.raw, "between 1 and 10 seconds on plan free") {
			t.Errorf("a command asking an hour on the free plan: %d %s", r.status, r.raw)
		}
		r = sbxCall(t, p, tc.key, "POST", tc.id, "/run", map[string]any{"code": "import time; time.sleep(3600)", "timeout_s": 3600})
		if r.status != 400 || !strings.Contains(r.raw, `"invalid_timeout"`) {
			t.Errorf("a cell asking an hour on the free plan: %d %s", r.status, r.raw)
		}
	}
	start := time.Now()
	r := sbxCall(t, p, a, "POST", aid, "/commands", map[string]any{"cmd": "sleep 3600"})
	if r.status != 200 || r.body["status"] != "timed_out" {
		t.Errorf("a command with no timeout_s on the free plan: %d %s", r.status, r.raw)
	}
	// Behaviour, not speed: 10 s is the plan's bound, 60 s the old default.
	if d := time.Since(start); d > 40*time.Second {
		t.Errorf("the command held its slot for %s: the free plan's bound is 10 s", d)
	}
	// The refused ones were not counted: the two creates and the one run.
	if u := todayExecutions(t, p.url, a); u != 2 {
		t.Errorf("tenant a shows %v executions, want 2 (its create and its one command)", u)
	}
}
