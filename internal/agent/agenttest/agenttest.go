// Package agenttest runs the real agent (cmd/vertal-agent) in the
// drivers' end-to-end tests of live sandboxes, and checks what only the
// agent and the driver do together: the sandbox's way out to the host's
// egress socket (engine.EgressDir).
package agenttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Build builds the agent, static, once per test binary, and returns its
// path (in a directory of its own under the temporary directory, left for
// the system to clear: other tests of the binary may still run it).
func Build(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "vertal-agent")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "vertal-agent")
		cmd := exec.Command("go", "build", "-o", buildPath, "github.com/kuboprotocol/vertal2kubo/cmd/vertal-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building the agent: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// Echo is a host directory for LiveSpec.EgressDir in which, once Listen
// was called, an echo server listens on the socket the sandbox sees at
// engine.EgressSocket: each connection gets back what it sent, and the
// end of the stream once it half-closed.
type Echo struct {
	Dir string
}

// NewEcho makes the directory: 0755, so that the sandbox's uid can pass,
// and with a short path (a socket's path holds at most 107 bytes). It
// goes when the test ends.
func NewEcho(t testing.TB) *Echo {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &Echo{Dir: dir}
}

// Listen starts the echo server on a socket of mode 0666 (any uid may
// connect), as the server does once the sandbox is handed over: the
// sandbox started with the directory empty.
func (e *Echo) Listen(t testing.TB) {
	t.Helper()
	sock := filepath.Join(e.Dir, filepath.Base(engine.EgressSocket))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				io.Copy(c, c)
			}()
		}
	}()
}

// Run runs argv in the sandbox and returns its output and exit code.
func Run(t testing.TB, c *agent.Client, argv ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := c.Spawn(ctx, agent.SpawnRequest{Argv: argv})
	if err != nil {
		t.Fatalf("Spawn %q: %v", argv, err)
	}
	var o, e bytes.Buffer
	for {
		select {
		case ev, ok := <-p.Events():
			if !ok {
				t.Fatalf("%q: no exit event", argv)
			}
			switch ev.Stream {
			case 1:
				o.Write(ev.Data)
			case 2:
				e.Write(ev.Data)
			default:
				return o.String(), e.String(), ev.ExitCode
			}
		case <-ctx.Done():
			t.Fatalf("%q did not end: %v", argv, ctx.Err())
		}
	}
}

// echoProbe connects to the agent's relay as code in the sandbox does,
// sends a line, half-closes, and prints what came back until the end of
// the stream (as Python's repr), or "closed" if the connection failed
// on the way.
const echoProbe = `
import socket, sys
s = socket.create_connection(("127.0.0.1", %d), timeout=30)
got = b""
try:
    s.sendall(b"vertal-egress-probe")
    s.shutdown(socket.SHUT_WR)
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
except (ConnectionResetError, BrokenPipeError, OSError) as e:
    sys.stdout.write("closed: %%s" %% e)
    sys.exit(0)
sys.stdout.write(repr(got))
`

// probe runs echoProbe in the sandbox; it returns what the connection
// brought back, as Python's repr, or "closed: " and the error.
func probe(t testing.TB, c *agent.Client) string {
	t.Helper()
	out, errOut, code := Run(t, c, "python3", "-c", fmt.Sprintf(echoProbe, engine.EgressPort))
	if code != 0 {
		t.Fatalf("the probe failed (exit %d): %s%s", code, out, errOut)
	}
	return out
}

// startEgress asks the agent to relay engine.EgressPort.
func startEgress(t testing.TB, c *agent.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Egress(ctx, engine.EgressSocket, engine.EgressPort); err != nil {
		t.Fatalf("Egress: %v", err)
	}
}

// CheckEgress checks a live sandbox started with LiveSpec.EgressDir =
// e.Dir, its agent on c, and e not listening yet: a connection is closed
// while the host's socket is not there; once it is (Listen), the relay
// reaches the echo server both ways, with the half-close; the directory
// is mounted read-only, nosuid, nodev and noexec. gvisor says the sandbox runs
// under runsc, whose mounts show only ro (the host kernel enforces the
// rest on the gofer's files) and which answers a write there with
// EACCES before EROFS.
func CheckEgress(t *testing.T, c *agent.Client, e *Echo, gvisor bool) {
	t.Helper()
	startEgress(t, c)
	if got := probe(t, c); got != `b''` && !strings.HasPrefix(got, "closed: ") {
		t.Errorf("a connection before the host listens: %s, want it closed at once", got)
	}
	e.Listen(t)
	if got, want := probe(t, c), `b'vertal-egress-probe'`; got != want {
		t.Errorf("through the relay to the host's socket: %s, want %s", got, want)
	}
	// Read-only: nothing can be created there, and nothing reaches the
	// host's directory.
	refusals := []string{"read-only file system"}
	if gvisor {
		refusals = append(refusals, "permission denied")
	}
	out, errOut, code := Run(t, c, "sh", "-c", "echo x > "+engine.EgressDir+"/probe")
	if code == 0 || !slices.ContainsFunc(refusals, func(s string) bool { return strings.Contains(strings.ToLower(errOut), s) }) {
		t.Errorf("writing in %s: exit %d, %q %q; want a failure with one of %q", engine.EgressDir, code, out, errOut, refusals)
	}
	if ents, err := os.ReadDir(e.Dir); err != nil || len(ents) != 1 {
		t.Errorf("the host's egress directory holds %v (%v); want the socket only", ents, err)
	}
	mountinfo, _, _ := Run(t, c, "cat", "/proc/self/mountinfo")
	opts := ""
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == engine.EgressDir {
			opts = f[5]
		}
	}
	want := []string{"ro", "nosuid", "nodev", "noexec"}
	if gvisor {
		want = want[:1]
	}
	for _, o := range want {
		if !slices.Contains(strings.Split(opts, ","), o) {
			t.Errorf("%s is mounted %q; want %s", engine.EgressDir, opts, strings.Join(want, ","))
			break
		}
	}
	// The relay stays for more connections.
	if got, want := probe(t, c), `b'vertal-egress-probe'`; got != want {
		t.Errorf("a second connection: %s, want %s", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Egress(ctx, engine.EgressSocket, engine.EgressPort); !errors.Is(err, agent.ErrExist) {
		t.Errorf("a second Egress: %v, want ErrExist", err)
	}
}

// CheckNoEgress checks a live sandbox started without EgressDir, its
// agent on c: there is no socket at engine.EgressSocket, and a relay to
// it closes every connection.
func CheckNoEgress(t *testing.T, c *agent.Client) {
	t.Helper()
	// Python, not ls: coreutils' statx fails with EINVAL under gVisor.
	list := "import os; print(os.listdir(%q) if os.path.isdir(%q) else [])"
	if out, errOut, code := Run(t, c, "python3", "-c", fmt.Sprintf(list, engine.EgressDir, engine.EgressDir)); code != 0 || out != "[]\n" {
		t.Errorf("listing %s without EgressDir: exit %d, %q %q; want nothing there", engine.EgressDir, code, out, errOut)
	}
	startEgress(t, c)
	if got := probe(t, c); got != `b''` && !strings.HasPrefix(got, "closed: ") {
		t.Errorf("a connection without EgressDir: %s, want it closed at once", got)
	}
}
