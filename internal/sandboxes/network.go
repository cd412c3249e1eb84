package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// A sandbox's network (docs/SECURITY.md, "Egress"). A sandbox keeps its
// network namespace without interfaces but lo whatever its plan; one
// whose plan (narrowed by its create) allows egress gets an
// egress.Proxy of its own, served by this process on a unix socket in a
// per-sandbox host directory that the driver mounts read-only at
// engine.EgressDir. Inside, the agent relays 127.0.0.1:engine.EgressPort
// to that socket, and HTTP_PROXY and HTTPS_PROXY name it. Nothing else
// leaves: no route, no DNS (the proxy resolves names), no UDP.
//
// A pre-started sandbox has the empty directory and no proxy; the
// create that takes it starts its proxy with the create's own policy
// before handing it over (adopt), so the warm pool never carries one
// tenant's network to another.

// EgressOptions turn egress on for the plans that allow it.
type EgressOptions struct {
	// Dir holds one directory per live sandbox of this node (the socket's).
	Dir string
	// Guard refuses the addresses no sandbox may reach, whatever its
	// allowlist (private, loopback, link-local, metadata, CGNAT,
	// multicast, the server's own networks).
	Guard *webhook.Guard
	// Resolver resolves allowed names; nil is net.DefaultResolver.
	Resolver webhook.Resolver
	// HTTPPorts and TLSPorts are the ports plain HTTP and TLS may reach
	// (default 80 and 443).
	HTTPPorts, TLSPorts []int
}

// Network is limits.network: what a sandbox may reach.
type Network struct {
	Allow    []string `json:"allow"`
	MaxBytes int64    `json:"max_bytes"`
}

// NetworkRequest is a create's "network": the allowlist it asks for,
// which must be within its plan's. Nil Allow with a non-nil request is no
// network.
type NetworkRequest struct {
	Allow []string `json:"allow"`
}

// NetworkUsage is a running sandbox's traffic in its current live
// period: the bytes of its closed connections and its last attempts.
type NetworkUsage struct {
	BytesIn     int64            `json:"bytes_in"`
	BytesOut    int64            `json:"bytes_out"`
	Connections int64            `json:"connections"`
	Refused     int64            `json:"refused"`
	Attempts    []egress.Attempt `json:"attempts"`
}

// maxAttempts is how many connection attempts a sandbox's view keeps
// (the newest); the logs keep every one, up to logRate.
const maxAttempts = 100

// Connections to the proxies held at once: maxBoxConns for one sandbox
// (the agent's relay holds at most 256, but code can open the socket
// itself), maxEgressConns for the node's sandboxes together. Past them a
// connection waits in the socket's backlog until one ends. Each costs the
// server a file and a few goroutines.
const (
	maxBoxConns    = 256
	maxEgressConns = 4096
)

// logRate bounds the egress log lines of one sandbox (a second, with a
// burst of logBurst): past it attempts are still counted and kept in its
// view, and the next line says how many were not logged.
const (
	logRate  = 20
	logBurst = 200
)

// networkFor is the network a create on p asking for r gets: the plan's
// when r is nil, r's allowlist when the plan covers it, else a 403.
func networkFor(p config.Plan, r *NetworkRequest) (*Network, error) {
	pol := p.EgressPolicy()
	if r == nil {
		if !pol.Enabled() {
			return nil, nil
		}
		return &Network{Allow: pol.Strings(), MaxBytes: pol.MaxBytes}, nil
	}
	if len(r.Allow) == 0 {
		return nil, nil
	}
	if !pol.Enabled() {
		return nil, execution.Errorf(execution.KindForbidden, "your plan allows no network; leave network out")
	}
	n, err := pol.Narrow(r.Allow)
	if errors.Is(err, egress.ErrWiden) {
		return nil, execution.Errorf(execution.KindForbidden, "network.allow names what your plan does not allow (%s); your plan allows %q", strings.TrimPrefix(err.Error(), egress.ErrWiden.Error()+": "), pol.Strings())
	}
	if err != nil {
		return nil, execution.Errorf(execution.KindInvalidRequest, "network.allow: %v", err)
	}
	return &Network{Allow: n.Strings(), MaxBytes: n.MaxBytes}, nil
}

// boxNet is one live sandbox's proxy and what it saw.
type boxNet struct {
	srv      *http.Server
	proxy    *egress.Proxy
	logs     *rate.Limiter
	unlogged atomic.Int64

	in, out, conns, refused atomic.Int64

	mu       sync.Mutex
	attempts []egress.Attempt
}

func (n *boxNet) usage() *NetworkUsage {
	n.mu.Lock()
	defer n.mu.Unlock()
	return &NetworkUsage{BytesIn: n.in.Load(), BytesOut: n.out.Load(), Connections: n.conns.Load(), Refused: n.refused.Load(),
		Attempts: append([]egress.Attempt{}, n.attempts...)}
}

