package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// relayProbe is the sandbox's client: it connects to argv[1]:argv[2],
// sends a line, half-closes, and prints what came back until the end of
// the stream (as Python's repr), or "closed: " and the error.
const relayProbe = `
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    s.sendall(b"vertal-relay-probe")
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    print(repr(got))
except OSError as e:
    print("closed: %s" % e)
`

// probeScript is a /bin/sh script that prints its pid, then runs
// relayProbe to $1 port $2.
const probeScript = `echo "pid $$"; /usr/bin/python3 -c "$0" "$1" "$2"`

// hasIPv6Loopback tells whether ::1 can be listened on here.
func hasIPv6Loopback() bool {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// relayProcs returns the pids of the relay processes (relay-serve) of
// socket.
func relayProcs(t *testing.T, socket string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) >= 4 && args[1] == relayServeCmd && args[2] == "--socket" && args[3] == socket {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killRelays kills every relay left for socket and waits until they are
// gone.
func killRelays(t *testing.T, socket string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		pids := relayProcs(t, socket)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("relay processes %v of %s outlived SIGKILL", pids, socket)
			return
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// cleanRelays kills, at the end of the test, every relay left for socket.
func cleanRelays(t *testing.T, socket string) {
	t.Cleanup(func() { killRelays(t, socket) })
}

// result is how a run of the agent ended.
type result struct {
	pid            int // the agent's, from Start
	stdout, stderr string
	state          *os.ProcessState
}

// code is the exit status, or -1 for a signal.
func (r result) code() int { return r.state.ExitCode() }

// run runs the agent with args, extra as its descriptors from 3 on, and
// waits for it, stdout and stderr included (pipes, read until every
// holder closed them), for at most 15 s.
func run(t *testing.T, bin string, extra []*os.File, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.ExtraFiles = extra
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%q: %v", args, err)
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("%q did not end within 15s, or something still holds its stdout or stderr; stdout %q, stderr %q", args, stdout.String(), stderr.String())
	}
	return result{pid: cmd.Process.Pid, stdout: stdout.String(), stderr: stderr.String(), state: cmd.ProcessState}
}

// relayArgs is the agent's arguments to run argv under relay.
func relayArgs(socket string, port int, argv ...string) []string {
	return append([]string{"relay", "--socket", socket, "--port", strconv.Itoa(port), "--"}, argv...)
}

// checkRelayProc checks the relay process left for socket: there is one,
// in a session of its own, its 0, 1 and 2 are /dev/null, it has few threads,
// and it still relays 127.0.0.1:port to the echo server after a SIGHUP
// and a SIGPIPE.
func checkRelayProc(t *testing.T, socket string, port int) {
	t.Helper()
	pids := relayProcs(t, socket)
	if len(pids) != 1 {
		t.Fatalf("relay processes of %s: %v, want one", socket, pids)
	}
	pid := pids[0]
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid pgrp session ...; comm is the agent's name.
	if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) < 4 || f[2] != strconv.Itoa(pid) || f[3] != strconv.Itoa(pid) {
		t.Errorf("the relay %d is in process group and session %q, want its own", pid, f[2:4])
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		// Its other descriptors are its own: sockets, the runtime's, and
		// the pipes Go splices the relayed connections through.
		if fd, _ := strconv.Atoi(e.Name()); fd <= 2 && target != os.DevNull {
			t.Errorf("the relay's fd %d is %s, want %s", fd, target, os.DevNull)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || n > 10 {
				t.Errorf("the relay has %q threads, want at most 10", strings.TrimSpace(v))
			}
		}
	}
	for _, sig := range []syscall.Signal{0, syscall.SIGHUP, syscall.SIGPIPE} {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("signal %v to the relay: %v", sig, err)
		}
		time.Sleep(20 * time.Millisecond)
		if got, want := echo(t, port), "vertal-relay-probe"; got != want {
			t.Errorf("after signal %v, a connection from the host to 127.0.0.1:%d brought back %q, want %q", sig, port, got, want)
		}
	}
}

