// Package relaytest checks, in the drivers' end-to-end tests, a
// sandbox's way out (engine.Spec.EgressDir, engine.LiveSpec.EgressDir):
// with the real agent's relay, the program reaches a host socket standing
// in for package egress's proxy, and sees what the driver mounts; without
// it there is none. Each driver runs the same Suite (one-shot), and
// agenttest.LiveSuite, on each of its runtimes (agenttest.ForEachRuntime),
// as every store runs storetest. (It imports nothing of package agent:
// the agent imports the engine, so the suites that drive the agent's
// client live in agenttest.) The fake internet that package egress's
// own tests and the services' network tests use is egress/egresstest.
package relaytest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Host is a host directory for Spec.EgressDir with an HTTP server on its
// socket, standing in for package egress's proxy: every request gets back
// "vertal-egress-reply <method> <request URI as sent>".
type Host struct {
	Dir string
}

// NewHost makes the directory (0755, and short: a socket's path holds at
// most 107 bytes) and serves on a socket any uid may connect to, as the
// server's proxy does; both go when the test ends.
func NewHost(t testing.TB) *Host {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "ve")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, filepath.Base(engine.EgressSocket))
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "vertal-egress-reply %s %s", r.Method, r.RequestURI)
	}), ReadHeaderTimeout: time.Minute}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &Host{Dir: dir}
}

// Check fails t unless the directory holds its socket alone and no bind
// of it is left on the host.
func (h *Host) Check(t testing.TB) {
	t.Helper()
	if ents, err := os.ReadDir(h.Dir); err != nil || len(ents) != 1 || ents[0].Name() != filepath.Base(engine.EgressSocket) {
		t.Errorf("the host's egress directory holds %v (%v); want its socket alone", ents, err)
	}
	if ms := MountsOf(t, h.Dir); len(ms) > 0 {
		t.Errorf("binds of the egress directory left on the host: %v", ms)
	}
}

// MountsOf lists the mount points of the host's binds of path: the
// mounts whose root, in its filesystem, is path or its end.
func MountsOf(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[3] != "/" && strings.HasSuffix(path, f[3]) {
			out = append(out, f[4])
		}
	}
	return out
}

// Programs of the suite, in Python.
const (
	urllibProgram = `
import urllib.request
print(urllib.request.urlopen("http://example.test/hello", timeout=30).read().decode())
`
	rawSocketProgram = `
import socket
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"GET http://example.test/raw HTTP/1.0\r\nHost: example.test\r\n\r\n")
got = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
print(got.split(b"\r\n\r\n", 1)[1].decode())
`
	mountsProgram = `
import json
m = {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[4] in ("/.vertal/net", "/.vertal/agent"):
        m[f[4]] = f[5]
try:
    open("/.vertal/net/probe", "w")
    m["write"] = "written"
except OSError as e:
    m["write"] = e.strerror
print(json.dumps(m))
`
	// The relay execs the program in its own place: its parent is the
	// sandbox's deadline, timeout(1).
	processProgram = `
import os, sys
print(sys.argv[1:], os.environ.get("MINE"), os.environ.get("HTTP_PROXY"), os.environ.get("NO_PROXY"))
print(open("/proc/%d/comm" % os.getppid()).read().strip(), sys.stdin.read())
`
	exitProgram = `
import sys
print("out")
print("err", file=sys.stderr)
sys.exit(3)
`
	noEgressProgram = `
import os, socket
print(os.path.exists("/.vertal/net/proxy.sock"))
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=5)
    print("connected")
except ConnectionRefusedError:
    print("refused")
`
)

// Runner runs spec (Language, Code and the rest set; no ID) as one
// execution of the driver under test, under ctx, and checks that it left
// nothing of the driver's own behind.
type Runner func(t *testing.T, ctx context.Context, spec engine.Spec) (engine.Result, error)