// egressDir is the host directory of sandbox id's socket; "" without
// egress.
func (s *Service) egressDir(id string) string {
	if s.opts.Egress == nil {
		return ""
	}
	return filepath.Join(s.opts.Egress.Dir, id)
}

// reapEgress removes the socket directories a stopped server left.
func (s *Service) reapEgress() error {
	if s.opts.Egress == nil {
		return nil
	}
	if err := os.RemoveAll(s.opts.Egress.Dir); err != nil {
		return err
	}
	return os.MkdirAll(s.opts.Egress.Dir, 0o755)
}

// openNetwork starts b's proxy with network nw and has the agent relay to
// it; the caller then sets the proxy environment (proxyEnv).
func (s *Service) openNetwork(ctx context.Context, b *box, id, tenant string, nw *Network) error {
	if s.opts.Egress == nil {
		return errors.New("this server has no egress directory")
	}
	pol, err := egress.Parse(nw.Allow, nw.MaxBytes)
	if err != nil {
		return err
	}
	n := &boxNet{logs: rate.NewLimiter(logRate, logBurst)}
	log := s.log.With("sandbox_id", id, "tenant", tenant)
	proxy, err := egress.NewProxy(egress.Options{Policy: pol, Guard: s.opts.Egress.Guard, Resolver: s.opts.Egress.Resolver,
		HTTPPorts: s.opts.Egress.HTTPPorts, TLSPorts: s.opts.Egress.TLSPorts,
		Log: func(a egress.Attempt) { s.recordAttempt(n, log, a) }})
	if err != nil {
		return err
	}
	ln, err := listenUnix(s.egressDir(id), filepath.Base(engine.EgressSocket))
	if err != nil {
		return fmt.Errorf("the egress socket: %w", err)
	}
	ln = &limitListener{Listener: ln, box: make(chan struct{}, maxBoxConns), node: s.egressSlots, closed: make(chan struct{})}
	n.proxy = proxy
	n.srv = &http.Server{Handler: proxy, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	go n.srv.Serve(ln)
	b.net = n
	if err := b.ag.Egress(ctx, engine.EgressSocket, engine.EgressPort); err != nil {
		return fmt.Errorf("starting the agent's relay: %w", err)
	}
	return nil
}

// listenUnix listens on dir/name, reachable by any uid (the sandbox's),
// through a short path: a socket's path is limited to 108 bytes, a data
// directory's is not.
func listenUnix(dir, name string) (net.Listener, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	short := "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + name
	ln, err := net.Listen("unix", short)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(filepath.Join(dir, name), 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// closeNetwork cuts b's connections and removes its socket directory.
func (s *Service) closeNetwork(id string, b *box) {
	if n := b.net; n != nil {
		n.proxy.Close()
		n.srv.Close()
	}
	if dir := s.egressDir(id); dir != "" {
		if err := os.RemoveAll(dir); err != nil {
			s.log.Error("removing a sandbox's egress directory", "sandbox_id", id, "error", err)
		}
	}
}

func (s *Service) recordAttempt(n *boxNet, log *slog.Logger, a egress.Attempt) {
	if a.Allowed {
		n.conns.Add(1)
		s.egressConns.Add(1)
	} else {
		n.refused.Add(1)
		s.egressRefused.Add(1)
	}
	n.in.Add(a.BytesIn)
	n.out.Add(a.BytesOut)
	s.egressIn.Add(a.BytesIn)
	s.egressOut.Add(a.BytesOut)
	n.mu.Lock()
	if len(n.attempts) == maxAttempts {
		n.attempts = append(n.attempts[:0], n.attempts[1:]...)
	}
	n.attempts = append(n.attempts, a)
	n.mu.Unlock()
	if !n.logs.Allow() {
		n.unlogged.Add(1)
		return
	}
	args := []any{"host", a.Host, "port", a.Port, "kind", a.Kind, "allowed", a.Allowed, "reason", a.Reason,
		"addr", a.Addr, "bytes_in", a.BytesIn, "bytes_out", a.BytesOut}
	if k := n.unlogged.Swap(0); k > 0 {
		args = append(args, "unlogged_before", k)
	}
	log.Info("egress", args...)
}

// limitListener accepts a connection once both its sandbox (box) and the
// node (node) have a slot for it; the connection gives them back when it
// closes.
type limitListener struct {
	net.Listener
	box, node chan struct{}
	once      sync.Once
	closed    chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.box <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	select {
	case l.node <- struct{}{}:
	case <-l.closed:
		<-l.box
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.node
		<-l.box
		return nil, err
	}
	return &slotConn{Conn: c, release: func() { <-l.node; <-l.box }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
