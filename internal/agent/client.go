// Package agent is the small program that runs inside a sandbox that
// stays, as the sandbox's own uid, and the host's client for it.
//
// Host and agent speak one multiplexed protocol over any byte stream (the
// sandbox's stdio today, a vsock later): length-prefixed frames, each a
// JSON message with a request id, so that many commands and file
// transfers share one connection. The agent spawns processes (each in a
// process group of its own), relays their stdin, output and signals,
// reaps every child (it may be PID 1), does file operations with its own
// (the sandbox user's) permissions inside the sandbox's mount namespace,
// archives and restores the home directory, relays the sandbox's proxy
// port to the host's egress socket (egress.go), and ends everything at
// its deadline. The protocol leaves room for code contexts (long-lived
// interpreters), which a later change adds.
//
// This file is the host's side (the contract the host is written
// against); protocol.go has the wire format, server.go the agent's side.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"syscall"
	"time"
)

// Errors a Client returns for what the agent refused; they wrap the
// fs errors where one fits, so errors.Is(err, fs.ErrNotExist) works.
var (
	ErrNotExist   = fs.ErrNotExist
	ErrPermission = fs.ErrPermission
	ErrExist      = fs.ErrExist
	ErrIsDir      = errors.New("agent: is a directory")
	ErrNotDir     = errors.New("agent: not a directory")
	ErrTooLarge   = errors.New("agent: over the size cap")
	ErrInvalid    = errors.New("agent: invalid request")
	ErrNoProcess  = errors.New("agent: no such process")
	ErrExited     = errors.New("agent: the process has exited")
	ErrReadOnly   = errors.New("agent: read-only file system")
	ErrAgain      = errors.New("agent: no room for another process (the sandbox's process limit)")
	ErrClosed     = errors.New("agent: connection closed")
)

// SpawnRequest starts one command.
type SpawnRequest struct {
	Argv []string          // argv[0] is looked up in PATH
	Cwd  string            // default HomeDir
	Env  map[string]string // added to the agent's environment
	// Stdin keeps the process's stdin a pipe the host writes to
	// (Process.Write, CloseStdin); otherwise it is /dev/null.
	Stdin bool
}

// Stream of an Event: 1 stdout, 2 stderr (as engine.Stream).
type Stream int

// Event is what a process reports: output, then exactly one exit.
type Event struct {
	Stream Stream // 1 or 2 for output; 0 for the exit event
	Data   []byte
	// Exit (when Stream is 0): the exit code, or 128+signal when killed.
	ExitCode int
	Signal   int // the signal that killed it, 0 if none
}

// Process is one spawned command.
type Process interface {
	PID() int
	// Events delivers output chunks in order, then the exit event, then is
	// closed. A reader that falls behind blocks that process's output (and
	// only that process's) until it reads.
	Events() <-chan Event
	Write(ctx context.Context, p []byte) error
	CloseStdin(ctx context.Context) error
	// Signal signals the process's group. ErrExited after its exit.
	Signal(ctx context.Context, sig syscall.Signal) error
}

// FileInfo describes one file as the agent sees it (Lstat: a symlink is
// reported as such and never followed by List).
type FileInfo struct {
	Name    string      `json:"name"`
	Type    string      `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"` // permission bits
	ModTime time.Time   `json:"mtime"`
}

// Client is the host's side of one agent connection. It is safe for
// concurrent use.
type Client struct {
	conn io.ReadWriteCloser
	wmu  sync.Mutex // serialises frame writes

	mu     sync.Mutex
	next   uint64
	calls  map[uint64]chan *msg
	closed chan struct{}
	once   sync.Once

	stuck     chan struct{} // closed at the first ErrUnresponsive
	stuckOnce sync.Once
}

// Unresponsive is closed the first time a reply does not come within
// ReplyTimeout: the agent is stopped (code can SIGSTOP it) or hung, and
// every later call would wait as long.
func (c *Client) Unresponsive() <-chan struct{} { return c.stuck }

// NewClient speaks the protocol over conn (the sandbox's Live.Conn).
func NewClient(conn io.ReadWriteCloser) *Client {
	c := &Client{conn: conn, calls: map[uint64]chan *msg{}, closed: make(chan struct{}), stuck: make(chan struct{})}
	go c.readLoop()
	return c
}

