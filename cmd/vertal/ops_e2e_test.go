package main

// End-to-end tests of the operator commands against a running `vertal
// serve` (the real binary, oci driver, SQLite): status, key and an online
// backup taken while the server keeps running executions.

import (
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

func TestOperatorCommandsE2E(t *testing.T) {
	needE2E(t)
	const edge = "ops-e2e-edge-secret-0123456789"
	metricsAddr := e2etest.FreeAddr(t)
	p := startServer(t, t.TempDir(), []string{"VERTAL_EDGE_SECRET=" + edge}, "--metrics-addr", metricsAddr, "--pool-min", "1", "--pool-max", "2")
	relay := map[string]string{"X-Vertal-Edge-Secret": edge}
	run := func(t *testing.T, key, code string) string {
		t.Helper()
		r := call(t, "POST", p.url+"/api/v1/executions", key, map[string]any{"language": "bash", "code": code}, relay)
		if r.status != 200 || r.body["status"] != "succeeded" {
			t.Fatalf("execution: %d %s", r.status, r.raw)
		}
		return r.body["id"].(string)
	}

	// vertal key NAME PLAN: the key alone on stdout, and it works at once.
	out, errOut, err := p.vertal(t, nil, "key", "acme", "pro")
	if err != nil || !keyLine.MatchString(out) || !strings.Contains(errOut, "(plan pro)") {
		t.Fatalf("vertal key acme pro: %v %q %q", err, out, errOut)
	}
	key := strings.TrimSpace(out)
	if r := call(t, "GET", p.url+"/api/v1/usage", key, nil, relay); r.status != 200 || r.body["plan"] != "pro" {
		t.Fatalf("usage with the new key: %d %s", r.status, r.raw)
	}
	first := run(t, key, "echo before")

	t.Run("Status", func(t *testing.T) {
		// The operator's shell has the metrics address but not the edge
		// secret: status must still find the secret enforced.
		out, errOut, err := p.vertal(t, []string{"VERTAL_METRICS_ADDR=" + metricsAddr, "VERTAL_POOL_MAX=2"}, "status", "--url", p.url, "--json")
		if err != nil {
			t.Fatalf("vertal status: %v %s %s", err, out, errOut)
		}
		var rep statusReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if rep.Settings.From != "server" {
			t.Errorf("settings: %+v, want the server's", rep.Settings)
		}
		if !rep.Server.Healthy || rep.Server.Version != version || rep.Sandboxes.Driver != "oci" {
			t.Errorf("server/sandboxes: %+v %+v", rep.Server, rep.Sandboxes)
		}
		if rep.EdgeSecret.Configured || rep.EdgeSecret.Enforced == nil || !*rep.EdgeSecret.Enforced {
			t.Errorf("edge secret: %+v", rep.EdgeSecret)
		}
		if rep.Today.Executions < 1 || rep.Today.SandboxSeconds < 0 || rep.Today.Tenants != 1 {
			t.Errorf("today: %+v", rep.Today)
		}
		if rep.Store.Kind != "sqlite" || rep.Store.Path != filepath.Join(p.dataDir, "vertal.db") || rep.Store.Error != "" {
			t.Errorf("store: %+v", rep.Store)
		}
		if rep.Metrics.Error != "" || rep.Pool.Live == nil || rep.Sandboxes.InUse == nil {
			t.Errorf("live numbers from /metrics: %+v %+v %+v", rep.Metrics, rep.Pool, rep.Sandboxes)
		}
		if rep.Async == nil || rep.Async.Queued != 0 {
			t.Errorf("async: %+v", rep.Async)
		}
		text, _, err := p.vertal(t, nil, "status", "--url", p.url)
		if err != nil || !strings.Contains(text, "edge secret  on") || !strings.Contains(text, "ok, version "+version) {
			t.Errorf("status text: %v\n%s", err, text)
		}
		for _, s := range []string{out, text} {
			if strings.Contains(s, edge) || strings.Contains(s, key) {
				t.Errorf("status printed a secret:\n%s", s)
			}
		}
	})

	t.Run("BackupWhileServing", func(t *testing.T) {
		// Executions keep running on the server while the backup is taken;
		// none of them may fail. They are paced to stay inside the key's
		// per-minute rate (a fast runtime would otherwise reach it).
		const most = 60
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failures []string
		ran := 0
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					case <-time.After(15 * time.Millisecond):
					}
					mu.Lock()
					if ran >= most {
						mu.Unlock()
						return
					}
					ran++
					mu.Unlock()
					r := call(t, "POST", p.url+"/api/v1/executions", key, map[string]any{"language": "bash", "code": "echo during"}, relay)
					mu.Lock()
					if r.status != 200 || r.body["status"] != "succeeded" {
						failures = append(failures, r.raw)
					}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(500 * time.Millisecond)
		dest := filepath.Join(t.TempDir(), "vertal-backup.db")
		out, errOut, err := p.vertal(t, nil, "backup", dest)
		time.Sleep(500 * time.Millisecond)
		close(stop)
		wg.Wait()
		if err != nil || !strings.Contains(out, "integrity ok") {
			t.Fatalf("vertal backup: %v %q %q", err, out, errOut)
		}
		t.Logf("%d executions ran around and during the backup", ran)
		if len(failures) > 0 || ran == 0 {
			t.Errorf("%d of %d executions during the backup failed: %v", len(failures), ran, failures)
		}
		if r := call(t, "GET", p.url+"/health", "", nil, nil); r.status != 200 {
			t.Errorf("health after the backup: %d", r.status)
		}
		run(t, key, "echo after")

		if fi, err := os.Stat(dest); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("backup file: %v %v", fi, err)
		}
		db, err := sql.Open("sqlite", "file:"+dest+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var integrity, tenant, stdout string
		if err := db.QueryRow("PRAGMA integrity_check").Scan(&integrity); err != nil || integrity != "ok" {
			t.Errorf("integrity_check: %q %v", integrity, err)
		}
		if err := db.QueryRow("SELECT tenant FROM api_keys WHERE tenant = 'acme'").Scan(&tenant); err != nil {
			t.Errorf("the tenant's key in the backup: %v", err)
		}
		if err := db.QueryRow("SELECT stdout FROM executions WHERE id = ?", first).Scan(&stdout); err != nil || stdout != "before\n" {
			t.Errorf("execution %s in the backup: %q %v", first, stdout, err)
		}

		// Never overwritten.
		_, errOut, err = p.vertal(t, nil, "backup", dest)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !strings.Contains(errOut, "not overwriting") {
			t.Errorf("second backup to the same file: %v %q", err, errOut)
		}
	})
}

