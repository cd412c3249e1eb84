package egress

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// A Host serves the proxies of one node's sandboxes, one-shot and live
// alike: each sandbox with egress gets a Box, an egress.Proxy of its own
// with its own policy, served by this process on a unix socket in a
// directory of its own (Host.Dir) that the driver mounts read-only into
// the sandbox (engine.EgressDir). Inside, the agent relays
// 127.0.0.1:engine.EgressPort to that socket. Nothing else leaves: no
// route, no DNS (the proxy resolves names), no UDP.

// HostOptions configure a node's egress.
type HostOptions struct {
	// Dir holds one directory per sandbox of this node (its socket's).
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

// Usage is a sandbox's traffic: the bytes of its closed connections
// (from the sandbox: out; to it: in), the connections allowed and
// refused, and its last attempts (MaxAttempts, the newest).
type Usage struct {
	BytesIn     int64     `json:"bytes_in"`
	BytesOut    int64     `json:"bytes_out"`
	Connections int64     `json:"connections"`
	Refused     int64     `json:"refused"`
	Attempts    []Attempt `json:"attempts"`
}

// MaxAttempts is how many connection attempts a Box keeps (the newest);
// the logs keep every one, up to logRate.
const MaxAttempts = 100

// Connections to the proxies held at once: MaxBoxConns for one sandbox
// (the agent's relay holds at most 256, but code can open the socket
// itself), maxHostConns for the node's sandboxes together. Past them a
// connection waits in the socket's backlog until one ends. Each costs the
// server a file and a few goroutines.
const (
	MaxBoxConns  = 256
	maxHostConns = 4096
)

// logRate bounds the egress log lines of one sandbox (a second, with a
// burst of logBurst): past it attempts are still counted and kept in its
// Usage, and the next line says how many were not logged.
const (
	logRate  = 20
	logBurst = 200
)

// Host is a node's egress: its sandboxes' boxes and the node's totals.
type Host struct {
	opts  HostOptions
	slots chan struct{}

	conns, refused, in, out atomic.Int64
}

// NewHost returns the egress of a node; Reap prepares its directory.
func NewHost(opts HostOptions) (*Host, error) {
	if opts.Dir == "" || !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("egress: directory %q is not absolute", opts.Dir)
	}
	if opts.Guard == nil {
		return nil, errors.New("egress: a Host needs a Guard")
	}
	return &Host{opts: opts, slots: make(chan struct{}, maxHostConns)}, nil
}

// Dir is the host directory of sandbox id's socket.
func (h *Host) Dir(id string) string { return filepath.Join(h.opts.Dir, id) }

