package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

// receiver is an httptest TLS server on 127.0.0.1 that records what it got.
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []*http.Request
	// bodies[i] is got[i]'s body.
	bodies  [][]byte
	handler http.HandlerFunc // answers after recording; nil means 204
}

func newReceiver(t *testing.T, h http.HandlerFunc) *receiver {
	r := &receiver{handler: h}
	r.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, req)
		r.bodies = append(r.bodies, body)
		r.mu.Unlock()
		if r.handler == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		r.handler(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) hits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// port is the receiver's port on 127.0.0.1.
func (r *receiver) port() string {
	u, _ := url.Parse(r.srv.URL)
	return u.Port()
}

// url is https://<host>:<port><path> on the receiver, for a host the test's
// resolver maps to 127.0.0.1. The test certificate is valid for
// *.example.com and 127.0.0.1.
func (r *receiver) url(host, path string) string {
	return "https://" + net.JoinHostPort(host, r.port()) + path
}

// newTestClient returns a Client trusting the receiver's certificate.
func newTestClient(t *testing.T, g *Guard, rcv *receiver, opts Options) *Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(rcv.srv.Certificate())
	opts.Guard = g
	opts.TLSConfig = &tls.Config{RootCAs: pool}
	return NewClient(opts)
}

const testSecret = "whsec_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

func TestDeliverSignedToAllowedLoopback(t *testing.T) {
	rcv := newReceiver(t, nil)
	g := NewGuard(loopback, InterfaceNetworks)
	g.Resolver = newResolver(map[string][]string{"hooks.example.com": {"127.0.0.1"}})
	at := time.Unix(1760000000, 0)
	c := newTestClient(t, g, rcv, Options{Now: func() time.Time { return at }})

	body := []byte(`{"id":"exe_1","status":"succeeded"}`)
	status, err := c.Deliver(context.Background(), rcv.url("hooks.example.com", "/hook?token=abc"), "dlv_0123", []byte(testSecret), body)
	if err != nil || status != http.StatusNoContent {
		t.Fatalf("Deliver = %d, %v; want 204, nil", status, err)
	}
	if rcv.hits() != 1 {
		t.Fatalf("receiver got %d requests, want 1", rcv.hits())
	}
	req, got := rcv.got[0], rcv.bodies[0]
	if string(got) != string(body) {
		t.Errorf("body = %q, want %q", got, body)
	}
	for h, want := range map[string]string{
		"Content-Type":    "application/json",
		"User-Agent":      "VertalRun-Webhook/1",
		"Vertal-Delivery": "dlv_0123",
		"Vertal-Event":    "execution.finished",
	} {
		if v := req.Header.Get(h); v != want {
			t.Errorf("%s = %q, want %q", h, v, want)
		}
	}
	if err := Verify(testSecret, req.Header.Get("Vertal-Signature"), got, time.Minute, at.Add(time.Second)); err != nil {
		t.Errorf("the signature does not verify: %v (header %q)", err, req.Header.Get("Vertal-Signature"))
	}
	if !strings.HasPrefix(req.Header.Get("Vertal-Signature"), "t=1760000000,v1=") {
		t.Errorf("Vertal-Signature = %q, want t= the attempt's time", req.Header.Get("Vertal-Signature"))
	}
	if want := "hooks.example.com:" + rcv.port(); req.Host != want {
		t.Errorf("Host = %q, want %q", req.Host, want)
	}
	if req.TLS == nil || req.TLS.ServerName != "hooks.example.com" {
		t.Errorf("TLS ServerName = %v, want hooks.example.com", req.TLS)
	}
	if req.URL.RequestURI() != "/hook?token=abc" {
		t.Errorf("request URI = %q", req.URL.RequestURI())
	}
}

