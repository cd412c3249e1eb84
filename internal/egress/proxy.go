package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// Proxy is one sandbox's way out: an HTTP proxy that takes CONNECT for
// TLS (RFC 9110 §9.3.6) and absolute-form requests for plain HTTP, and
// decides each connection by its policy. It resolves the name itself,
// refuses it if any of its addresses is one the guard refuses (loopback,
// private, link-local, metadata, CGNAT, multicast, the server's own
// networks: DNS rebinding gains nothing), dials the address it checked,
// and checks it again at connect(2). Through CONNECT it reads the TLS
// ClientHello before relaying it, and refuses a connection whose SNI
// names another host than the one it asked for, or that is not TLS.
//
// It is safe for concurrent use. Close cuts every connection.
type Proxy struct {
	opts   Options
	dialer net.Dialer
	rp     *httputil.ReverseProxy

	used atomic.Int64 // bytes in and out, all connections

	mu     sync.Mutex
	closed bool
	conns  map[io.Closer]struct{}
}

// Options configure a Proxy. Guard is required.
type Options struct {
	Policy Policy
	Guard  *webhook.Guard
	// Resolver resolves allowed names; nil is net.DefaultResolver.
	Resolver webhook.Resolver
	// HTTPPorts and TLSPorts are the ports plain HTTP and CONNECT may
	// reach (default 80 and 443).
	HTTPPorts, TLSPorts []int
	// Log, if set, gets every attempt once it is decided (refused) or its
	// connection closed (allowed, with its bytes).
	Log func(Attempt)
	// HelloTimeout bounds the wait for a TLS ClientHello after CONNECT
	// (default 10 s).
	HelloTimeout time.Duration
}

// Attempt is one connection a sandbox asked for, for the audit log.
type Attempt struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Kind     string `json:"kind"` // "tls" or "http"
	Allowed  bool   `json:"allowed"`
	Reason   string `json:"reason,omitempty"` // why it was refused or cut
	Addr     string `json:"addr,omitempty"`   // the address dialled
	BytesOut int64  `json:"bytes_out"`        // from the sandbox
	BytesIn  int64  `json:"bytes_in"`         // to the sandbox
}

// NewProxy returns a proxy for opts.
func NewProxy(opts Options) (*Proxy, error) {
	if opts.Guard == nil {
		return nil, errors.New("egress: a Proxy needs a Guard")
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.HTTPPorts == nil {
		opts.HTTPPorts = []int{80}
	}
	if opts.TLSPorts == nil {
		opts.TLSPorts = []int{443}
	}
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = 10 * time.Second
	}
	p := &Proxy{opts: opts, conns: map[io.Closer]struct{}{}}
	p.dialer = net.Dialer{Timeout: 10 * time.Second, Control: opts.Guard.Control}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = pr.In.URL
			pr.Out.Host = pr.In.URL.Host
		},
		Transport: &http.Transport{
			DialContext:       p.dialPinned,
			DisableKeepAlives: true,
			// The sandbox gets the bytes the server sent: a transport
			// that asked for gzip itself would decompress it here, on
			// the server's CPU, and the byte bound would count the
			// compressed bytes only.
			DisableCompression:     true,
			MaxResponseHeaderBytes: 64 << 10,
			ResponseHeaderTimeout:  30 * time.Second,
		},
		ErrorLog: log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "egress: "+err.Error(), http.StatusBadGateway)
		},
	}
	return p, nil
}

// Used is the bytes in and out so far, all connections together.
func (p *Proxy) Used() int64 { return p.used.Load() }

// Close cuts every connection and refuses new ones.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[io.Closer]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	return nil
}

// track registers c to be cut by Close or the byte bound; false if the
// proxy is closed.
func (p *Proxy) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c io.Closer) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// refused is a decision's error: the reason goes to the audit log and to
// the sandbox.
type refused struct{ reason string }

func (e *refused) Error() string { return e.reason }

func refuse(format string, args ...any) error { return &refused{fmt.Sprintf(format, args...)} }

