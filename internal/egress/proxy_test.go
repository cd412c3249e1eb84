package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/egress/egresstest"
)

// world is a proxy in front of a fake internet on loopback: 127.0.0.1
// stands for a public address (the guard lets it through), everything
// else internal is refused as in production.
type world struct {
	proxy     *Proxy
	proxyURL  *url.URL
	httpPort  int
	tlsPort   int
	mu        sync.Mutex
	attempts  []Attempt
	tlsServer *httptest.Server
}

func newWorld(t testing.TB, maxBytes int64) *world {
	t.Helper()
	big := strings.Repeat("x", 100_000)
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s via %s", r.Host, r.Header.Get("X-Forwarded-For"))
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) })
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	ts := httptest.NewTLSServer(mux)
	t.Cleanup(ts.Close)
	w := &world{httpPort: egresstest.Port(t, hs.URL), tlsPort: egresstest.Port(t, ts.URL), tlsServer: ts}
	pol, err := Parse([]string{"api.example.test", "*.wild.example.test", "rebind.example.test", "meta.example.test", "mixed.example.test", "v6.example.test"}, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	w.proxy, err = NewProxy(Options{
		Policy: pol,
		Guard:  egresstest.Guard("127.0.0.1/32"),
		Resolver: egresstest.Zone{
			"api.example.test":    egresstest.Addrs("127.0.0.1"),
			"a.wild.example.test": egresstest.Addrs("127.0.0.1"),
			"other.example.test":  egresstest.Addrs("127.0.0.1"),
			"rebind.example.test": egresstest.Addrs("10.0.0.1"),
			"meta.example.test":   egresstest.Addrs("169.254.169.254"),
			"mixed.example.test":  egresstest.Addrs("127.0.0.1", "10.0.0.1"),
			"v6.example.test":     egresstest.Addrs("::1"),
		},
		HTTPPorts: []int{w.httpPort},
		TLSPorts:  []int{w.tlsPort},
		Log: func(a Attempt) {
			w.mu.Lock()
			w.attempts = append(w.attempts, a)
			w.mu.Unlock()
		},
		HelloTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ps := httptest.NewServer(w.proxy)
	t.Cleanup(ps.Close)
	t.Cleanup(func() { w.proxy.Close() })
	w.proxyURL, _ = url.Parse(ps.URL)
	return w
}

// client is what code in a sandbox uses: HTTP(S)_PROXY pointing at the
// proxy. TLS verification is off: the fake servers' certificate does not
// name the test hosts, and what is tested is the proxy's decision.
func (w *world) client(serverName string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(w.proxyURL),
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, ServerName: serverName},
		DisableKeepAlives: true,
	}}
}

// get fetches rawURL through the proxy and waits until the proxy has
// logged the attempt (a tunnel is logged once both sides closed).
func (w *world) get(t *testing.T, rawURL, serverName string) (int, string, error) {
	t.Helper()
	n := w.count()
	defer func() {
		if _, ok := w.waitAttempt(t, n, 5*time.Second); !ok {
			t.Errorf("GET %s: the proxy logged no attempt", rawURL)
		}
	}()
	res, err := w.client(serverName).Get(rawURL)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

func (w *world) last() Attempt {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.attempts) == 0 {
		return Attempt{}
	}
	return w.attempts[len(w.attempts)-1]
}

func (w *world) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.attempts)
}

// waitAttempt waits until w has logged more than n attempts and returns
// the last.
func (w *world) waitAttempt(t *testing.T, n int, within time.Duration) (Attempt, bool) {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		w.mu.Lock()
		done := len(w.attempts) > n
		w.mu.Unlock()
		if done {
			return w.last(), true
		}
	}
	return Attempt{}, false
}

// connect dials the proxy and writes head, a CONNECT request; unless the
// proxy answers 200 it fails t at once. What follows on the connection
// is the tunnel.
func (w *world) connect(t *testing.T, head string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", w.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, head)
	br := bufio.NewReader(c)
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
		c.Close()
		t.Fatalf("CONNECT: %v %v", res, err)
	}
	return c, br
}