// echo sends a line through 127.0.0.1:port and returns what came back.
func echo(t *testing.T, port int) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 10*time.Second)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "vertal-relay-probe")
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// TestRelay runs programs under `vertal-agent relay` with an echo server
// on the host's socket: the program takes the agent's place (same pid,
// its exit status or signal), reaches the socket through the loopback
// port, and its stdout and stderr end with it though the relay lives on.
func TestRelay(t *testing.T) {
	bin := agenttest.Build(t)
	e := agenttest.NewEcho(t)
	e.Listen(t)
	sock := filepath.Join(e.Dir, filepath.Base(engine.EgressSocket))
	missing := filepath.Join(e.Dir, "missing.sock")
	cleanRelays(t, sock)
	cleanRelays(t, missing)
	const probed = "b'vertal-relay-probe'\n"

	for _, tc := range []struct {
		name   string
		socket string
		host   string // the probe's; "" for none
		exit   string // the script's end
		ipv6   bool   // needs ::1
		out    string // stdout after the pid line
		code   int
		signal syscall.Signal // the program's end, if by a signal
	}{
		{name: "echo", socket: sock, host: "127.0.0.1", out: probed},
		{name: "echo over ::1", socket: sock, host: "::1", ipv6: true, out: probed},
		{name: "no socket yet", socket: missing, host: "127.0.0.1", out: "closed"},
		{name: "exit 7", socket: sock, exit: "exit 7", code: 7},
		{name: "exit 0", socket: sock, exit: "exit 0"},
		{name: "SIGTERM", socket: sock, exit: "kill -TERM $$; sleep 10", code: -1, signal: syscall.SIGTERM},
		{name: "SIGKILL after a probe", socket: sock, host: "127.0.0.1", exit: "kill -KILL $$", out: probed, code: -1, signal: syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ipv6 && !hasIPv6Loopback() {
				t.Skip("no ::1 here")
			}
			port := e2etest.FreePort(t)
			script := `echo "pid $$"`
			if tc.host != "" {
				script = probeScript
			}
			if tc.exit != "" {
				script += "; " + tc.exit
			}
			argv := []string{"/bin/sh", "-c", script, relayProbe, tc.host, strconv.Itoa(port)}
			start := time.Now()
			r := run(t, bin, nil, relayArgs(tc.socket, port, argv...)...)
			t.Logf("ran in %v", time.Since(start))
			defer killRelays(t, tc.socket)
			if r.stderr != "" {
				t.Errorf("stderr %q", r.stderr)
			}
			pidLine, out, _ := strings.Cut(r.stdout, "\n")
			if want := fmt.Sprintf("pid %d", r.pid); pidLine != want {
				t.Errorf("the program printed %q, want %q (the agent's pid)", pidLine, want)
			}
			if tc.out == "closed" {
				if out != "b''\n" && !strings.HasPrefix(out, "closed: ") {
					t.Errorf("without the host's socket the probe got %q, want the connection closed", out)
				}
			} else if out != tc.out {
				t.Errorf("stdout after the pid: %q, want %q", out, tc.out)
			}
			if got := r.code(); got != tc.code {
				t.Errorf("exit status %d, want %d (%v)", got, tc.code, r.state)
			}
			ws := r.state.Sys().(syscall.WaitStatus)
			if tc.signal != 0 && (!ws.Signaled() || ws.Signal() != tc.signal) {
				t.Errorf("the agent ended with %v, want killed by %v", r.state, tc.signal)
			}
			if tc.socket == sock {
				checkRelayProc(t, sock, port)
			}
		})
	}
}