// Reap removes the socket directories a stopped server left and makes
// the node's directory anew, 0700: no user of the host but root may
// find or reach a sandbox's socket (a sandbox reaches its own through
// the driver's bind mount, never through these parents). Call it before
// the first Open, and only on a directory of this node's alone.
func (h *Host) Reap() error {
	if err := os.RemoveAll(h.opts.Dir); err != nil {
		return err
	}
	if err := os.MkdirAll(h.opts.Dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(h.opts.Dir, 0o700)
}

// Totals are the node's egress since it started, for its metrics.
type Totals struct {
	Connections, Refused, BytesIn, BytesOut int64
}

// Totals returns the node's totals so far.
func (h *Host) Totals() Totals {
	return Totals{Connections: h.conns.Load(), Refused: h.refused.Load(), BytesIn: h.in.Load(), BytesOut: h.out.Load()}
}

// WriteMetrics writes the node's egress series in the Prometheus text
// format (api.MetricsWriter).
func (h *Host) WriteMetrics(w io.Writer) {
	t := h.Totals()
	for _, m := range []struct {
		name, help string
		val        int64
	}{
		{"vertal_egress_connections_total", "Connections sandboxes made through their egress proxies.", t.Connections},
		{"vertal_egress_refused_total", "Connections the egress proxies refused (not allowed, a guarded address, not TLS...).", t.Refused},
		{"vertal_egress_bytes_in_total", "Bytes the egress proxies carried to sandboxes.", t.BytesIn},
		{"vertal_egress_bytes_out_total", "Bytes the egress proxies carried from sandboxes.", t.BytesOut},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", m.name, m.help, m.name, m.name, m.val)
	}
}

// Box is one sandbox's proxy and what it saw.
type Box struct {
	h        *Host
	id       string
	srv      *http.Server
	proxy    *Proxy
	log      *slog.Logger
	logs     *rate.Limiter
	unlogged atomic.Int64

	in, out, conns, refused atomic.Int64
	active                  atomic.Int64 // requests being served

	mu       sync.Mutex
	attempts []Attempt
}

// Open starts sandbox id's proxy with policy pol on the socket
// engine.EgressSocket names, in Dir(id), which it creates. log gets an
// "egress" line for each attempt (rate-limited) and says which sandbox
// and tenant it is.
func (h *Host) Open(id string, pol Policy, log *slog.Logger) (*Box, error) {
	b := &Box{h: h, id: id, log: log, logs: rate.NewLimiter(logRate, logBurst)}
	proxy, err := NewProxy(Options{Policy: pol, Guard: h.opts.Guard, Resolver: h.opts.Resolver,
		HTTPPorts: h.opts.HTTPPorts, TLSPorts: h.opts.TLSPorts, Log: b.record})
	if err != nil {
		return nil, err
	}
	ln, err := listenUnix(h.Dir(id), SocketName)
	if err != nil {
		os.RemoveAll(h.Dir(id))
		return nil, fmt.Errorf("the egress socket: %w", err)
	}
	b.proxy = proxy
	serve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.active.Add(1)
		defer b.active.Add(-1)
		proxy.ServeHTTP(w, r)
	})
	b.srv = &http.Server{Handler: serve, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go b.srv.Serve(&limitListener{Listener: ln, box: make(chan struct{}, MaxBoxConns), node: h.slots, closed: make(chan struct{})})
	return b, nil
}

// SocketName is the name of a sandbox's socket in its directory (the
// base of engine.EgressSocket).
const SocketName = "proxy.sock"

// Close cuts the box's connections and removes its directory; safe on a
// nil Box and more than once. It waits (up to closeWait) for the requests
// being served to end, so that Usage then counts their bytes.
func (b *Box) Close() error {
	if b == nil {
		return nil
	}
	b.srv.Close()
	b.proxy.Close()
	for deadline := time.Now().Add(closeWait); b.active.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	return os.RemoveAll(b.h.Dir(b.id))
}

// closeWait bounds Close's wait for the requests it cut.
const closeWait = 2 * time.Second

// Usage is what the box saw so far.
func (b *Box) Usage() *Usage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &Usage{BytesIn: b.in.Load(), BytesOut: b.out.Load(), Connections: b.conns.Load(), Refused: b.refused.Load(),
		Attempts: append([]Attempt{}, b.attempts...)}
}

func (b *Box) record(a Attempt) {
	h := b.h
	if a.Allowed {
		b.conns.Add(1)
		h.conns.Add(1)
	} else {
		b.refused.Add(1)
		h.refused.Add(1)
	}
	b.in.Add(a.BytesIn)
	b.out.Add(a.BytesOut)
	h.in.Add(a.BytesIn)
	h.out.Add(a.BytesOut)
	b.mu.Lock()
	if len(b.attempts) == MaxAttempts {
		b.attempts = append(b.attempts[:0], b.attempts[1:]...)
	}
	b.attempts = append(b.attempts, a)
	b.mu.Unlock()
	if !b.logs.Allow() {
		b.unlogged.Add(1)
		return
	}
	args := []any{"host", a.Host, "port", a.Port, "kind", a.Kind, "allowed", a.Allowed, "reason", a.Reason,
		"addr", a.Addr, "bytes_in", a.BytesIn, "bytes_out", a.BytesOut}
	if k := b.unlogged.Swap(0); k > 0 {
		args = append(args, "unlogged_before", k)
	}
	b.log.Info("egress", args...)
}

// listenUnix listens on dir/name, reachable by any uid that can reach
// dir (the sandbox's, through its mount; Reap keeps everyone else out),
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