// TestProxyDecides: allowed names work over HTTP and through CONNECT;
// every other name, an address, a name that resolves inward (DNS
// rebinding, the metadata address, loopback over IPv6, a mixed answer)
// and another port are refused, each with its reason in the audit log.
func TestProxyDecides(t *testing.T) {
	w := newWorld(t, 0)
	httpURL := func(host, path string) string { return fmt.Sprintf("http://%s:%d%s", host, w.httpPort, path) }
	tlsURL := func(host, path string) string { return fmt.Sprintf("https://%s:%d%s", host, w.tlsPort, path) }

	for _, host := range []string{"api.example.test", "a.wild.example.test"} {
		st, body, err := w.get(t, httpURL(host, "/hello"), "")
		if err != nil || st != 200 || body != fmt.Sprintf("hello %s:%d via ", host, w.httpPort) {
			t.Errorf("http %s: %d %q %v", host, st, body, err)
		}
		if a := w.last(); !a.Allowed || a.Kind != "http" || a.Host != host || a.BytesIn == 0 || a.BytesOut == 0 || a.Addr != fmt.Sprintf("127.0.0.1:%d", w.httpPort) {
			t.Errorf("audit of http %s: %+v", host, a)
		}
		st, body, err = w.get(t, tlsURL(host, "/hello"), host)
		if err != nil || st != 200 || !strings.HasPrefix(body, "hello "+host) {
			t.Errorf("https %s: %d %q %v", host, st, body, err)
		}
		if a := w.last(); !a.Allowed || a.Kind != "tls" || a.BytesIn == 0 || a.BytesOut == 0 {
			t.Errorf("audit of https %s: %+v", host, a)
		}
	}

	for _, tc := range []struct{ host, reason string }{
		{"other.example.test", "not in the allowlist"},
		{"wild.example.test", "not in the allowlist"},
		{"127.0.0.1", "not in the allowlist"},
		{"rebind.example.test", "resolves to an internal address"},
		{"meta.example.test", "resolves to an internal address"},
		{"mixed.example.test", "resolves to an internal address"},
		{"v6.example.test", "resolves to an internal address"},
		{"nxdomain.example.test", "not in the allowlist"},
	} {
		st, _, err := w.get(t, httpURL(tc.host, "/hello"), "")
		if err != nil || st != http.StatusForbidden {
			t.Errorf("http %s: %d %v; want 403", tc.host, st, err)
		}
		if a := w.last(); a.Allowed || a.Host != tc.host || !strings.Contains(a.Reason, tc.reason) {
			t.Errorf("audit of http %s: %+v; want refused, %q", tc.host, a, tc.reason)
		}
		if _, _, err := w.get(t, tlsURL(tc.host, "/hello"), tc.host); err == nil || !strings.Contains(err.Error(), "Forbidden") {
			t.Errorf("https %s: %v; want the CONNECT refused", tc.host, err)
		}
	}
	// Another port: TLS's port over plain HTTP, and the reverse.
	if st, _, _ := w.get(t, fmt.Sprintf("http://api.example.test:%d/hello", w.tlsPort), ""); st != http.StatusForbidden || !strings.Contains(w.last().Reason, "port") {
		t.Errorf("http to the TLS port: %d, %+v", st, w.last())
	}
	// A tunnel to the HTTP port carries HTTP only (TestProxyTunnelsHTTP).
	if _, _, err := w.get(t, fmt.Sprintf("https://api.example.test:%d/hello", w.httpPort), "api.example.test"); err == nil || !strings.Contains(w.last().Reason, "not HTTP") {
		t.Errorf("TLS through a CONNECT to the HTTP port: %v, %+v", err, w.last())
	}
	// Not a proxy request (origin form) is a 400.
	res, err := http.Get(w.proxyURL.String() + "/hello")
	if err != nil || res.StatusCode != http.StatusBadRequest {
		t.Errorf("origin-form request: %v %v", res, err)
	}
}

// TestProxyChecksTLS: through CONNECT, a ClientHello naming another host
// than the CONNECT target (domain fronting) is refused, and so is anything
// that is not TLS.
func TestProxyChecksTLS(t *testing.T) {
	w := newWorld(t, 0)
	if _, _, err := w.get(t, fmt.Sprintf("https://api.example.test:%d/hello", w.tlsPort), "other.example.test"); err == nil {
		t.Error("a ClientHello for other.example.test went through a CONNECT to api.example.test")
	}
	if a := w.last(); a.Allowed || !strings.Contains(a.Reason, `"other.example.test"`) {
		t.Errorf("audit: %+v", a)
	}

	c, br := w.connect(t, fmt.Sprintf("CONNECT api.example.test:%d HTTP/1.1\r\nHost: api.example.test:%d\r\n\r\n", w.tlsPort, w.tlsPort))
	defer c.Close()
	fmt.Fprintf(c, "GET /hello HTTP/1.1\r\nHost: api.example.test\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(br); len(b) != 0 {
		t.Errorf("plain HTTP inside CONNECT got an answer: %q", b)
	}
	if a := w.last(); a.Allowed || !strings.HasPrefix(a.Reason, "not TLS") {
		t.Errorf("audit: %+v", a)
	}
}