func (c *Client) readLoop() {
	defer c.Close()
	for {
		m := new(msg)
		if err := readFrame(c.conn, m); err != nil {
			return
		}
		c.mu.Lock()
		ch := c.calls[m.ID]
		c.mu.Unlock()
		if ch == nil {
			continue // abandoned
		}
		select {
		case ch <- m:
		default:
			return // the agent sent past its window: a broken peer
		}
	}
}

// start registers a new request with room for buf frames and sends it.
func (c *Client) start(m *msg, buf int) (chan *msg, error) {
	ch := make(chan *msg, buf)
	c.mu.Lock()
	c.next++
	m.ID = c.next
	c.calls[m.ID] = ch
	c.mu.Unlock()
	if err := c.send(m); err != nil {
		c.end(m.ID)
		return nil, err
	}
	return ch, nil
}

func (c *Client) end(id uint64) {
	c.mu.Lock()
	delete(c.calls, id)
	c.mu.Unlock()
}

func (c *Client) send(m *msg) error {
	buf, err := encodeFrame(m)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.closed:
		return ErrClosed
	default:
	}
	if _, err := c.conn.Write(buf); err != nil {
		c.Close()
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return nil
}

// ReplyTimeout bounds how long the client waits for the agent's next
// frame of a reply (a request's answer, a download's next chunk): code
// in the sandbox can stop its agent (SIGSTOP, same uid), and no host
// call, lock or slot may wait on it for ever. A process's output has no
// such bound: a command may be silent for as long as it runs.
const ReplyTimeout = 30 * time.Second

// ErrUnresponsive is a reply that did not come within ReplyTimeout.
var ErrUnresponsive = errors.New("agent: no answer within the reply timeout (the agent is stopped or hung)")

// recv is the next frame of a request; frames already received are
// delivered even after the connection closed.
func (c *Client) recv(ctx context.Context, ch chan *msg) (*msg, error) {
	return c.recvWithin(ctx, ch, ReplyTimeout)
}

// recvWithin is recv with its own bound; 0 waits as long as ctx.
func (c *Client) recvWithin(ctx context.Context, ch chan *msg, within time.Duration) (*msg, error) {
	var timeout <-chan time.Time
	if within > 0 {
		t := time.NewTimer(within)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case m := <-ch:
		return m, nil
	case <-timeout:
		c.stuckOnce.Do(func() { close(c.stuck) })
		return nil, ErrUnresponsive
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		select {
		case m := <-ch:
			return m, nil
		default:
			return nil, ErrClosed
		}
	}
}

// call is one request and its one reply.
func (c *Client) call(ctx context.Context, m *msg) (*msg, error) {
	ch, err := c.start(m, 1)
	if err != nil {
		return nil, err
	}
	defer c.end(m.ID)
	r, err := c.recv(ctx, ch)
	if err != nil {
		return nil, err
	}
	if r.Op == "err" {
		return nil, errorOf(r)
	}
	return r, nil
}

// Ping round-trips once: the agent is up.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, &msg{Op: "ping"})
	return err
}

// Spawn starts a command.
func (c *Client) Spawn(ctx context.Context, r SpawnRequest) (Process, error) {
	m := &msg{Op: "spawn", Argv: r.Argv, Cwd: r.Cwd, Env: r.Env, Stdin: r.Stdin}
	// Room for the reply, a window of output and the exit.
	ch, err := c.start(m, window+2)
	if err != nil {
		return nil, err
	}
	rep, err := c.recv(ctx, ch)
	if err == nil && rep.Op == "err" {
		err = errorOf(rep)
	}
	if err != nil {
		c.end(m.ID)
		if ctx.Err() != nil {
			// It may have started; end it rather than leave it unseen.
			c.send(&msg{Op: "signal", Ref: m.ID, Signal: int(syscall.SIGKILL)})
		}
		return nil, err
	}
	p := &process{c: c, id: m.ID, pid: rep.PID, stdin: r.Stdin, events: make(chan Event, 4), exited: make(chan struct{})}
	go p.forward(ch)
	return p, nil
}

// process is a Process over a Client.
type process struct {
	c      *Client
	id     uint64
	pid    int
	stdin  bool
	events chan Event
	exited chan struct{} // closed at the exit event
	wmu    sync.Mutex    // one stdin chunk in flight
}

