// Command vertal-agent is the agent inside a sandbox that stays (package
// agent): `vertal-agent serve --deadline <unix seconds>` speaks the
// protocol on stdin and stdout, logs to stderr, and exits when the host
// closes the connection or the deadline passes, killing every process it
// started. It is built static (CGO_ENABLED=0) and mounted read-only into
// the sandbox. `vertal-agent relay --socket path --port n -- program
// [arg...]` runs a one-shot sandbox's program with the egress relay of a
// live one: it starts a process that relays 127.0.0.1:<n> to the unix
// socket, then execs the program in its own place (relay.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
)

func main() {
	if len(os.Args) >= 2 {
		switch os.Args[1] {
		case "relay":
			os.Exit(relayMain(os.Args[2:]))
		case relayServeCmd:
			relayServeMain(os.Args[2:])
		}
	}
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: vertal-agent serve [--deadline unix-seconds] [--home dir]")
		fmt.Fprintln(os.Stderr, "       vertal-agent relay --socket path --port n -- program [arg...]")
		os.Exit(2)
	}
	fl := flag.NewFlagSet("serve", flag.ExitOnError)
	deadline := fl.Int64("deadline", 0, "unix time (seconds) at which to kill everything and exit; 0 for none")
	home := fl.String("home", "", "home directory (default /home/user)")
	fd := fl.Int("fd", -1, "speak the protocol over this descriptor (a socket) instead of stdin and stdout")
	connect := fl.String("connect", "", "speak the protocol over a connection to this unix socket instead of stdin and stdout")
	fl.Parse(os.Args[2:])

	logger := log.New(os.Stderr, "vertal-agent: ", log.LstdFlags)
	// The agent runs as the sandbox's uid, like the code it serves, so
	// that code could otherwise open /proc/<agent>/fd/0 and fd/1 and read
	// or forge the host's protocol frames, or ptrace the agent. A process
	// that is not dumpable has its /proc entries owned by root and cannot
	// be traced by a peer without CAP_SYS_PTRACE; the commands it spawns
	// are dumpable again from their execve, as any program.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		logger.Printf("making the agent not dumpable: %v", err)
		os.Exit(1)
	}
	spareThreads(8)
	opts := &agent.ServeOptions{Home: *home, Subreaper: os.Getpid() != 1, Logf: logger.Printf}
	if *deadline > 0 {
		opts.Deadline = time.Unix(*deadline, 0)
	}
	// A write to a closed stdout is an error to handle, not a SIGPIPE to
	// die of (Notify, unlike Ignore, is not inherited by children).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	var conn io.ReadWriteCloser
	switch {
	case *connect != "":
		// The docker driver's socket under runc, bind-mounted for the
		// sandbox's uid; the host accepts this one connection and then
		// removes the socket. Go opens it close-on-exec.
		c, err := net.Dial("unix", *connect)
		if err != nil {
			logger.Printf("connecting to the host: %v", err)
			os.Exit(1)
		}
		conn = c
	case *fd >= 0:
		syscall.CloseOnExec(*fd) // not inherited by the commands it spawns
		conn = sockConn{r: *fd, w: *fd}
	default:
		conn = stdio()
	}
	if err := agent.Serve(ctx, conn, opts); err != nil {
		logger.Printf("%v", err)
		stop()
		os.Exit(1)
	}
}

// spareThreads makes the Go runtime start n OS threads now, which it then
// keeps idle: a fork bomb that fills the sandbox's pids limit later must
// not leave the agent unable to create the thread a blocking call needs
// (the runtime aborts when it cannot).
func spareThreads(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			runtime.LockOSThread() // this goroutine holds a thread of its own until release
			wg.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	wg.Wait()
	close(release)
}

// conn is stdin and stdout as one connection. Both are made non-blocking
// first so that closing them ends a read or write in progress.
type conn struct{ r, w *os.File }

func stdio() io.ReadWriteCloser {
	// Under the oci driver stdin and stdout are the host's socket (out
	// of the code's reach through /proc; under gVisor, fds 0 and 1 are
	// two imports of it): it is read and written with plain system
	// calls that wait in poll(2) on EAGAIN. Go's poller is not used for
	// it: under gVisor the imported socket did not always register, and
	// its reads then failed with EAGAIN.
	if _, err := unix.GetsockoptInt(0, unix.SOL_SOCKET, unix.SO_TYPE); err == nil {
		return sockConn{r: 0, w: 1}
	}
	syscall.SetNonblock(0, true)
	syscall.SetNonblock(1, true)
	return &conn{r: os.NewFile(0, "stdin"), w: os.NewFile(1, "stdout")}
}

// sockConn is the agent's socket: read from fd r, written to fd w.
type sockConn struct{ r, w int }

func wait(fd int, events int16) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			return
		}
	}
}

func (c sockConn) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(c.r, p)
		switch {
		case err == unix.EAGAIN:
			wait(c.r, unix.POLLIN)
		case err == unix.EINTR:
		case err != nil:
			return 0, &os.PathError{Op: "read", Path: "agent socket", Err: err}
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		default:
			return n, nil
		}
	}
}

func (c sockConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(c.w, p[done:])
		switch {
		case err == unix.EAGAIN:
			wait(c.w, unix.POLLOUT)
		case err == unix.EINTR:
		case err != nil:
			return done, &os.PathError{Op: "write", Path: "agent socket", Err: err}
		default:
			done += n
		}
	}
	return done, nil
}

// Close shuts the socket down rather than closing its fds: a read or
// poll in progress returns, and no later open can reuse fd 0 or 1 under
// it. The host sees the end of the stream.
func (c sockConn) Close() error {
	unix.Shutdown(c.w, unix.SHUT_RDWR)
	return unix.Shutdown(c.r, unix.SHUT_RDWR)
}

func (c *conn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *conn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *conn) Close() error {
	c.r.Close()
	return c.w.Close()
}
