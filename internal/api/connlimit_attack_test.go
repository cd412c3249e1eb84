package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
)

// Attacks on the connection limits through the account pages, which take
// requests without a key. Found by a review of the merged limiter.

type discardMailer struct{}

func (discardMailer) Send(context.Context, string, string, string) error { return nil }

// accountsServer is an API with open sign-up and a mailer (so accounts
// start unverified) behind limiter o; stall, when set, replaces
// unauthStall.
func accountsServer(t *testing.T, o ConnLimits, stall time.Duration) (*ConnLimiter, *url.URL) {
	t.Helper()
	st := storefake.New()
	acc, err := account.New(account.Options{Store: st, Signup: account.SignupOpen, Mailer: discardMailer{}, PublicURL: "http://x.test"})
	if err != nil {
		t.Fatal(err)
	}
	s := newAccountsAPI(t, st, acc, "")
	l := NewConnLimiter(o)
	if stall > 0 {
		l.stall = stall
	}
	hs := httptest.NewUnstartedServer(l.Handler(s))
	hs.Listener = l.Listener(hs.Listener)
	hs.Config.ConnContext = l.ConnContext
	hs.Config.ReadTimeout = time.Minute
	hs.Start()
	t.Cleanup(hs.Close)
	u, _ := url.Parse(hs.URL)
	return l, u
}

func (l *ConnLimiter) unauthenticated() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unauth
}

// firstLine sends req on a new connection and returns the answer's status
// line ("" if none came within 3 s).
func firstLine(t *testing.T, host, req string) string {
	t.Helper()
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, req)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 512)
	n, _ := conn.Read(buf)
	line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	return line
}

// TestStalledFormsGiveWay: sign-in forms whose body never comes hold every
// unauthenticated place; past the stall time a newcomer takes one of them
// instead of getting the 503.
func TestStalledFormsGiveWay(t *testing.T) {
	l, u := accountsServer(t, ConnLimits{Max: 64, MaxUnauth: 4, UnauthPerPrefix: 4}, 300*time.Millisecond)
	for range 4 {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 10000\r\n\r\nemail=", u.Host)
	}
	waitFor(t, func() bool { return l.running() == 4 })
	time.Sleep(400 * time.Millisecond) // past the stall time
	if got := firstLine(t, u.Host, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); !strings.Contains(got, " 200 ") {
		t.Errorf("a newcomer while 4 stalled forms hold every unauthenticated place: %q, want 200", got)
	}
}

// TestUnverifiedSessionStaysUnauthenticated: a sign-up that never verified
// its email signs in; its dashboard views do not take its connections out
// of the unauthenticated caps.
func TestUnverifiedSessionStaysUnauthenticated(t *testing.T) {
	l, u := accountsServer(t, ConnLimits{Max: 64, MaxUnauth: 8, UnauthPerPrefix: 8}, 0)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, step := range []struct {
		path string
		form url.Values
		want int
	}{
		{"/signup", url.Values{"email": {"fake@nowhere.invalid"}, "name": {"x"}, "password": {"0123456789ab"}}, http.StatusOK},
		{"/login", url.Values{"email": {"fake@nowhere.invalid"}, "password": {"0123456789ab"}}, http.StatusSeeOther},
	} {
		resp, err := c.PostForm(u.String()+step.path, step.form)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != step.want {
			t.Fatalf("%s: %d, want %d", step.path, resp.StatusCode, step.want)
		}
	}
	c.CloseIdleConnections()
	var cookie string
	for _, k := range jar.Cookies(u) {
		cookie = k.Name + "=" + k.Value
	}
	waitFor(t, func() bool { return l.unauthenticated() == 0 })
	conns := make([]net.Conn, 0, 4)
	for range 4 {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
		fmt.Fprintf(conn, "GET /dashboard HTTP/1.1\r\nHost: %s\r\nCookie: %s\r\n\r\n", u.Host, cookie)
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 256)
		if n, _ := conn.Read(buf); !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
			t.Fatalf("dashboard of the unverified account: %q", buf[:n])
		}
	}
	if got := l.unauthenticated(); got != len(conns) {
		t.Errorf("%d of %d connections of an unverified session count as unauthenticated", got, len(conns))
	}
}

// fakeConn is a connection from addr, for the limiter's bookkeeping
// without a socket bound to that address.
type fakeConn struct {
	net.Conn
	addr *net.TCPAddr
}