// TestRelayDescriptors: the program has the descriptors it would have
// without the relay: 0, 1 and 2, and ls's own for the directory it
// lists, nothing of the agent's.
func TestRelayDescriptors(t *testing.T) {
	bin := agenttest.Build(t)
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	cleanRelays(t, sock)
	// What the test binary itself inherited (from go test's caller) would
	// pass on to every child, relay or not: it is made close-on-exec, so
	// that a child starts with 0, 1 and 2 alone.
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range fds {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	ls := []string{"/bin/ls", "/proc/self/fd"}
	direct, err := exec.Command(ls[0], ls[1:]...).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "0\n1\n2\n3\n"; string(direct) != want {
		t.Fatalf("ls %s without the relay: %q, want %q", ls[1], direct, want)
	}
	r := run(t, bin, nil, relayArgs(sock, e2etest.FreePort(t), ls...)...)
	if r.code() != 0 || r.stdout != string(direct) {
		t.Errorf("ls %s under the relay: exit %d, %q %q; want %q", ls[1], r.code(), r.stdout, r.stderr, direct)
	}
}

// TestRelayKeepsTheProcessState: under the relay the program sees what
// it would without: the same environment, working directory, limits
// (Go raises its own RLIMIT_NOFILE) and signal mask and dispositions.
func TestRelayKeepsTheProcessState(t *testing.T) {
	bin := agenttest.Build(t)
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	cleanRelays(t, sock)
	wd := t.TempDir()
	for _, argv := range [][]string{
		{"/usr/bin/env"},
		{"/bin/pwd", "-P"},
		{"/bin/cat", "/proc/self/limits"},
		{"/bin/grep", "-E", "^Sig(Blk|Ign|Cgt)|^NoNewPrivs", "/proc/self/status"},
	} {
		t.Run(filepath.Base(argv[0]), func(t *testing.T) {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = wd
			cmd.Env = []string{"VERTAL_TEST=1", "PATH=/usr/bin:/bin"}
			direct, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			cmd = exec.Command(bin, relayArgs(sock, e2etest.FreePort(t), argv...)...)
			cmd.Dir = wd
			cmd.Env = []string{"VERTAL_TEST=1", "PATH=/usr/bin:/bin"}
			cmd.WaitDelay = 15 * time.Second // the relay must not hold stdout
			relayed, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(relayed, direct) {
				t.Errorf("%q under the relay:\n%s\nwithout:\n%s", argv, relayed, direct)
			}
		})
	}
}

// TestRelayHoldsNoInheritedDescriptor: a descriptor the agent's caller
// passed on (not close-on-exec) goes to the program, not to the relay,
// which lives on: the caller sees its end once the program ended. It is
// passed as fd 3 and 4: the relay's own fd 3 is its readiness pipe.
func TestRelayHoldsNoInheritedDescriptor(t *testing.T) {
	bin := agenttest.Build(t)
	sock := filepath.Join(t.TempDir(), "proxy.sock")
	cleanRelays(t, sock)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	r := run(t, bin, []*os.File{pw, pw}, relayArgs(sock, e2etest.FreePort(t), "/bin/sh", "-c", "echo passed >&4")...)
	pw.Close()
	if r.code() != 0 {
		t.Fatalf("exit %d, %q", r.code(), r.stderr)
	}
	if len(relayProcs(t, sock)) != 1 {
		t.Fatalf("no relay process left for %s", sock)
	}
	pr.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(pr)
	if err != nil || string(b) != "passed\n" {
		t.Errorf("the caller's pipe (fd 3 and 4): %q, %v; want %q and its end", b, err, "passed\n")
	}
}

// TestRelayFailures: what the relay cannot do ends with a line on stderr
// and the status a shell or env(1) gives, without running the program
// and without leaving a relay behind.
func TestRelayFailures(t *testing.T) {
	bin := agenttest.Build(t)
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\necho ran\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noInterp := filepath.Join(dir, "nointerp")
	if err := os.WriteFile(noInterp, []byte("#!/nonexistent/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("\x00\x01\x02 not a program\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	ran := []string{"/bin/sh", "-c", "echo ran"}

	for i, tc := range []struct {
		name string
		args func(sock string) []string
		code int
		msg  string // in stderr
	}{
		{"missing program", func(s string) []string { return relayArgs(s, e2etest.FreePort(t), "vertal-no-such-program") }, 127, "vertal-no-such-program: command not found"},
		{"missing path", func(s string) []string { return relayArgs(s, e2etest.FreePort(t), filepath.Join(dir, "nothing")) }, 127, "no such file or directory"},
		{"not executable", func(s string) []string { return relayArgs(s, e2etest.FreePort(t), plain) }, 126, "permission denied"},
		{"missing interpreter", func(s string) []string { return relayArgs(s, e2etest.FreePort(t), noInterp) }, 127, "no such file or directory"},
		{"not a program", func(s string) []string { return relayArgs(s, e2etest.FreePort(t), garbage) }, 126, "exec format error"},
		{"a directory", func(s string) []string { return relayArgs(s, e2etest.FreePort(t), dir) }, 126, "is a directory"},
		{"no program", func(s string) []string { return relayArgs(s, e2etest.FreePort(t)) }, 125, "no program to run"},
		{"relative socket", func(string) []string { return relayArgs("proxy.sock", e2etest.FreePort(t), ran...) }, 125, "not an absolute path"},
		{"no port", func(s string) []string { return relayArgs(s, 0, ran...) }, 125, "not a port"},
		{"bad flag", func(s string) []string { return []string{"relay", "--sock", s, "--", "true"} }, 125, "flag provided but not defined"},
		{"port taken", func(s string) []string { return relayArgs(s, takenPort, ran...) }, 125, "address already in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(dir, strconv.Itoa(i)+".sock")
			cleanRelays(t, sock)
			r := run(t, bin, nil, tc.args(sock)...)
			if r.code() != tc.code {
				t.Errorf("exit %d, want %d", r.code(), tc.code)
			}
			if !strings.HasPrefix(r.stderr, "vertal-agent relay: ") || !strings.Contains(r.stderr, tc.msg) || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line starting with %q and containing %q", r.stderr, "vertal-agent relay: ", tc.msg)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing (the program must not run)", r.stdout)
			}
			if pids := relayProcs(t, sock); len(pids) != 0 {
				t.Errorf("relay processes left: %v", pids)
			}
		})
	}
}

