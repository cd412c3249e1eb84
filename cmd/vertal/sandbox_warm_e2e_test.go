package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var sandboxIDRe = regexp.MustCompile(`sbx_[0-9a-f]{32}`)

// sandboxesOnHost is the ids of the sandboxes that have a process on the
// host now, read from the processes' cgroups: every driver and runtime
// names a sandbox's cgroup (or its container's cgroup parent) after its
// id, gVisor's sandbox and gofer included.
func sandboxesOnHost() map[string]bool {
	ids := map[string]bool{}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		b, err := os.ReadFile("/proc/" + d.Name() + "/cgroup")
		if err != nil {
			continue
		}
		for _, id := range sandboxIDRe.FindAllString(string(b), -1) {
			ids[id] = true
		}
	}
	return ids
}

// serverSandboxes is the ids of the sandboxes an oci server with
// --state-dir state holds: their bundles, which running processes have.
func serverSandboxes(state string) map[string]bool {
	ids := map[string]bool{}
	host := sandboxesOnHost()
	for _, pat := range []string{"*/bundles/sbx_*", "*/*/bundles/sbx_*"} {
		m, _ := filepath.Glob(filepath.Join(state, pat))
		for _, b := range m {
			if id := filepath.Base(b); host[id] {
				ids[id] = true
			}
		}
	}
	return ids
}

// stateDir is a --state-dir for a server of this test: the sandbox's uid
// must reach it, so it and its parent are searchable.
func stateDir(t *testing.T) string {
	d := t.TempDir()
	for _, p := range []string{filepath.Dir(d), d} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// prestarted waits until the server whose /metrics metric reads has a
// pre-started sandbox waiting, and returns the sandboxes it holds then
// (with state "", every sandbox on the host: any driver).
func prestarted(t *testing.T, metric func(string) float64, state string) map[string]bool {
	t.Helper()
	waitFor(t, func() bool { return metric("vertal_sandbox_pool_ready") >= 1 })
	if state == "" {
		return sandboxesOnHost()
	}
	return serverSandboxes(state)
}

// TestSandboxWarmE2E: through a real server on the default driver, a
// create takes a sandbox that was already running before it arrived. It
// has the create's environment, files and expiry and nothing of anyone
// else's, and is never handed to a second create. What waits is gone
// after a SIGTERM and after a SIGKILL of its server.
func TestSandboxWarmE2E(t *testing.T) {
	needE2E(t)
	state := stateDir(t)
	p := startServer(t, t.TempDir(), nil, "--metrics-addr", "127.0.0.1:0", "--state-dir", state)
	metric := metricsOf(t, p)
	key, other := tenantKey(t, p, "warm-a", "pro"), tenantKey(t, p, "warm-b", "pro")

	before := prestarted(t, metric, state)
	r := sbxCall(t, p, key, "POST", "", "", map[string]any{"timeout_s": 120, "env": map[string]string{"WARM_CHECK": "mine", "HOME": "/elsewhere"},
		"files": []map[string]string{{"path": "in.txt", "content": "first tenant"}}})
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	id := r.body["id"].(string)
	if !before[id] {
		t.Fatalf("the create got %s, which was not running before it (running then: %v)", id, before)
	}
	created, _ := time.Parse(time.RFC3339Nano, r.body["created_at"].(string))
	expires, _ := time.Parse(time.RFC3339Nano, r.body["expires_at"].(string))
	if d := expires.Sub(created); d != 120*time.Second {
		t.Errorf("expires_at is %v after created_at; want 120 s", d)
	}
	out := sbxRun(t, p, key, id, `echo "$WARM_CHECK $HOME"; cat in.txt; echo; ls -A /home/user`)
	if got := out["stdout"]; got != "mine /home/user\nfirst tenant\nin.txt\n" {
		t.Errorf("in the handed-over sandbox: %q (stderr %q)", got, out["stderr"])
	}
	sbxRun(t, p, key, id, "echo private > secret.txt")

	// The one behind it is another sandbox, clean, for the next create.
	before = prestarted(t, metric, state)
	id2 := createSandbox(t, p, other, map[string]any{"timeout_s": 60})
	if id2 == id || !before[id2] {
		t.Fatalf("the second create got %s (first %s, running before: %v)", id2, id, before)
	}
	out = sbxRun(t, p, other, id2, `echo "[$WARM_CHECK]"; ls -A /home/user | wc -l; cat /home/user/secret.txt 2>&1 || true`)
	if got := out["stdout"].(string); !strings.HasPrefix(got, "[]\n0\n") || strings.Contains(got, "private") {
		t.Errorf("the second tenant's sandbox: %q", got)
	}
	if r := sbxCall(t, p, other, "GET", id, "", nil); r.status != 404 {
		t.Errorf("the second tenant reads the first's sandbox: %d", r.status)
	}

	// SIGTERM: the waiting sandbox goes with the server.
	waiting := prestarted(t, metric, state)
	delete(waiting, id)
	delete(waiting, id2)
	if len(waiting) != 1 {
		t.Errorf("the server holds %v besides the two sandboxes; want one waiting", waiting)
	}
	if hits, misses := metric("vertal_sandbox_pool_hits_total"), metric("vertal_sandbox_pool_misses_total"); hits != 2 || misses != 0 {
		t.Errorf("pool hits %v, misses %v; want 2 and 0", hits, misses)
	}
	p.stop()
	waitFor(t, func() bool { return !anyOnHost(waiting) && len(serverSandboxes(state)) == 0 })

	// SIGKILL: the waiting sandbox's agent sees its channel close.
	state = stateDir(t)
	q := startServer(t, t.TempDir(), nil, "--metrics-addr", "127.0.0.1:0", "--state-dir", state)
	waiting = prestarted(t, metricsOf(t, q), state)
	if len(waiting) != 1 {
		t.Errorf("a fresh server holds %v; want one sandbox waiting", waiting)
	}
	_ = q.cmd.Process.Signal(syscall.SIGKILL)
	<-q.exited
	q.exited <- nil
	waitFor(t, func() bool { return !anyOnHost(waiting) })
	// The next server on that state dir reaps what the killed one left
	// (mounts and bundles), and stops cleanly.
	startServer(t, t.TempDir(), nil, "--state-dir", state).stop()
}

// anyOnHost reports whether one of ids still has a process on the host.
func anyOnHost(ids map[string]bool) bool {
	for id := range sandboxesOnHost() {
		if ids[id] {
			return true
		}
	}
	return false
}

// metricsOf finds the metrics address p logged (it needs --metrics-addr)
// and returns a reader of one series' value from its /metrics (0 when
// absent). The address is logged before p says it listens, but its stderr
// is copied here on its own: wait for the line.
func metricsOf(t *testing.T, p *serverProc) func(series string) float64 {
	t.Helper()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, l := range strings.Split(p.stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "metrics listening" {
				addr, _ = m["addr"].(string)
			}
		}
	}
	if addr == "" {
		t.Fatal("the server never logged its metrics address")
	}
	return func(series string) float64 {
		t.Helper()
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, series+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return 0
	}
}