func (c fakeConn) RemoteAddr() net.Addr { return c.addr }

// admitFrom runs the limiter's admission of a connection from addr, as
// Accept does, and returns why it was refused ("" if admitted).
func admitFrom(t *testing.T, l *ConnLimiter, addr string) string {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	why, victims := l.admit(l.newConn(fakeConn{Conn: a, addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(addr), 40000))}))
	for _, v := range victims {
		v.Conn.Close()
	}
	return why
}

// TestConnLimiterPerAddrIPv6Slash64: an attacker holding a /64 of IPv6
// addresses (what one host is routinely given) opens one connection per
// address; the per-address cap counts the /64 as one client, so it cannot
// take more than PerAddr places. IPv4 stays per address, and IPv4-mapped
// IPv6 counts as the IPv4 address.
func TestConnLimiterPerAddrIPv6Slash64(t *testing.T) {
	l := NewConnLimiter(ConnLimits{Max: 1000, PerAddr: 4})
	refused := 0
	for i := range 64 {
		if why := admitFrom(t, l, fmt.Sprintf("2001:db8:1:2::%x", i+1)); why != "" {
			if why != "per_address" {
				t.Fatalf("connection %d refused for %q, want per_address", i, why)
			}
			refused++
		}
	}
	if refused != 60 {
		t.Errorf("64 connections from 64 addresses of one /64 with a cap of 4: %d refused, want 60", refused)
	}
	// Another /64 is another client.
	if why := admitFrom(t, l, "2001:db8:1:3::1"); why != "" {
		t.Errorf("the next /64: refused (%s)", why)
	}
	// IPv4: each address is its own client; mapped IPv6 is the same one.
	for i := range 4 {
		if why := admitFrom(t, l, fmt.Sprintf("192.0.2.%d", i+1)); why != "" {
			t.Errorf("192.0.2.%d: refused (%s)", i+1, why)
		}
	}
	for i := range 3 {
		if why := admitFrom(t, l, "::ffff:192.0.2.1"); why != "" {
			t.Errorf("mapped connection %d to 192.0.2.1: refused (%s)", i, why)
		}
	}
	if why := admitFrom(t, l, "::ffff:192.0.2.1"); why != "per_address" {
		t.Errorf("the fifth connection of 192.0.2.1, mapped: %q, want per_address", why)
	}
}

// TestGroupOf: the per-address cap's groups.
func TestGroupOf(t *testing.T) {
	wantNetworks(t, "groupOf", groupOf, []struct{ addr, want string }{
		{"127.0.0.2", "127.0.0.2/32"},
		{"::ffff:10.1.2.3", "10.1.2.3/32"},
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"},
	})
}

// TestConnLimiterHogAtTotalIsEvicted: one client authenticates as many
// keep-alive connections as the total allows and leaves them idle; a
// newcomer from elsewhere takes the place of one of the hog's idle
// connections instead of being refused. A hog connection running a
// request is never taken.
func TestConnLimiterHogAtTotalIsEvicted(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	m := NewMetrics()
	l, dial := limitedServer(t, ConnLimits{Max: 4, MaxUnauth: 4, UnauthPerPrefix: 4, Metrics: m},
		func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/auth":
				authenticatedConn(r.Context())
			case "/slow":
				authenticatedConn(r.Context())
				<-release
			}
			io.WriteString(w, "ok")
		})
	authGet := func(c net.Conn) {
		t.Helper()
		if _, err := io.WriteString(c, "GET /auth HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("authenticating: %v %v", res, err)
		}
		res.Body.Close()
	}
	// The hog's first connection runs a request the whole time.
	busy := dial("127.0.0.1", 1, 0)
	if _, err := io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.authed) == 1
	})
	var hog []net.Conn
	for i := range 3 {
		c := dial("127.0.0.1", 2+i, 0)
		authGet(c)
		hog = append(hog, c)
	}
	for i := range 3 {
		if status, _ := get(t, dial(fmt.Sprintf("127.0.1.%d", i+1), 4, i+1)); status != 200 {
			t.Fatalf("newcomer %d while the hog holds every place: %d, want 200", i, status)
		}
	}
	for i, c := range hog {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("the hog's idle connection %d is still open", i)
		}
	}
	// Now only the busy one is authenticated: a newcomer takes an idle
	// unauthenticated place, never the busy connection.
	get(t, dial("127.0.2.1", 4, 4))
	busy.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := busy.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection running a request was closed: %v", err)
	}
	if got := testutil.ToFloat64(m.connsRefused.WithLabelValues("total")); got != 0 {
		t.Errorf("%v refused at the total, want none while the hog had idle connections", got)
	}
}

