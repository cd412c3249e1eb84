package main

// `vertal-agent relay --socket PATH --port N -- PROGRAM ARGS...`
// (engine.RelayArgv) gives a one-shot sandbox the egress relay of a live
// one. It starts the relay (the hidden subcommand relay-serve:
// 127.0.0.1:N, and [::1]:N if there is ::1, to the unix socket PATH)
// detached, through a process that starts it and exits at once, so that
// the relay is no child of the program: it is reparented to the
// sandbox's pid 1, and a program that waits for all of its children
// (wait(-1) until ECHILD, as supervisors and some judges do) never waits
// for it. It waits until the relay listens, and then execs PROGRAM in its
// own place: same pid, same descriptors 0, 1 and 2, same environment, and
// so the same exit status. The relay holds none of the program's
// descriptors (its own 0, 1 and 2 are /dev/null, and it closes any other
// it inherited) and lives on until the sandbox's pid namespace ends; it
// ignores SIGHUP and SIGPIPE, and runs in a session of its own, in /. If
// PROGRAM cannot be found or executed, no relay is left behind.
//
// Exit status of relay's own failures, as env(1) and a shell: 125 for the
// relay (bad arguments, the port taken, the relay not ready in time),
// 127 for a PROGRAM not found, 126 for one that cannot be executed.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
)

const (
	relayUsage = "usage: vertal-agent relay --socket path --port n -- program [arg...]"
	// relayServeCmd is the hidden subcommand of the relay's process.
	relayServeCmd = "relay-serve"
	// relayReady is the byte relay-serve writes on fd 3 once it listens,
	// followed by its pid; anything else there is its error, on one line.
	relayReady = 'R'
	// relayDetach, relay-serve's first argument, has it start the relay
	// as a process of its own and exit (startRelay).
	relayDetach = "--detach"
	// relayStartTimeout bounds the wait for relay-serve to listen.
	relayStartTimeout = 5 * time.Second

	exitRelayFailed  = 125
	exitCannotInvoke = 126
	exitNotFound     = 127
)

// relayFlags parses the arguments of relay and relay-serve: an absolute
// socket path, a port, and what follows (for relay, after "--").
func relayFlags(name string, args []string) (socket string, port int, rest []string, err error) {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	fl.StringVar(&socket, "socket", "", "the host's unix socket to relay each connection to")
	fl.IntVar(&port, "port", 0, "the loopback port to listen on")
	if err := fl.Parse(args); err != nil {
		return "", 0, nil, err
	}
	if socket == "" || !filepath.IsAbs(socket) {
		return "", 0, nil, fmt.Errorf("--socket %q: not an absolute path", socket)
	}
	if port <= 0 || port > 65535 {
		return "", 0, nil, fmt.Errorf("--port %d: not a port", port)
	}
	return socket, port, fl.Args(), nil
}

// relayMain is `vertal-agent relay`; it returns only on a failure, with
// the exit status.
func relayMain(args []string) int {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "vertal-agent relay: "+format+"\n", a...)
		return code
	}
	socket, port, argv, err := relayFlags("relay", args)
	if err == nil && len(argv) == 0 {
		err = errors.New("no program to run")
	}
	if err != nil {
		return fail(exitRelayFailed, "%v (%s)", err, relayUsage)
	}
	// The program is looked up first: one that cannot run leaves no relay
	// behind.
	path, code, err := lookProgram(argv[0])
	if err != nil {
		return fail(code, "%v", err)
	}
	relay, err := startRelay(socket, port)
	if err != nil {
		return fail(exitRelayFailed, "%v", err)
	}
	// Every descriptor the runtime and startRelay opened (relay's pidfd
	// too) is close-on-exec: the program gets 0, 1 and 2, and whatever
	// the caller passed on.
	err = syscall.Exec(path, argv, os.Environ())
	// The program did not start after all: no relay for nothing (its
	// parent, the sandbox's pid 1, reaps it).
	killRelay(relay)
	code = exitCannotInvoke
	if errors.Is(err, syscall.ENOENT) {
		code = exitNotFound
	}
	return fail(code, "%s: %v", argv[0], err)
}

// lookProgram finds name as a shell would (in PATH if it has no slash)
// and returns its path, or an error and the exit status for it.
func lookProgram(name string) (string, int, error) {
	path, err := exec.LookPath(name)
	if errors.Is(err, exec.ErrDot) {
		// A relative directory in PATH: a shell runs what it finds there.
		err = nil
	}
	switch {
	case err == nil:
		return path, 0, nil
	case errors.Is(err, exec.ErrNotFound):
		return "", exitNotFound, fmt.Errorf("%s: command not found", name)
	}
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "", exitNotFound, fmt.Errorf("%s: %v", name, err)
	}
	return "", exitCannotInvoke, fmt.Errorf("%s: %v", name, err)
}

