package api

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLimitListener opens real TCP connections on loopback, from several
// source addresses (all of 127/8 is loopback on Linux), and checks which
// are served and which get the 503 in the error shape.
func TestLimitListener(t *testing.T) {
	m := NewMetrics()
	// Long enough that no connection of this test closes by itself.
	dial := serveLimitListener(t, ConnLimits{Max: 3, PerAddr: 2, Metrics: m}, time.Minute)
	var open []net.Conn
	for i, tc := range []struct {
		from    string
		close   int // index of an earlier connection to close first, or -1
		status  int
		message string
	}{
		{from: "127.0.0.1", close: -1, status: 200},
		{from: "127.0.0.1", close: -1, status: 200},
		{from: "127.0.0.1", close: -1, status: 503, message: "too many open connections from your address (at most 2)"},
		{from: "127.0.0.2", close: -1, status: 200},
		{from: "127.0.0.3", close: -1, status: 503, message: "too many open connections"},
		// A closed connection gives its place back.
		{from: "127.0.0.3", close: 0, status: 200},
		{from: "127.0.0.1", close: -1, status: 503, message: "too many open connections"},
	} {
		if tc.close >= 0 {
			open[tc.close].Close()
			waitFor(t, func() bool { return m.openConnections() == 2 })
		}
		c := dial(tc.from)
		open = append(open, c)
		status, body := get(t, c)
		if status != tc.status {
			t.Fatalf("connection %d from %s: status %d, want %d (%s)", i, tc.from, status, tc.status, body)
		}
		if tc.status != 503 {
			continue
		}
		var e struct {
			Error     struct{ Code, Message string }
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != "overloaded" ||
			!strings.Contains(e.Error.Message, tc.message) || !strings.HasPrefix(e.RequestID, "req_") {
			t.Errorf("connection %d: body %s (%v)", i, body, err)
		}
		// The server closed it.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("connection %d: still open after the 503 (%d, %v)", i, n, err)
		}
	}
	// The served connections are still usable (keep-alive).
	if status, _ := get(t, open[1]); status != 200 {
		t.Errorf("second request on a kept connection: %d", status)
	}
	if got := m.openConnections(); got != 3 {
		t.Errorf("open connections gauge %d, want 3", got)
	}
}

// TestLimitListenerIdleTimeout: a kept-alive connection that sits idle is
// closed by the server's idle timeout and gives its place back.
func TestLimitListenerIdleTimeout(t *testing.T) {
	m := NewMetrics()
	dialFrom := serveLimitListener(t, ConnLimits{Max: 1, Metrics: m}, time.Second)
	dial := func() net.Conn { return dialFrom("127.0.0.1") }
	idle := dial()
	if status, _ := get(t, idle); status != 200 {
		t.Fatalf("first: %d", status)
	}
	if status, _ := get(t, dial()); status != 503 {
		t.Errorf("second while the first is open: %d, want 503", status)
	}
	waitFor(t, func() bool { return m.openConnections() == 0 })
	if status, _ := get(t, dial()); status != 200 {
		t.Errorf("after the idle one was closed: %d, want 200", status)
	}
	idle.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := idle.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the idle connection is still open")
	}
}

// serveLimitListener serves "ok" on loopback through LimitListener with o,
// closing idle connections after idle, and returns a dial to it.
func serveLimitListener(t *testing.T, o ConnLimits, idle time.Duration) func(from string) net.Conn {
	t.Helper()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	return serveLoopback(t, &http.Server{Handler: ok, IdleTimeout: idle}, func(ln net.Listener) net.Listener { return LimitListener(ln, o) })
}

// serveLoopback serves srv on a loopback listener, wrapped by wrap, until
// the test ends, and returns a dial to it from a loopback address; each
// connection closes with the test.
func serveLoopback(t *testing.T, srv *http.Server, wrap func(net.Listener) net.Listener) func(from string) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(wrap(ln))
	t.Cleanup(func() { srv.Close() })
	return func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// get sends one GET on c and reads the answer.
func get(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (m *Metrics) openConnections() int { return int(testutil.ToFloat64(m.connsOpen)) }

func (m *Metrics) evictedConnections() int { return int(testutil.ToFloat64(m.connsEvicted)) }

// TestConnLimiterUnauthenticated: connections no request has
// authenticated are capped per /24 and in total; a newcomer over a cap
// takes the place of the oldest idle one (of its own prefix when that is
// full, else of the prefix holding the most), never of an authenticated
// connection, one running a request, or a proxy's.
func TestConnLimiterUnauthenticated(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	m := NewMetrics()
	l, dial := limitedServer(t, ConnLimits{Max: 8, PerAddr: 3, MaxUnauth: 3, UnauthPerPrefix: 2, Metrics: m,
		Proxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.9/32")}},
		func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/auth":
				authenticatedConn(r.Context())
			case "/slow":
				<-release
			}
			io.WriteString(w, "ok")
		})
	// halfOpen starts a request header and never ends it.
	halfOpen := func(c net.Conn) {
		t.Helper()
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err != nil
	}

	authed := dial("127.0.0.1", 1, 0)
	if _, err := io.WriteString(authed, "GET /auth HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(authed), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("authenticating request: %v %v", res, err)
	}
	res.Body.Close()
	// A request running on an unauthenticated connection keeps it.
	busy := dial("127.0.0.2", 2, 0)
	if _, err := io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return l.running() == 1 })
	// The prefix's second place; the third takes the oldest idle one.
	a := dial("127.0.0.3", 3, 0)
	halfOpen(a)
	b := dial("127.0.0.4", 3, 1)
	halfOpen(b)
	if !closed(a) {
		t.Fatal("the oldest idle unauthenticated connection of the full prefix is still open")
	}
	// Another /24 fills the total of 3; a third /24 takes the place of
	// the oldest idle one of the prefix holding the most (127.0.0.0/24,
	// where b is the only idle one).
	c := dial("127.0.1.1", 4, 1)
	halfOpen(c)
	d := dial("127.0.2.1", 4, 2)
	halfOpen(d)
	if !closed(b) {
		t.Fatal("the idle connection of the prefix holding the most is still open")
	}
	// A proxy's connections are not unauthenticated: they take no place
	// and count only in the total, not per address.
	for i := range 4 {
		dial("127.0.0.9", 5+i, 2)
	}
	// At the total, a newcomer takes the oldest idle unauthenticated
	// connection's place (c: every prefix holds one).
	e := dial("127.0.3.1", 8, 3)
	if !closed(c) {
		t.Fatal("the oldest idle unauthenticated connection is still open at the total")
	}
	halfOpen(e)
	dial("127.0.4.1", 8, 4) // takes d's place
	dial("127.0.5.1", 8, 5) // takes e's place
	if status, _ := get(t, dial("127.0.6.1", 8, 6)); status != 200 {
		t.Errorf("a newcomer at the total: %d", status)
	}
	// The authenticated connection and the busy one were never taken.
	if status, _ := get(t, authed); status != 200 {
		t.Errorf("the authenticated connection: %d", status)
	}
	if got := testutil.ToFloat64(m.connsRefused.WithLabelValues("total")); got != 0 {
		t.Errorf("%v refused at the total, want none while idle unauthenticated connections remained", got)
	}
}

