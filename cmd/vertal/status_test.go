package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// fakeServer answers /health and /v1/languages as a server with or
// without the edge secret would.
func fakeServer(t *testing.T, edge bool) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"status":"ok","version":"9.9.9"}`))
	})
	mux.HandleFunc("GET /v1/languages", func(w http.ResponseWriter, _ *http.Request) {
		if edge {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func fakeMetrics(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE vertal_sandboxes_in_use gauge\nvertal_sandboxes_in_use 2\n" +
			"# TYPE vertal_queue_depth gauge\nvertal_queue_depth 1\n" +
			"# TYPE vertal_pool_ready gauge\nvertal_pool_ready{language=\"python\",plan=\"pro\"} 2\nvertal_pool_ready{language=\"bash\",plan=\"pro\"} 1\n" +
			"# TYPE vertal_pool_hits_total counter\nvertal_pool_hits_total{language=\"python\",plan=\"pro\"} 7\n"))
	}))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

func TestStatus(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	ctx := context.Background()
	now := time.Now().UTC()
	day := now.Format(time.DateOnly)
	for _, tenant := range []string{"acme", "globex", "idle"} {
		if r := runOperator(t, cmdKey, dir, tenant, "pro"); r.err != nil {
			t.Fatal(r.err)
		}
	}
	for i, tenant := range []string{"acme", "acme", "globex"} {
		if _, err := st.ReserveExecution(ctx, tenant, day, 100); err != nil {
			t.Fatal(err)
		}
		if err := st.SaveExecution(ctx, store.Execution{ID: "exe_" + strings.Repeat("0", 31) + string(rune('1'+i)), Tenant: tenant,
			Language: "python", Status: "succeeded", SandboxSeconds: 1.5, CPUSeconds: 0.5, CreatedAt: now, StartedAt: now, FinishedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "status-test-edge-secret"

	t.Run("healthy, with metrics", func(t *testing.T) {
		srv := fakeServer(t, true)
		var out, errOut bytes.Buffer
		e := &env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
			return map[string]string{"VERTAL_DATA_DIR": dir, "VERTAL_EDGE_SECRET": secret, "VERTAL_METRICS_ADDR": fakeMetrics(t), "VERTAL_RUNTIME": "runsc"}[k]
		}}
		if err := cmdStatus(ctx, e, []string{"--url", srv.URL, "--json"}); err != nil {
			t.Fatalf("status: %v %s", err, errOut.String())
		}
		var rep statusReport
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		on, two, one := true, 2.0, 1.0
		want := statusReport{
			CLIVersion: version,
			Server:     serverStatus{URL: srv.URL, Healthy: true, Version: "9.9.9"},
			Settings: settingsSource{From: "this command", Socket: filepath.Join(dir, "vertal.sock"),
				Error: "no server socket at " + filepath.Join(dir, "vertal.sock") + " (is the server running, with this --data-dir?)"},
			Sandboxes:  sandboxStatus{Driver: "oci", Runtime: "runsc", MaxConcurrent: rep.Sandboxes.MaxConcurrent, InUse: &two, Waiting: &one},
			Pool:       poolStatus{Enabled: true, Min: 1, Max: 4, MemoryMB: 1024, Live: &poolLive{Ready: 3, Hits: 7}},
			Metrics:    metricsStatus{Addr: rep.Metrics.Addr},
			Today:      todayStatus{Day: day, Tenants: 2, Executions: 3, SandboxSeconds: 4.5, CPUSeconds: 1.5},
			Async:      &asyncStatus{},
			Store:      storeStatus{Kind: "sqlite", Path: dir + "/vertal.db"},
			EdgeSecret: edgeSecretState{Configured: true, Enforced: &on},
		}
		if diff := cmp.Diff(want, rep); diff != "" {
			t.Errorf("status --json (-want +got):\n%s", diff)
		}
		if strings.Contains(out.String(), secret) {
			t.Errorf("the edge secret was printed")
		}
	})

	t.Run("text, edge secret off", func(t *testing.T) {
		srv := fakeServer(t, false)
		r := runOperator(t, cmdStatus, dir, "--url", srv.URL)
		if r.err != nil {
			t.Fatal(r.err)
		}
		for _, s := range []string{"version 9.9.9", "oci driver", "3 executions, 4.5 sandbox seconds", "2 tenants active", "sqlite " + dir, "OFF", "0 queued", "metrics      off"} {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("no %q in\n%s", s, r.stdout)
			}
		}
	})

	t.Run("server down", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close()
		r := runOperator(t, cmdStatus, dir, "--url", url)
		if !errors.Is(r.err, exitCode(1)) || !strings.Contains(r.stdout, "NOT REACHABLE") || !strings.Contains(r.stdout, "3 executions") {
			t.Errorf("%v\n%s", r.err, r.stdout)
		}
	})

	t.Run("no database", func(t *testing.T) {
		empty := t.TempDir()
		r := runOperator(t, cmdStatus, empty, "--url", fakeServer(t, false).URL)
		if !errors.Is(r.err, exitCode(1)) || !strings.Contains(r.stdout, "no database at "+empty) {
			t.Errorf("%v\n%s", r.err, r.stdout)
		}
	})
}

// TestStatusAsksTheServer: with a server answering on the data
// directory's socket, status shows the server's settings, not the
// defaults of its own flags, and reads the metrics at the server's
// address.
func TestStatusAsksTheServer(t *testing.T) {
	dir := t.TempDir()
	openTestStore(t, dir)
	srv := fakeServer(t, true)
	set := serverSettings{Driver: "docker", Runtime: "runsc", MaxConcurrent: 7, MaxQueue: 3, PoolMin: 2, PoolMax: 5, PoolMemoryMB: 300,
		MetricsAddr: fakeMetrics(t), EdgeSecret: true, NodeID: "n1", AsyncWorkers: 2}
	stop := serveOperatorSocket(dir, set, slog.New(slog.DiscardHandler))
	defer stop()
	sock := filepath.Join(dir, "vertal.sock")
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v %v, want mode 0600", fi, err)
	}

	r := runOperator(t, cmdStatus, dir, "--url", srv.URL, "--json")
	if r.err != nil {
		t.Fatalf("status: %v %s", r.err, r.stderr)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	two, one := 2.0, 1.0
	got := struct {
		Settings  settingsSource
		Sandboxes sandboxStatus
		Pool      poolStatus
		Metrics   metricsStatus
	}{rep.Settings, rep.Sandboxes, rep.Pool, rep.Metrics}
	want := struct {
		Settings  settingsSource
		Sandboxes sandboxStatus
		Pool      poolStatus
		Metrics   metricsStatus
	}{
		Settings:  settingsSource{From: "server", Socket: sock},
		Sandboxes: sandboxStatus{Driver: "docker", Runtime: "runsc", MaxConcurrent: 7, InUse: &two, Waiting: &one},
		Pool:      poolStatus{Enabled: true, Min: 2, Max: 5, MemoryMB: 300, Live: &poolLive{Ready: 3, Hits: 7}},
		Metrics:   metricsStatus{Addr: set.MetricsAddr},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status --json (-want +got):\n%s", diff)
	}

	r = runOperator(t, cmdStatus, dir, "--url", srv.URL)
	for _, s := range []string{"settings     the server's (from " + sock + ")", "docker driver, runtime runsc, 7 at once", "warm pool    2..5 per language, up to 300 MiB"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("no %q in\n%s", s, r.stdout)
		}
	}

	// A second server on the same data directory leaves the live socket
	// alone; once the first stops, its socket is gone.
	serveOperatorSocket(dir, serverSettings{Driver: "oci"}, slog.New(slog.DiscardHandler))()
	if got, err := askServer(context.Background(), dir, 5*time.Second); err != nil || got != set {
		t.Errorf("after a second server tried: %+v, %v; want the first one's settings", got, err)
	}
	stop()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after stop: %v, want it removed", err)
	}
}

func TestDescribeStoreHidesPassword(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want storeStatus
	}{
		{"postgres://vertal:hunter2@db.internal:5433/vertal?sslmode=require",
			storeStatus{Kind: "postgresql", Host: "db.internal", Port: 5433, Database: "vertal", User: "vertal"}},
		{"postgresql://vertal:hunter2@[::1/x", storeStatus{Kind: "postgresql", Error: "database-url cannot be parsed"}},
	} {
		got := describeStore(config.Config{DatabaseURL: tc.url})
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.url, diff)
		}
		b, _ := json.Marshal(got)
		if strings.Contains(string(b), "hunter2") {
			t.Errorf("password in %s", b)
		}
	}
}

// TestOperatorSocketLeavesForeignFiles: a file at the socket's path that is
// not a socket stays as it was; the server only goes without the socket.
func TestOperatorSocketLeavesForeignFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vertal.sock")
	if err := os.WriteFile(path, []byte("the operator's file"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := serveOperatorSocket(dir, serverSettings{}, slog.New(slog.DiscardHandler))
	stop()
	if b, err := os.ReadFile(path); err != nil || string(b) != "the operator's file" {
		t.Errorf("the file at the socket's path after serve: %q, %v", b, err)
	}
}

// TestOperatorSocketOwnerOnly: the socket appears at its path already
// 0600 (bound in a private directory, then renamed), leaves no private
// directory behind, is removed when the server stops, and another local
// user cannot connect to it even through a directory open to everyone.
func TestOperatorSocketOwnerOnly(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "vertal.sock")
	ln, err := listenOperatorSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v; want a socket with mode 0600", fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the data dir holds %d entries, want only the socket", len(entries))
	}
	if os.Geteuid() == 0 {
		if _, err := os.Stat("/usr/bin/python3"); err == nil {
			cmd := exec.Command("/usr/bin/python3", "-c", "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])", path)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
				t.Errorf("another user connected to the operator socket: %v %s", err, out)
			}
		}
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the owner cannot connect: %v", err)
	}
	c.Close()
	ln.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there after Close: %v", err)
	}
}