func TestDeliverAnswers(t *testing.T) {
	other := newReceiver(t, nil) // a redirect's target; must never be reached
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		status  int
		msg     string // "" means success
	}{
		{"200", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }, 200, ""},
		{"202", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(202) }, 202, ""},
		{"500", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) }, 500, "answered 500"},
		{"404", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(404) }, 404, "answered 404"},
		{"redirect to loopback", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.srv.URL+"/stolen", http.StatusFound)
		}, 302, "do not follow"},
		{"permanent redirect", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.srv.URL+"/stolen", http.StatusPermanentRedirect)
		}, 308, "do not follow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv := newReceiver(t, tc.handler)
			c := newTestClient(t, NewGuard(loopback, nil), rcv, Options{})
			status, err := c.Deliver(context.Background(), rcv.srv.URL+"/hook", "dlv_1", []byte(testSecret), []byte(`{}`))
			if status != tc.status {
				t.Errorf("status = %d, want %d", status, tc.status)
			}
			switch {
			case tc.msg == "" && err != nil:
				t.Errorf("Deliver = %v, want nil", err)
			case tc.msg != "" && (!errors.Is(err, ErrDelivery) || !strings.Contains(err.Error(), tc.msg)):
				t.Errorf("Deliver = %v, want ErrDelivery saying %q", err, tc.msg)
			}
		})
	}
	if other.hits() != 0 {
		t.Errorf("a redirect was followed: its target got %d requests", other.hits())
	}
}

// TestDeliverCapsTheAnswer: a receiver answering without end is read for
// 64 KiB, then the connection is closed.
func TestDeliverCapsTheAnswer(t *testing.T) {
	const huge = 64 << 20
	written := make(chan int, 1)
	rcv := newReceiver(t, func(w http.ResponseWriter, _ *http.Request) {
		chunk := make([]byte, 32<<10)
		n := 0
		for n < huge {
			m, err := w.Write(chunk)
			n += m
			if err != nil {
				break
			}
		}
		written <- n
	})
	c := newTestClient(t, NewGuard(loopback, nil), rcv, Options{})
	status, err := c.Deliver(context.Background(), rcv.srv.URL, "dlv_1", []byte(testSecret), []byte(`{}`))
	if err != nil || status != 200 {
		t.Fatalf("Deliver = %d, %v; want 200, nil", status, err)
	}
	if n := <-written; n >= huge {
		t.Errorf("the receiver wrote all %d bytes: the answer was read whole", n)
	}
}

func TestDeliverTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	// The receiver stays silent until the test ends, whatever happens to
	// the request: returning on its context's end would write an implicit
	// 200, which under -race could reach the client before its own timer.
	rcv := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
	})
	c := newTestClient(t, NewGuard(loopback, nil), rcv, Options{Timeout: 200 * time.Millisecond})
	start := time.Now()
	status, err := c.Deliver(context.Background(), rcv.srv.URL, "dlv_1", []byte(testSecret), []byte(`{}`))
	if status != 0 || !errors.Is(err, ErrDelivery) || !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Fatalf("Deliver = %d, %v; want 0 and a timeout", status, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the attempt took %s", d)
	}
}

// recordingDial replaces the Client's dial: it records every address the
// transport dials and connects to the receiver on loopback instead, so no
// test sends traffic anywhere else.
type recordingDial struct {
	mu     sync.Mutex
	dialed []string
	to     string // the receiver's 127.0.0.1:port
}

func (d *recordingDial) dial(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, address)
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, d.to)
}

// TestDeliverRefusesBeforeDialing: addresses the guard refuses are never
// dialed, without the allow flag, whatever the host's name.
func TestDeliverRefusesBeforeDialing(t *testing.T) {
	rcv := newReceiver(t, nil)
	g := NewGuard(nil, nil)
	g.Resolver = newResolver(map[string][]string{
		"hooks.example.com":    {"127.0.0.1"},
		"metadata.example.com": {"169.254.169.254"},
		"lan.example.com":      {"10.0.0.1"},
		"v6.example.com":       {"::1"},
		"localhost":            {"127.0.0.1", "::1"},
	})
	for _, raw := range []string{
		rcv.srv.URL, // https://127.0.0.1:port
		"https://127.1.2.3:" + rcv.port(),
		"https://[::1]:" + rcv.port(),
		"https://localhost:" + rcv.port(),
		rcv.url("hooks.example.com", "/"),
		rcv.url("metadata.example.com", "/latest/meta-data/"),
		rcv.url("lan.example.com", "/"),
		rcv.url("v6.example.com", "/"),
	} {
		t.Run(raw, func(t *testing.T) {
			d := &recordingDial{to: rcv.srv.Listener.Addr().String()}
			c := newTestClient(t, g, rcv, Options{})
			c.dial = d.dial
			status, err := c.Deliver(context.Background(), raw, "dlv_1", []byte(testSecret), []byte(`{}`))
			if status != 0 || !errors.Is(err, ErrRefused) {
				t.Fatalf("Deliver = %d, %v; want 0, ErrRefused", status, err)
			}
			if len(d.dialed) != 0 {
				t.Errorf("dialed %v", d.dialed)
			}
		})
	}
	if rcv.hits() != 0 {
		t.Errorf("the receiver got %d requests", rcv.hits())
	}
}