// decide checks host and port against the policy and the guard and
// returns the address to dial.
func (p *Proxy) decide(ctx context.Context, host string, port int, ports []int) (netip.AddrPort, error) {
	if !slices.Contains(ports, port) {
		return netip.AddrPort{}, refuse("port %d is not open to sandboxes", port)
	}
	if p.opts.Policy.MaxBytes > 0 && p.used.Load() >= p.opts.Policy.MaxBytes {
		return netip.AddrPort{}, refuse("the sandbox used its %d bytes of network", p.opts.Policy.MaxBytes)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !p.opts.Policy.AllowsAddr(a) {
			return netip.AddrPort{}, refuse("%s is not in the allowlist", a)
		}
		if err := p.opts.Guard.Allowed(a); err != nil {
			return netip.AddrPort{}, refuse("%s is an internal address", a)
		}
		return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
	}
	if !p.opts.Policy.AllowsName(host) {
		return netip.AddrPort{}, refuse("%s is not in the allowlist", host)
	}
	// The name resolved is the one checked: ASCII, lower case (host may
	// be written otherwise, e.g. with U+3002 for a dot, which IDNA maps
	// to "." but a resolver would send as it is).
	name, err := normalName(host)
	if err != nil {
		return netip.AddrPort{}, refuse("%s is not in the allowlist", host)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := p.opts.Resolver.LookupNetIP(ctx, "ip", name)
	if err != nil || len(addrs) == 0 {
		return netip.AddrPort{}, refuse("%s does not resolve", host)
	}
	// Every address must be public: a name that also resolves inside is
	// refused, so that no DNS answer can aim an allowed name inward.
	for _, a := range addrs {
		if err := p.opts.Guard.Allowed(a); err != nil {
			return netip.AddrPort{}, refuse("%s resolves to an internal address", host)
		}
	}
	return netip.AddrPortFrom(addrs[0].Unmap(), uint16(port)), nil
}

// ServeHTTP serves one proxy request of the sandbox.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	p.forward(w, r)
}

// hostPort splits an authority; a missing port is def.
func hostPort(authority string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(authority)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) && ae.Err == "missing port in address" {
			// An IPv6 address without a port is still in brackets.
			if len(authority) > 2 && authority[0] == '[' && authority[len(authority)-1] == ']' {
				return authority[1 : len(authority)-1], def, nil
			}
			return authority, def, nil
		}
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	return host, port, nil
}

type pinnedKey struct{}

// forward serves a plain HTTP request, by its URL's host.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	at := Attempt{Kind: "http"}
	if r.URL.Scheme != "http" || r.URL.Host == "" {
		http.Error(w, "egress: only absolute http:// requests and CONNECT are proxied", http.StatusBadRequest)
		return
	}
	host, port, err := hostPort(r.URL.Host, 80)
	at.Host, at.Port = host, port
	if err == nil {
		var ap netip.AddrPort
		if ap, err = p.decide(r.Context(), host, port, p.opts.HTTPPorts); err == nil {
			at.Allowed, at.Addr = true, ap.String()
			cnt := &counts{}
			// Logged when done, even when the reverse proxy aborts the
			// response (a panic of http.ErrAbortHandler) on a cut.
			defer func() {
				at.BytesOut, at.BytesIn = cnt.out.Load(), cnt.in.Load()
				if p.over() {
					at.Reason = "cut at the byte bound"
				}
				p.log(at)
			}()
			ctx := context.WithValue(r.Context(), pinnedKey{}, pinned{ap: ap, c: cnt})
			p.rp.ServeHTTP(w, r.WithContext(ctx))
			return
		}
	}
	at.Reason = err.Error()
	p.log(at)
	http.Error(w, "egress: "+err.Error(), http.StatusForbidden)
}

type pinned struct {
	ap netip.AddrPort
	c  *counts
}

type counts struct{ in, out atomic.Int64 }

// dialPinned dials the address forward decided, whatever the transport
// asks for.
func (p *Proxy) dialPinned(ctx context.Context, network, _ string) (net.Conn, error) {
	pin, ok := ctx.Value(pinnedKey{}).(pinned)
	if !ok {
		return nil, errors.New("egress: no decided address")
	}
	c, err := p.dialer.DialContext(ctx, "tcp", pin.ap.String())
	if err != nil {
		return nil, err
	}
	mc := &meteredConn{Conn: c, p: p, c: pin.c}
	if !p.track(mc) {
		c.Close()
		return nil, errors.New("egress: closed")
	}
	return mc, nil
}