// TestConnLimiterRefusesWhenAllBusy: when every unauthenticated place is
// held by a connection running a request, a newcomer over the cap is
// refused with the 503.
func TestConnLimiterRefusesWhenAllBusy(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	m := NewMetrics()
	l, dial := limitedServer(t, ConnLimits{Max: 8, MaxUnauth: 1, UnauthPerPrefix: 1, Metrics: m},
		func(w http.ResponseWriter, r *http.Request) { <-release })
	c := dial("127.0.0.1", 1, 0)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n")
	waitFor(t, func() bool { return l.running() == 1 })
	if status, _ := get(t, dial("127.0.0.1", 1, 0)); status != 503 {
		t.Errorf("over the cap with no idle connection: %d, want 503", status)
	}
	if got := testutil.ToFloat64(m.connsRefused.WithLabelValues("per_prefix")); got != 1 {
		t.Errorf("refused per prefix: %v, want 1", got)
	}
}

// running counts the unauthenticated connections running a request.
func (l *ConnLimiter) running() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, cs := range l.byPrefix {
		for _, c := range cs {
			if c.busy > 0 {
				n++
			}
		}
	}
	return n
}

// TestPrefixOf: unauthenticated connections are grouped by what one
// client cheaply holds: an IPv4 /24, an IPv6 /64 (IPv4-mapped IPv6 as
// IPv4).
func TestPrefixOf(t *testing.T) {
	wantNetworks(t, "prefixOf", prefixOf, []struct{ addr, want string }{
		{"127.0.0.2", "127.0.0.0/24"},
		{"127.0.1.2", "127.0.1.0/24"},
		{"::ffff:10.1.2.3", "10.1.2.0/24"},
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"},
		{"::1", "::/64"},
	})
}

// wantNetworks checks the network fn (prefixOf or groupOf, named name)
// puts each address in.
func wantNetworks(t *testing.T, name string, fn func(netip.Addr) netip.Prefix, cases []struct{ addr, want string }) {
	t.Helper()
	for _, tc := range cases {
		if got := fn(netip.MustParseAddr(tc.addr).Unmap()); got.String() != tc.want {
			t.Errorf("%s(%s) = %s, want %s", name, tc.addr, got, tc.want)
		}
	}
}

// TestConnLimiterEvictsFromBusiestAddress: in a full prefix, the place
// given to a newcomer is taken from the address holding the most, so a
// neighbour of a flood keeps its connection although it is the oldest.
func TestConnLimiterEvictsFromBusiestAddress(t *testing.T) {
	m := NewMetrics()
	_, dial := limitedServer(t, ConnLimits{Max: 8, MaxUnauth: 8, UnauthPerPrefix: 3, Metrics: m},
		func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	neighbour := dial("127.0.0.2", 1, 0)
	first := dial("127.0.0.3", 2, 0)
	dial("127.0.0.3", 3, 0)
	dial("127.0.0.4", 3, 1)
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.Read(make([]byte, 1)); err == nil {
		t.Errorf("the oldest connection of the address holding the most is still open")
	}
	if status, _ := get(t, neighbour); status != 200 {
		t.Errorf("the neighbour's connection: %d", status)
	}
}

// countedDial connects from an address and waits until the server has
// counted the connection: its open and evicted connections reach the
// given values.
type countedDial func(from string, open, evicted int) net.Conn

// limitedServer serves h on loopback through a ConnLimiter with o (whose
// Metrics must be set) and returns it with a countedDial to the server.
func limitedServer(t *testing.T, o ConnLimits, h http.HandlerFunc) (*ConnLimiter, countedDial) {
	t.Helper()
	l := NewConnLimiter(o)
	dial := serveLoopback(t, &http.Server{Handler: l.Handler(h), ConnContext: l.ConnContext, IdleTimeout: time.Minute}, l.Listener)
	return l, func(from string, open, evicted int) net.Conn {
		t.Helper()
		c := dial(from)
		waitFor(t, func() bool { return o.Metrics.openConnections() == open && o.Metrics.evictedConnections() == evicted })
		return c
	}
}