// TestUsageMentionsRelay: the agent's usage names both subcommands.
func TestUsageMentionsRelay(t *testing.T) {
	bin := agenttest.Build(t)
	r := run(t, bin, nil)
	if r.code() != 2 || !strings.Contains(r.stderr, "vertal-agent serve") || !strings.Contains(r.stderr, "vertal-agent relay --socket") {
		t.Errorf("usage: exit %d, %q", r.code(), r.stderr)
	}
}

// TestRelayIsNoChildOfTheProgram: the relay is started detached, so a
// program that reaps every child of its own until there is none (a
// supervisor, a judge) ends at once, and its parent is still its parent.
func TestRelayIsNoChildOfTheProgram(t *testing.T) {
	bin := agenttest.Build(t)
	e := agenttest.NewEcho(t)
	e.Listen(t)
	sock := filepath.Join(e.Dir, filepath.Base(engine.EgressSocket))
	cleanRelays(t, sock)
	const reapAll = `
import os, signal
signal.alarm(5)
if os.fork() == 0:
    os._exit(0)
n = 0
while True:
    try:
        os.wait()
        n += 1
    except ChildProcessError:
        break
print("reaped", n, "children")
`
	r := run(t, bin, nil, relayArgs(sock, e2etest.FreePort(t), "/usr/bin/python3", "-c", reapAll)...)
	if r.code() != 0 || r.stdout != "reaped 1 children\n" {
		t.Errorf("a program reaping all its children: exit %d, stdout %q, stderr %q; want 0 and its one child", r.code(), r.stdout, r.stderr)
	}
	pids := relayProcs(t, sock)
	if len(pids) != 1 {
		t.Fatalf("relay processes: %v, want one", pids)
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pids[0]), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	// The field after the name (in parentheses) is the state, then the ppid.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if f[1] == strconv.Itoa(r.pid) {
		t.Errorf("the relay's parent is the program (%d)", r.pid)
	}
}