// TestConnLimiterTenantHogThroughAPI: a tenant with a key opens
// keep-alive connections from many addresses (so the per-address cap
// does not stop it), each authenticated by a real API request. It holds
// at most its per-tenant cap (a newer one takes the place of its own idle
// one), and at the total a newcomer of another tenant gets in by taking
// the place of one of the hog's idle connections.
func TestConnLimiterTenantHogThroughAPI(t *testing.T) {
	env := newEnv(t)
	hogKey, _ := env.newKey("hog", "pro")
	m := NewMetrics()
	l := NewConnLimiter(ConnLimits{Max: 6, PerAddr: 2, PerTenant: 4, MaxUnauth: 6, UnauthPerPrefix: 6, Metrics: m})
	hs := httptest.NewUnstartedServer(l.Handler(env.srv))
	hs.Listener = l.Listener(hs.Listener)
	hs.Config.ConnContext = l.ConnContext
	hs.Start()
	t.Cleanup(hs.Close)
	usage := func(from, key string) (net.Conn, int) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /v1/usage HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n\r\n", key)
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return c, 0 // closed for a newcomer before it was answered
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		c.SetDeadline(time.Time{})
		return c, res.StatusCode
	}
	tenantConns := func(tenant string) int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.byTenant[tenant]
	}
	var hog []net.Conn
	for i := range 6 {
		c, status := usage(fmt.Sprintf("127.0.3.%d", i+1), hogKey)
		if status != 200 {
			t.Fatalf("hog connection %d: %d", i, status)
		}
		hog = append(hog, c)
	}
	if got := tenantConns("hog"); got != 4 {
		t.Errorf("the hog holds %d authenticated connections, want its cap of 4", got)
	}
	// The hog's oldest two were closed for its newer ones.
	for i, c := range hog[:2] {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("the hog's connection %d is still open over its cap", i)
		}
	}
	// Fill the total with the hog's unauthenticated connections and its
	// cap: a newcomer of another tenant still gets in.
	for i := range 2 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.4.%d", i+1))}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	waitFor(t, func() bool { return m.openConnections() == 6 })
	for i := range 3 {
		if _, status := usage(fmt.Sprintf("127.0.5.%d", i+1), env.key); status != 200 {
			t.Errorf("acme's connection %d while the hog holds every place: %d, want 200", i, status)
		}
	}
	if got := tenantConns("acme"); got != 3 {
		t.Errorf("acme holds %d connections, want 3", got)
	}
}

// TestConnLimiterPerTenantRefusesWhenAllBusy: a tenant at its cap whose
// connections all run requests gets the 503 on a new one, which is
// closed after the answer; another tenant is not affected.
func TestConnLimiterPerTenantRefusesWhenAllBusy(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	m := NewMetrics()
	l, dial := limitedServer(t, ConnLimits{Max: 8, PerTenant: 2, Metrics: m},
		func(w http.ResponseWriter, r *http.Request) {
			if err := tenantConn(w, r, r.URL.Query().Get("tenant")); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, err.Error())
				return
			}
			if r.URL.Path == "/slow" {
				<-release
			}
			io.WriteString(w, "ok")
		})
	for i := range 2 {
		c := dial("127.0.0.1", 1+i, 0)
		io.WriteString(c, "GET /slow?tenant=t HTTP/1.1\r\nHost: test\r\n\r\n")
	}
	waitFor(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.byTenant["t"] == 2
	})
	c := dial("127.0.0.2", 3, 0)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /?tenant=t HTTP/1.1\r\nHost: test\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 503 || !strings.Contains(string(b), "at most 2") || !res.Close {
		t.Errorf("a third connection of a tenant at its cap: %d close=%v %q, want 503 and close", res.StatusCode, res.Close, b)
	}
	if got := testutil.ToFloat64(m.connsRefused.WithLabelValues("per_tenant")); got != 1 {
		t.Errorf("refused per tenant: %v, want 1", got)
	}
	res2, err := http.Get("http://" + c.RemoteAddr().String() + "/?tenant=other")
	if err != nil || res2.StatusCode != 200 {
		t.Errorf("another tenant: %v %v", res2, err)
	} else {
		res2.Body.Close()
	}
}
