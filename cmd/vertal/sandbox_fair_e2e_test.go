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