// forward moves the agent's frames to Events, acking each output chunk
// once Events has taken it. It blocks only on this process's reader. If
// the connection ends first, Events closes without an exit event.
func (p *process) forward(ch chan *msg) {
	defer close(p.events)
	defer p.c.end(p.id)
	for {
		m, err := p.c.recvWithin(context.Background(), ch, 0)
		if err != nil {
			return
		}
		switch m.Op {
		case "out":
			p.events <- Event{Stream: Stream(m.Stream), Data: m.Data}
			p.c.send(&msg{Op: "ack", Ref: p.id, N: 1})
		case "exit":
			close(p.exited)
			p.events <- Event{ExitCode: m.Code, Signal: m.Signal}
			return
		}
	}
}

func (p *process) PID() int             { return p.pid }
func (p *process) Events() <-chan Event { return p.events }

func (p *process) Write(ctx context.Context, b []byte) error {
	if !p.stdin {
		return fmt.Errorf("process %d has no stdin pipe: %w", p.pid, ErrInvalid)
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	for len(b) > 0 {
		n := min(len(b), chunkSize)
		if _, err := p.c.call(ctx, &msg{Op: "chunk", Ref: p.id, Data: b[:n]}); err != nil {
			return p.gone(err)
		}
		b = b[n:]
	}
	return nil
}

func (p *process) CloseStdin(ctx context.Context) error {
	if !p.stdin {
		return nil
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, err := p.c.call(ctx, &msg{Op: "chunk", Ref: p.id, EOF: true})
	return p.gone(err)
}

func (p *process) Signal(ctx context.Context, sig syscall.Signal) error {
	select {
	case <-p.exited:
		return ErrExited
	default:
	}
	_, err := p.c.call(ctx, &msg{Op: "signal", Ref: p.id, Signal: int(sig)})
	return p.gone(err)
}

// gone is ErrExited for a refusal that means the process has ended.
func (p *process) gone(err error) error {
	if err != nil && (errors.Is(err, ErrNoProcess) || errors.Is(err, ErrInvalid)) {
		select {
		case <-p.exited:
			return ErrExited
		default:
		}
		if errors.Is(err, ErrNoProcess) {
			return ErrExited
		}
	}
	return err
}

// Stat describes path (Lstat).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	r, err := c.call(ctx, &msg{Op: "stat", Path: path})
	if err != nil || r.Info == nil {
		if err == nil {
			err = fmt.Errorf("stat %s: no answer: %w", path, ErrInvalid)
		}
		return FileInfo{}, err
	}
	return *r.Info, nil
}

// List lists a directory, sorted by name.
func (c *Client) List(ctx context.Context, dir string) ([]FileInfo, error) {
	r, err := c.call(ctx, &msg{Op: "list", Path: dir})
	if err != nil {
		return nil, err
	}
	if r.Files == nil {
		return []FileInfo{}, nil
	}
	return r.Files, nil
}

// download runs a request whose answer is a data stream copied to w,
// at most max bytes of it. The agent is asked to stop at max too, but the
// agent shares its sandbox with the code, which can forge its frames
// (docs/SANDBOXES.md, "What the host trusts"): the cap holds here, on
// the host, whatever arrives.
func (c *Client) download(ctx context.Context, m *msg, w io.Writer) (int64, error) {
	max := m.Max
	ch, err := c.start(m, window+2)
	if err != nil {
		return 0, err
	}
	defer c.end(m.ID)
	var n int64
	for {
		r, err := c.recv(ctx, ch)
		if err != nil {
			c.send(&msg{Op: "cancel", Ref: m.ID})
			return n, err
		}
		switch r.Op {
		case "data":
			if int64(len(r.Data)) > max-n {
				c.send(&msg{Op: "cancel", Ref: m.ID})
				return n, fmt.Errorf("over %d bytes: %w", max, ErrTooLarge)
			}
			k, err := w.Write(r.Data)
			n += int64(k)
			if err != nil {
				c.send(&msg{Op: "cancel", Ref: m.ID})
				return n, err
			}
			c.send(&msg{Op: "ack", Ref: m.ID, N: 1})
		case "done":
			return n, nil
		case "err":
			return n, errorOf(r)
		}
	}
}

// ReadFile copies a regular file to w; more than max bytes is ErrTooLarge
// (nothing past max is sent). Opening follows symlinks as the kernel does
// inside the sandbox; a FIFO or device is ErrInvalid, never opened.
func (c *Client) ReadFile(ctx context.Context, path string, max int64, w io.Writer) (int64, error) {
	return c.download(ctx, &msg{Op: "readfile", Path: path, Max: max}, w)
}

// upload runs a request that opens a transfer, then sends r in chunks
// (stopping with ErrTooLarge past max), then the end.
func (c *Client) upload(ctx context.Context, m *msg, r io.Reader, max int64) (int64, error) {
	open, err := c.call(ctx, m)
	if err != nil {
		return 0, err
	}
	ref := open.ID
	buf := make([]byte, chunkSize)
	var n int64
	for {
		k, rerr := r.Read(buf)
		if k > 0 {
			if n+int64(k) > max {
				// Sent anyway: the agent refuses it at the same cap and
				// removes the partial file before it answers, so nothing of
				// it is left when this returns. A cancel stops an agent
				// that did not refuse it.
				if _, err := c.call(ctx, &msg{Op: "chunk", Ref: ref, Data: buf[:k]}); err == nil {
					c.send(&msg{Op: "cancel", Ref: ref})
				}
				return n, fmt.Errorf("over %d bytes: %w", max, ErrTooLarge)
			}
			if _, err := c.call(ctx, &msg{Op: "chunk", Ref: ref, Data: buf[:k]}); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			c.send(&msg{Op: "cancel", Ref: ref})
			return n, rerr
		}
	}
	if _, err := c.call(ctx, &msg{Op: "chunk", Ref: ref, EOF: true}); err != nil {
		return n, err
	}
	return n, nil
}

// WriteFile creates or replaces path with r's bytes (parents created),
// refusing more than max bytes with ErrTooLarge and removing the partial
// file. mode 0 means 0644.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, max int64, mode fs.FileMode) (int64, error) {
	return c.upload(ctx, &msg{Op: "write", Path: path, Max: max, Mode: uint32(mode.Perm())}, r, max)
}