// TestDialPinnedControl: the real dialer's Control hook refuses a refused
// address, or any address but the pinned one, before connect(2): the error
// is the guard's, not the network's.
func TestDialPinnedControl(t *testing.T) {
	c := NewClient(Options{Guard: NewGuard(nil, nil), Timeout: time.Second})
	for _, a := range []string{"169.254.169.254:80", "10.0.0.1:443", "127.0.0.1:9"} {
		t.Run(a, func(t *testing.T) {
			conn, err := c.dialPinned(context.Background(), "tcp4", netip.MustParseAddrPort(a))
			if err == nil {
				conn.Close()
				t.Fatal("connected")
			}
			var we *Error
			if !errors.As(err, &we) || !errors.Is(err, ErrRefused) {
				t.Fatalf("dialPinned(%s) = %v, want the guard's refusal", a, err)
			}
		})
	}
}

// TestDeliverDNSRebinding: the host answers a public address first and
// 127.0.0.1 after. Deliver resolves once and dials the checked address
// only; the next attempt sees 127.0.0.1 and is refused before any dial.
func TestDeliverDNSRebinding(t *testing.T) {
	rcv := newReceiver(t, nil)
	r := newResolver(nil)
	r.answers["rebind.example.com"] = [][]netip.Addr{
		parseAddrs([]string{"203.0.113.7"}),
		parseAddrs([]string{"127.0.0.1"}),
	}
	g := NewGuard(nil, nil)
	g.Resolver = r
	d := &recordingDial{to: rcv.srv.Listener.Addr().String()}
	c := newTestClient(t, g, rcv, Options{})
	c.dial = d.dial
	raw := rcv.url("rebind.example.com", "/hook")

	status, err := c.Deliver(context.Background(), raw, "dlv_1", []byte(testSecret), []byte(`{}`))
	if err != nil || status != http.StatusNoContent {
		t.Fatalf("first Deliver = %d, %v; want 204", status, err)
	}
	if want := "203.0.113.7:" + rcv.port(); len(d.dialed) != 1 || d.dialed[0] != want {
		t.Fatalf("dialed %v, want only the checked address %s", d.dialed, want)
	}
	if n := r.calls["rebind.example.com"]; n != 1 {
		t.Fatalf("the host was resolved %d times in one attempt, want 1", n)
	}
	if rcv.got[0].Host != "rebind.example.com:"+rcv.port() {
		t.Errorf("Host = %q", rcv.got[0].Host)
	}

	status, err = c.Deliver(context.Background(), raw, "dlv_1", []byte(testSecret), []byte(`{}`))
	if status != 0 || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("second Deliver = %d, %v; want a loopback refusal", status, err)
	}
	if len(d.dialed) != 1 {
		t.Errorf("the rebound address was dialed: %v", d.dialed)
	}
}

// TestDeliverMappedLiteral: an IPv4-mapped literal is pinned as the IPv4
// address, so the Control hook accepts the connection it is shown.
func TestDeliverMappedLiteral(t *testing.T) {
	rcv := newReceiver(t, nil)
	c := newTestClient(t, NewGuard(loopback, nil), rcv, Options{})
	status, err := c.Deliver(context.Background(), "https://[::ffff:127.0.0.1]:"+rcv.port()+"/", "dlv_1", []byte(testSecret), []byte(`{}`))
	if err != nil || status != http.StatusNoContent {
		t.Fatalf("Deliver = %d, %v; want 204", status, err)
	}
}