// TestProxyByteBound: past the policy's bytes the connection is cut, and
// later ones are refused; Close cuts what is open.
func TestProxyByteBound(t *testing.T) {
	w := newWorld(t, 10_000)
	st, body, err := w.get(t, fmt.Sprintf("http://api.example.test:%d/big", w.httpPort), "")
	if err == nil && st == 200 && len(body) == 100_000 {
		t.Fatal("100 kB went through a 10 kB bound")
	}
	if used := w.proxy.Used(); used < 10_000 || used > 80_000 {
		t.Errorf("used %d bytes; want the bound passed, by at most a few reads", used)
	}
	st, _, _ = w.get(t, fmt.Sprintf("http://api.example.test:%d/hello", w.httpPort), "")
	if st != http.StatusForbidden || !strings.Contains(w.last().Reason, "10000 bytes") {
		t.Errorf("after the bound: %d %+v", st, w.last())
	}
	if _, _, err := w.get(t, fmt.Sprintf("https://api.example.test:%d/hello", w.tlsPort), "api.example.test"); err == nil {
		t.Error("a CONNECT after the bound went through")
	}
}

func TestProxyCloseCuts(t *testing.T) {
	w := newWorld(t, 0)
	c, br := w.connect(t, fmt.Sprintf("CONNECT api.example.test:%d HTTP/1.1\r\nHost: x\r\n\r\n", w.tlsPort))
	defer c.Close()
	tc := tls.Client(&brConn{Conn: c, r: br}, &tls.Config{InsecureSkipVerify: true, ServerName: "api.example.test"})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	w.proxy.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("after Close the tunnel still stands: %v", err)
	}
}

type brConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *brConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestProxyTunnelsHTTP: a CONNECT to an HTTP port (how Node's fetch sends
// plain HTTP through a proxy) carries HTTP whose Host is the tunnel's
// host; another Host, or TLS, is refused.
func TestProxyTunnelsHTTP(t *testing.T) {
	w := newWorld(t, 0)
	tunnel := func(hostHeader, payload string) (string, Attempt) {
		t.Helper()
		n := w.count()
		c, br := w.connect(t, fmt.Sprintf("CONNECT api.example.test:%d HTTP/1.1\r\nHost: api.example.test:%d\r\n\r\n", w.httpPort, w.httpPort))
		defer c.Close()
		if payload == "" {
			payload = "GET /hello HTTP/1.1\r\nHost: " + hostHeader + "\r\nConnection: close\r\n\r\n"
		}
		io.WriteString(c, payload)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(br)
		w.waitAttempt(t, n, 5*time.Second)
		return string(b), w.last()
	}
	for _, host := range []string{"api.example.test", fmt.Sprintf("API.example.test:%d", w.httpPort)} {
		body, a := tunnel(host, "")
		if !strings.Contains(body, "200 OK") || !strings.Contains(body, fmt.Sprintf("hello api.example.test:%d", w.httpPort)) || !a.Allowed || a.Kind != "http" || a.BytesIn == 0 || a.BytesOut == 0 {
			t.Errorf("Host %s: %q, audit %+v", host, body, a)
		}
	}
	for _, tc := range []struct{ host, payload, reason string }{
		{"other.example.test", "", "is not"},
		{"127.0.0.1", "", "is not"},
		{"", "\x16\x03\x01\x00\x05hello", "not HTTP"},
	} {
		body, a := tunnel(tc.host, tc.payload)
		if strings.Contains(body, "hello") || a.Allowed || !strings.Contains(a.Reason, tc.reason) {
			t.Errorf("Host %q: %q went through, audit %+v", tc.host, body, a)
		}
	}
	// Every request of a keep-alive tunnel is checked, not the first
	// alone: a second one naming another host is refused.
	body, a := tunnel("", "GET /hello HTTP/1.1\r\nHost: api.example.test\r\n\r\nGET /hello HTTP/1.1\r\nHost: other.example.test\r\nConnection: close\r\n\r\n")
	if strings.Count(body, "hello api.example.test") != 1 || !strings.Contains(body, "403 Forbidden") || strings.Contains(body, "other.example.test:") || a.Allowed {
		t.Errorf("a second request in the tunnel naming another host: %q, audit %+v", body, a)
	}
}