// connect serves CONNECT: TLS to an allowed host.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	at := Attempt{Kind: "tls"}
	host, port, err := hostPort(r.Host, 443)
	at.Host, at.Port = host, port
	// A tunnel to an HTTP port carries plain HTTP (Node's fetch and other
	// undici clients send every request through CONNECT): its first
	// request must name the same host.
	ports := p.opts.TLSPorts
	if slices.Contains(p.opts.HTTPPorts, port) && !slices.Contains(p.opts.TLSPorts, port) {
		at.Kind, ports = "http", p.opts.HTTPPorts
	}
	var ap netip.AddrPort
	if err == nil {
		ap, err = p.decide(r.Context(), host, port, ports)
	}
	if err != nil {
		at.Reason = err.Error()
		p.log(at)
		http.Error(w, "egress: "+err.Error(), http.StatusForbidden)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "egress: cannot take over the connection", http.StatusInternalServerError)
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer client.Close()
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	if at.Kind == "http" {
		p.tunnelHTTP(client, brw.Reader, host, port)
		return
	}
	_ = client.SetReadDeadline(time.Now().Add(p.opts.HelloTimeout))
	sni, hello, err := clientHello(brw.Reader)
	switch {
	case err != nil:
		at.Reason = "not TLS: no ClientHello within " + p.opts.HelloTimeout.String()
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			at.Reason = "not TLS"
		}
	case !sameHost(sni, host):
		at.Reason = fmt.Sprintf("the TLS server name %q is not %q", sni, host)
	}
	_ = client.SetReadDeadline(time.Time{})
	if at.Reason != "" {
		p.log(at)
		return
	}
	upstream, err := p.dialer.DialContext(r.Context(), "tcp", ap.String())
	if err != nil {
		at.Reason = "dialling: " + err.Error()
		p.log(at)
		return
	}
	at.Allowed, at.Addr = true, ap.String()
	cnt := &counts{}
	up := &meteredConn{Conn: upstream, p: p, c: cnt}
	if !p.track(up) || !p.track(client) {
		up.Close()
		return
	}
	defer p.untrack(client)
	defer p.untrack(up)
	defer up.Close()
	if _, err := up.Write(hello); err == nil {
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(up, brw.Reader) // the rest from the sandbox (counted as out)
			up.CloseWrite()
			close(done)
		}()
		_, _ = io.Copy(client, up) // counted as in
		client.Close()
		<-done
	}
	at.BytesOut, at.BytesIn = cnt.out.Load(), cnt.in.Load()
	if p.over() {
		at.Reason = "cut at the byte bound"
	}
	p.log(at)
}

// tunnelHTTP serves a CONNECT tunnel to an HTTP port as a proxy
// connection of its own: every request in it (keep-alive included) must
// name the tunnel's host, and goes through forward as an absolute-form
// request would, decided, pinned, metered and audited one by one. A
// request naming another host gets 403 and is audited as refused.
func (p *Proxy) tunnelHTTP(client net.Conn, r *bufio.Reader, host string, port int) {
	conn := &tunnelConn{Conn: client, r: r, done: make(chan struct{})}
	if !p.track(conn) {
		return
	}
	defer p.untrack(conn)
	// TLS through a tunnel to an HTTP port is refused (and audited) here;
	// other bytes that are not HTTP get the server's 400.
	_ = client.SetReadDeadline(time.Now().Add(p.opts.HelloTimeout))
	first, err := r.Peek(1)
	_ = client.SetReadDeadline(time.Time{})
	if err == nil && first[0] == 0x16 {
		p.log(Attempt{Kind: "http", Host: host, Port: port, Reason: "not HTTP: a TLS handshake through a tunnel to an HTTP port"})
		return
	}
	// The upstream sees the Host a client sends for that URL: no port
	// when it is HTTP's own.
	target := strings.TrimSuffix(net.JoinHostPort(host, strconv.Itoa(port)), ":80")
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			h, _, err := hostPort(req.Host, port)
			if err != nil || !sameName(h, host) {
				at := Attempt{Kind: "http", Host: h, Port: port, Reason: fmt.Sprintf("the request's Host is not the tunnel's %q", host)}
				p.log(at)
				http.Error(w, "egress: "+at.Reason, http.StatusForbidden)
				return
			}
			req.URL.Scheme, req.URL.Host = "http", target
			p.forward(w, req)
		}),
		ReadHeaderTimeout: p.opts.HelloTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    maxHead,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	_ = srv.Serve(&tunnelListener{c: conn})
}

// maxHead bounds a request head read through a tunnel (http.Server
// allows 4 KiB more of its own).
const maxHead = 64 << 10

// tunnelConn is a hijacked connection read through the buffer the
// server had already filled; done is closed by Close.
type tunnelConn struct {
	net.Conn
	r    *bufio.Reader
	once sync.Once
	done chan struct{}
}