// selfPaths is where to find this binary again: /proc/self/exe first (it
// works whatever the binary's path in this mount namespace), then
// os.Args[0].
func selfPaths() []string {
	paths := []string{"/proc/self/exe"}
	if p, err := exec.LookPath(os.Args[0]); err == nil || errors.Is(err, exec.ErrDot) {
		paths = append(paths, p)
	}
	return paths
}

// startRelay starts relay-serve detached (relay-serve --detach starts it
// and exits, reaped here) and waits until it listens; it returns the
// relay's pid. It relays until the sandbox ends. A relay that failed
// exits by itself; one not listening in time ends with the sandbox.
func startRelay(socket string, port int) (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		w.Close()
		return 0, err
	}
	defer null.Close()
	argv := []string{os.Args[0], relayServeCmd, relayDetach, "--socket", socket, "--port", strconv.Itoa(port)}
	p, err := startSelf(argv, []*os.File{null, null, null, w})
	w.Close()
	if err != nil {
		return 0, fmt.Errorf("starting the relay: %w", err)
	}
	// The detaching process exits once the relay started (or could not).
	st, err := p.Wait()
	if err == nil && !st.Success() {
		err = errors.New(st.String())
	}
	if err != nil {
		return 0, fmt.Errorf("starting the relay: %w", err)
	}
	r.SetReadDeadline(time.Now().Add(relayStartTimeout))
	msg, err := io.ReadAll(io.LimitReader(r, 4096))
	if err == nil && len(msg) > 1 && msg[0] == relayReady {
		if pid, perr := strconv.Atoi(string(msg[1:])); perr == nil && pid > 0 {
			return pid, nil
		}
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, fmt.Errorf("the relay was not listening after %v", relayStartTimeout)
	case err != nil:
		return 0, fmt.Errorf("waiting for the relay: %v", err)
	case len(msg) > 0 && msg[0] != relayReady:
		return 0, errors.New(oneLine(string(msg)))
	default:
		return 0, fmt.Errorf("the relay ended before listening (%q)", msg)
	}
}

// killRelay kills the relay and waits (a second at most) until it has
// exited: it is not this process's child, but its pidfd says.
func killRelay(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return
	}
	defer unix.Close(fd)
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 1000)
}

// startSelf starts this binary again with argv and files (0, 1, 2 and
// 3), in /, in a session of its own, with the runtime's settings only.
func startSelf(argv []string, files []*os.File) (*os.Process, error) {
	attr := &os.ProcAttr{
		Dir: "/", // holds no mount busy
		// The runtime's settings only, not the program's environment:
		// few threads (the sandbox's pids limit counts them).
		Env:   []string{"GOMAXPROCS=1"},
		Files: files,
		// Out of the program's session and process group: no SIGHUP or
		// SIGINT from its terminal, no signal to its group.
		Sys: &syscall.SysProcAttr{Setsid: true},
	}
	var err error
	for _, exe := range selfPaths() {
		var p *os.Process
		if p, err = os.StartProcess(exe, argv, attr); err == nil {
			return p, nil
		}
	}
	return nil, err
}

// oneLine makes s one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// relayServeMain is relay-serve: it listens, says so on fd 3 (or writes
// its error there and exits 1), and relays until killed.
func relayServeMain(args []string) {
	closeInherited(4)
	ready := os.NewFile(3, "ready")
	if len(args) > 0 && args[0] == relayDetach {
		// Start the relay itself, with the same descriptors, and exit: it
		// is reparented to the sandbox's pid 1.
		argv := append([]string{os.Args[0], relayServeCmd}, args[1:]...)
		if _, err := startSelf(argv, []*os.File{os.Stdin, os.Stdout, os.Stderr, ready}); err != nil {
			io.WriteString(ready, oneLine("starting the relay: "+err.Error()))
		}
		os.Exit(0)
	}
	fail := func(err error) {
		if ready != nil {
			io.WriteString(ready, oneLine(err.Error()))
		}
		os.Exit(1)
	}
	runtime.GOMAXPROCS(1)
	// Not dumpable, as serve: code of the sandbox's uid cannot trace it
	// or open its descriptors through /proc.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fail(fmt.Errorf("making the relay not dumpable: %w", err))
	}
	signal.Ignore(syscall.SIGHUP)
	// A write to a closed connection is an error to handle, not a SIGPIPE
	// to die of.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	socket, port, rest, err := relayFlags(relayServeCmd, args)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("unexpected arguments %q", rest)
	}
	if err != nil {
		fail(err)
	}
	lns, err := agent.ListenRelay(port)
	if err != nil {
		fail(err)
	}
	if _, err := ready.Write(append([]byte{relayReady}, strconv.Itoa(os.Getpid())...)); err != nil {
		os.Exit(1)
	}
	ready.Close()
	agent.Relay(context.Background(), lns, socket, nil)
	os.Exit(1) // every listener failed
}

// closeInherited closes each descriptor from fd up that was passed on
// to this process: one not close-on-exec (every descriptor the runtime
// opens is). The relay outlives the program, and must not hold a pipe
// its caller waits on.
func closeInherited(from int) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd < from {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}