// Suite runs the one-shot egress cases with lang (a Python) and agent
// (agenttest.Build) through run. gvisor says the driver runs runsc,
// whose mounts show only ro (the host kernel enforces the rest on the
// gofer's files) and which refuses a write there with EACCES.
//
// With an EgressDir: urllib reaches the host through the proxy
// environment and a raw socket through 127.0.0.1:3128; the directory is
// read-only, nosuid, nodev and noexec and the agent read-only, nosuid and
// nodev but executable; args, env (ProxyEnv over the request's) and
// stdin reach the program, which the relay exec'd in its own place; a
// timeout and a cancel end it; its exit status and output are what they
// are without egress; an EgressDir or agent that is not an absolute path
// to a directory or file is refused. Without one, there is no socket and
// nothing listens on 127.0.0.1:3128. After every execution the host's
// directory holds its socket alone and no bind of it is left.
func Suite(t *testing.T, lang engine.Language, agent string, gvisor bool, run Runner) {
	host := NewHost(t)
	exec := func(t *testing.T, spec engine.Spec, cancel time.Duration) (engine.Result, error) {
		t.Helper()
		ctx := context.Background()
		if cancel > 0 {
			var stop context.CancelFunc
			ctx, stop = context.WithTimeout(ctx, cancel)
			defer stop()
		}
		spec.Language = lang
		if spec.Timeout == 0 {
			spec.Timeout = time.Minute
		}
		res, err := run(t, ctx, spec)
		host.Check(t)
		return res, err
	}
	with := func(spec engine.Spec) engine.Spec {
		spec.EgressDir, spec.Agent = host.Dir, agent
		return spec
	}
	stdout := func(want string) func(t *testing.T, res engine.Result, err error) {
		return func(t *testing.T, res engine.Result, err error) {
			if err != nil || res.Status != engine.StatusSucceeded || res.Stdout != want {
				t.Errorf("Run = %s %q %q, %v; want stdout %q", res.Status, res.Stdout, res.Stderr, err, want)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		spec   engine.Spec
		cancel time.Duration
		check  func(t *testing.T, res engine.Result, err error)
	}{
		{name: "urllib", spec: with(engine.Spec{Code: urllibProgram}), check: stdout("vertal-egress-reply GET http://example.test/hello\n")},
		{name: "raw_socket", spec: with(engine.Spec{Code: rawSocketProgram}), check: stdout("vertal-egress-reply GET http://example.test/raw\n")},
		{name: "mounts", spec: with(engine.Spec{Code: mountsProgram}), check: func(t *testing.T, res engine.Result, err error) {
			if err != nil || res.Status != engine.StatusSucceeded {
				t.Fatalf("Run = %s %q %q, %v", res.Status, res.Stdout, res.Stderr, err)
			}
			checkMounts(t, res.Stdout, gvisor)
		}},
		{name: "process", spec: with(engine.Spec{Code: processProgram, Args: []string{"x y", "z"}, Stdin: "from stdin",
			Env: map[string]string{"MINE": "1", "HTTP_PROXY": "http://elsewhere:1"}}),
			check: stdout("['x y', 'z'] 1 http://127.0.0.1:3128 localhost,127.0.0.1,::1\ntimeout from stdin\n")},
		{name: "timed_out", spec: with(engine.Spec{Code: "import time\ntime.sleep(60)", Timeout: 2 * time.Second}), check: func(t *testing.T, res engine.Result, err error) {
			if err != nil || res.Status != engine.StatusTimedOut {
				t.Errorf("Run = %s, %v; want %s", res.Status, err, engine.StatusTimedOut)
			}
		}},
		{name: "cancelled", spec: with(engine.Spec{Code: "import time\ntime.sleep(60)"}), cancel: 1500 * time.Millisecond, check: func(t *testing.T, res engine.Result, err error) {
			if err == nil {
				t.Errorf("Run = %s; want an error", res.Status)
			}
		}},
		{name: "without", spec: engine.Spec{Code: noEgressProgram}, check: stdout("False\nrefused\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := exec(t, tc.spec, tc.cancel)
			tc.check(t, res, err)
		})
	}
	t.Run("exit_as_without", func(t *testing.T) {
		type outcome struct {
			Status         engine.Status
			ExitCode       int
			Stdout, Stderr string
			Err            bool
		}
		var got [2]outcome
		for i, spec := range []engine.Spec{{Code: exitProgram}, with(engine.Spec{Code: exitProgram})} {
			res, err := exec(t, spec, 0)
			got[i] = outcome{res.Status, res.ExitCode, res.Stdout, res.Stderr, err != nil}
		}
		want := outcome{Status: engine.StatusFailed, ExitCode: 3, Stdout: "out\n", Stderr: "err\n"}
		if diff := cmp.Diff([2]outcome{want, want}, got); diff != "" {
			t.Errorf("outcome without and with egress (-want +got):\n%s", diff)
		}
	})
	t.Run("refused", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, spec := range []engine.Spec{
			{EgressDir: "relative/dir", Agent: agent},
			{EgressDir: file, Agent: agent},
			{EgressDir: filepath.Join(t.TempDir(), "missing"), Agent: agent},
			{EgressDir: host.Dir, Agent: "relative/agent"},
			{EgressDir: host.Dir, Agent: filepath.Join(t.TempDir(), "missing")},
		} {
			spec.Code = "print(1)"
			if res, err := exec(t, spec, 0); err == nil {
				t.Errorf("Run with EgressDir %q, Agent %q = %s; want an error", spec.EgressDir, spec.Agent, res.Status)
			}
		}
	})
}

// checkMounts checks what mountsProgram printed (see Suite).
func checkMounts(t *testing.T, stdout string, gvisor bool) {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal([]byte(stdout), &m); err != nil {
		t.Fatalf("%q: %v", stdout, err)
	}
	has := func(path string, want ...string) {
		opts := strings.Split(m[path], ",")
		for _, o := range want {
			if !slices.Contains(opts, o) {
				t.Errorf("%s is mounted %q; want %s", path, m[path], strings.Join(want, ","))
				return
			}
		}
	}
	if gvisor {
		has(engine.EgressDir, "ro")
		has(engine.AgentPath, "ro")
	} else {
		has(engine.EgressDir, "ro", "nosuid", "nodev", "noexec")
		has(engine.AgentPath, "ro", "nosuid", "nodev")
	}
	if slices.Contains(strings.Split(m[engine.AgentPath], ","), "noexec") {
		t.Errorf("%s is mounted %q: noexec", engine.AgentPath, m[engine.AgentPath])
	}
	refusals := []string{"Read-only file system"}
	if gvisor {
		refusals = append(refusals, "Permission denied")
	}
	if !slices.Contains(refusals, m["write"]) {
		t.Errorf("writing in %s: %q; want one of %q", engine.EgressDir, m["write"], refusals)
	}
}