// TestServerSettingsInStatusE2E: status, run with none of the server's
// flags, prints the settings the server runs with, not its own defaults.
func TestServerSettingsInStatusE2E(t *testing.T) {
	needE2E(t)
	metricsAddr := e2etest.FreeAddr(t)
	p := startServer(t, t.TempDir(), nil, "--max-concurrent", "3", "--pool-min", "1", "--pool-max", "3", "--pool-memory-mb", "300", "--metrics-addr", metricsAddr)
	out, errOut, err := p.vertal(t, nil, "status", "--url", p.url, "--json")
	if err != nil {
		t.Fatalf("vertal status: %v %s %s", err, out, errOut)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.Settings.From != "server" || rep.Settings.Socket != filepath.Join(p.dataDir, "vertal.sock") {
		t.Errorf("settings: %+v, want the server's socket", rep.Settings)
	}
	if s := rep.Sandboxes; s.Driver != "oci" || s.Runtime == "auto" || s.MaxConcurrent != 3 {
		t.Errorf("sandboxes: %+v, want oci with the runtime it picked and 3 at once", s)
	}
	if pl := rep.Pool; !pl.Enabled || pl.Min != 1 || pl.Max != 3 || pl.MemoryMB != 300 {
		t.Errorf("pool: %+v, want 1..3 and 300 MiB", pl)
	}
	if rep.Metrics.Addr != metricsAddr || rep.Metrics.Error != "" || rep.Pool.Live == nil {
		t.Errorf("metrics: %+v %+v, want the live numbers at the server's %s", rep.Metrics, rep.Pool.Live, metricsAddr)
	}
	text, _, err := p.vertal(t, nil, "status", "--url", p.url)
	if err != nil || !strings.Contains(text, "3 at once") || !strings.Contains(text, "1..3 per language, up to 300 MiB") {
		t.Errorf("status text: %v\n%s", err, text)
	}
}