// Remove removes path (a directory with everything in it); a path that
// does not exist is ErrNotExist.
func (c *Client) Remove(ctx context.Context, path string) error {
	_, err := c.call(ctx, &msg{Op: "remove", Path: path})
	return err
}

// Mkdir makes a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, path string) error {
	_, err := c.call(ctx, &msg{Op: "mkdir", Path: path})
	return err
}

// Move renames from to to (rename(2) semantics within the sandbox).
func (c *Client) Move(ctx context.Context, from, to string) error {
	_, err := c.call(ctx, &msg{Op: "move", Path: from, To: to})
	return err
}

// SaveHome writes a tar archive of HomeDir (regular files, directories
// and symlinks, with modes and times; nothing else) to w, refusing more
// than max bytes with ErrTooLarge.
func (c *Client) SaveHome(ctx context.Context, max int64, w io.Writer) (int64, error) {
	return c.download(ctx, &msg{Op: "save", Max: max}, w)
}

// RestoreHome unpacks a SaveHome archive into HomeDir; entries that would
// land outside it are refused with ErrInvalid.
func (c *Client) RestoreHome(ctx context.Context, r io.Reader) error {
	_, err := c.upload(ctx, &msg{Op: "restore"}, r, 1<<62)
	return err
}

// SetDeadline moves the agent's deadline, at which it kills every
// process and exits.
func (c *Client) SetDeadline(ctx context.Context, t time.Time) error {
	if t.IsZero() {
		return fmt.Errorf("zero deadline: %w", ErrInvalid)
	}
	_, err := c.call(ctx, &msg{Op: "deadline", Deadline: t.UnixNano()})
	return err
}

// SetEnv sets the sandbox's environment, the base of every process
// started from then on: over the agent's own environment, under a
// spawn's own entries. The caller leaves out what it must not change.
// Each call replaces the last.
func (c *Client) SetEnv(ctx context.Context, env map[string]string) error {
	if env == nil {
		env = map[string]string{}
	}
	_, err := c.call(ctx, &msg{Op: "env", Env: env})
	return err
}

// Egress has the agent relay every TCP connection to 127.0.0.1:port
// inside the sandbox (engine.EgressPort) to the unix socket at socketPath
// (engine.EgressSocket), until the agent exits. The socket need not exist
// yet: each connection dials it anew, and one that cannot reach it is
// closed. At most 256 connections are relayed at once. A second call, or
// a port already taken in the sandbox, is refused with ErrExist.
func (c *Client) Egress(ctx context.Context, socketPath string, port int) error {
	if socketPath == "" || port <= 0 || port > 65535 {
		return fmt.Errorf("egress to %q on port %d: %w", socketPath, port, ErrInvalid)
	}
	_, err := c.call(ctx, &msg{Op: "egress", Path: socketPath, Port: port})
	return err
}

// Close ends the connection; the agent then ends every process and exits.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		err = c.conn.Close()
		close(c.closed)
	})
	return err
}
