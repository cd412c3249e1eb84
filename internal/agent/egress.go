package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Egress: a live sandbox has no network of its own (only lo); the host
// listens on a unix socket it mounts into the sandbox (engine.EgressSocket),
// and the agent relays TCP connections to 127.0.0.1:<port> (engine.EgressPort,
// the sandbox's HTTP proxy) to that socket, one unix connection for each.
// The relay runs until the agent exits. A one-shot sandbox, which has no
// agent serving, gets the same relay from `vertal-agent relay` (Relay).

const (
	// maxRelays bounds the relayed connections open at once; a connection
	// over it is closed at once.
	maxRelays = 256
	// relayDialTimeout bounds the connect(2) to the host's socket.
	relayDialTimeout = 10 * time.Second
)

// egress starts the relay: m.Path is the unix socket, m.Port the loopback
// port. One relay per agent: a second request is refused with ErrExist,
// as is a port something in the sandbox already listens on. The socket
// need not exist yet; each connection dials it anew.
func (s *server) egress(m *msg) {
	if m.Path == "" || !filepath.IsAbs(m.Path) {
		s.reply(errMsg(m.ID, fmt.Errorf("egress: socket %q: not an absolute path: %w", m.Path, ErrInvalid)))
		return
	}
	if m.Port <= 0 || m.Port > 65535 {
		s.reply(errMsg(m.ID, fmt.Errorf("egress: port %d: %w", m.Port, ErrInvalid)))
		return
	}
	s.mu.Lock()
	if s.egressPort != 0 {
		port := s.egressPort
		s.mu.Unlock()
		s.reply(errMsg(m.ID, fmt.Errorf("egress: already relaying 127.0.0.1:%d: %w", port, ErrExist)))
		return
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(m.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.mu.Unlock()
		if errors.Is(err, syscall.EADDRINUSE) {
			err = fmt.Errorf("%v: %w", err, ErrExist)
		}
		s.reply(errMsg(m.ID, fmt.Errorf("egress: %w", err)))
		return
	}
	s.egressPort = m.Port
	s.mu.Unlock()
	// The end of the agent closes the listener, which ends relayLoop.
	stop := context.AfterFunc(s.ctx, func() { ln.Close() })
	defer stop()
	s.ok(m.ID)
	relayLoop(s.ctx, []*net.TCPListener{ln.(*net.TCPListener)}, m.Path, s.logf)
}

// relayLoop accepts connections on each of lns until it is closed and
// relays each to the unix socket at path, at most maxRelays at once over
// all of lns; it returns once every listener is closed and every relay
// has ended. The end of ctx ends the relays in progress (the caller
// closes the listeners). It serves both the egress op and the relay
// command (Relay).
func relayLoop(ctx context.Context, lns []*net.TCPListener, path string, logf func(string, ...any)) {
	r := &relayer{ctx: ctx, path: path, logf: logf, slots: make(chan struct{}, maxRelays)}
	if r.logf == nil {
		r.logf = func(string, ...any) {}
	}
	var loops sync.WaitGroup
	for _, ln := range lns {
		loops.Add(1)
		go func() {
			defer loops.Done()
			r.accept(ln)
		}()
	}
	loops.Wait()
	r.wg.Wait()
}

// relayer is the relays of one relayLoop.
type relayer struct {
	ctx   context.Context
	path  string
	logf  func(string, ...any)
	slots chan struct{} // one for each relay open, up to maxRelays
	full  atomic.Bool   // logged once each time the relays fill up
	wg    sync.WaitGroup
}

// accept accepts connections until ln is closed, relaying each in a
// goroutine of its own (r.wg); it closes ln.
func (r *relayer) accept(ln *net.TCPListener) {
	defer ln.Close()
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if r.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				r.logf("agent: egress: accept: %v", err)
			}
			var ne net.Error
			if (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors: wait for relays to end.
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return
		}
		select {
		case r.slots <- struct{}{}:
			r.full.Store(false)
		default:
			if !r.full.Swap(true) {
				r.logf("agent: egress: %d connections relayed already, closing new ones", maxRelays)
			}
			c.Close()
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.slots }()
			r.relay(c)
		}()
	}
}

// relay copies between c and a new connection to the unix socket at
// r.path, both ways, passing each side's end of stream on as a
// half-close, and closes both once both directions are done (or one
// failed, or r.ctx ends).
func (r *relayer) relay(c *net.TCPConn) {
	defer c.Close()
	d := net.Dialer{Timeout: relayDialTimeout}
	uc, err := d.DialContext(r.ctx, "unix", r.path)
	if err != nil {
		r.logf("agent: egress: %v", err)
		return
	}
	u := uc.(*net.UnixConn)
	defer u.Close()
	stop := context.AfterFunc(r.ctx, func() { c.Close(); u.Close() })
	defer stop()
	errc := make(chan error, 2)
	go func() { errc <- pipe(u, c) }()
	go func() { errc <- pipe(c, u) }()
	for range 2 {
		if err := <-errc; err != nil {
			// A reset or a failed write: the other direction would wait
			// for ever; closing both ends it.
			c.Close()
			u.Close()
		}
	}
}

// halfCloser is a connection whose writing side can be shut alone.
type halfCloser interface {
	io.Writer
	CloseWrite() error
}

// pipe copies src to dst until src's end, which it passes on as dst's
// half-close; the error is the copy's (nil at a clean end).
func pipe(dst halfCloser, src io.Reader) error {
	_, err := io.Copy(dst, src)
	if err != nil {
		return err
	}
	return dst.CloseWrite()
}