func (c *tunnelConn) Read(b []byte) (int, error) { return c.r.Read(b) }
func (c *tunnelConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

// tunnelListener accepts its one connection, then waits for it to close.
type tunnelListener struct {
	c     *tunnelConn
	taken atomic.Bool
}

func (l *tunnelListener) Accept() (net.Conn, error) {
	if !l.taken.Swap(true) {
		return l.c, nil
	}
	<-l.c.done
	return nil, net.ErrClosed
}
func (l *tunnelListener) Close() error   { return nil }
func (l *tunnelListener) Addr() net.Addr { return l.c.LocalAddr() }

// sameHost says whether the SNI names host: equal names, or no SNI for
// an address (clients send none for an IP).
func sameHost(sni, host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return sni == ""
	}
	a, err1 := normalName(sni)
	b, err2 := normalName(host)
	return err1 == nil && err2 == nil && a == b
}

// sameName says whether an HTTP Host names host: the same address, or
// the same name.
func sameName(h, host string) bool {
	a, err1 := netip.ParseAddr(strings.Trim(h, "[]"))
	b, err2 := netip.ParseAddr(host)
	if err1 == nil || err2 == nil {
		return err1 == nil && err2 == nil && a.Unmap() == b.Unmap()
	}
	return sameHost(h, host)
}

// maxAuditText bounds the host and reason of an attempt as logged: they
// come from the sandbox (a host may be as long as a request head), and
// the audit keeps its last attempts in the server's memory.
const maxAuditText = 300

func (p *Proxy) log(a Attempt) {
	if p.opts.Log != nil {
		a.Host, a.Reason = clip(a.Host), clip(a.Reason)
		p.opts.Log(a)
	}
}

// clip cuts s to at most maxAuditText bytes, on a rune boundary, marking
// the cut.
func clip(s string) string {
	if len(s) <= maxAuditText {
		return s
	}
	n := maxAuditText - len("…")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// over says whether the byte bound is passed.
func (p *Proxy) over() bool {
	return p.opts.Policy.MaxBytes > 0 && p.used.Load() > p.opts.Policy.MaxBytes
}

// meteredConn counts an upstream connection's bytes, and cuts every
// connection of the proxy once the bound is passed.
type meteredConn struct {
	net.Conn
	p *Proxy
	c *counts
}

func (m *meteredConn) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	m.c.in.Add(int64(n))
	m.add(n)
	return n, err
}

// Write counts b before it is written, and takes back what was not: the
// peer may answer (and the attempt be logged) before a writer goroutine
// is scheduled again after its write returns.
func (m *meteredConn) Write(b []byte) (int, error) {
	m.c.out.Add(int64(len(b)))
	m.add(len(b))
	n, err := m.Conn.Write(b)
	if short := int64(len(b) - n); short > 0 {
		m.c.out.Add(-short)
		m.p.used.Add(-short)
	}
	return n, err
}

func (m *meteredConn) add(n int) {
	if m.p.used.Add(int64(n)) > m.p.opts.Policy.MaxBytes && m.p.opts.Policy.MaxBytes > 0 {
		m.p.cutAll()
	}
}

func (m *meteredConn) Close() error {
	m.p.untrack(m)
	return m.Conn.Close()
}

func (m *meteredConn) CloseWrite() {
	if cw, ok := m.Conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// cutAll closes every open connection (the byte bound was passed); new
// ones are refused by decide.
func (p *Proxy) cutAll() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[io.Closer]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// errHelloRead stops the handshake once the ClientHello is read.
var errHelloRead = errors.New("egress: hello read")

// clientHello reads a TLS ClientHello from r and returns its server name
// and the bytes it took, to be sent on unchanged. crypto/tls parses it:
// a handshake on a connection that records what it reads and writes
// nothing, stopped from GetConfigForClient.
func clientHello(r *bufio.Reader) (string, []byte, error) {
	var rec bytes.Buffer
	var sni string
	seen := false
	conn := &helloConn{r: io.TeeReader(r, &rec)}
	err := tls.Server(conn, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, seen = h.ServerName, true
		return nil, errHelloRead
	}}).Handshake()
	if !seen {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return "", nil, err
	}
	return sni, rec.Bytes(), nil
}

// helloConn is a net.Conn that only reads.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (c *helloConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c *helloConn) Write(b []byte) (int, error) { return 0, io.ErrClosedPipe }
func (c *helloConn) Close() error                { return nil }
func (c *helloConn) SetDeadline(time.Time) error { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error {
	return nil
}
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
