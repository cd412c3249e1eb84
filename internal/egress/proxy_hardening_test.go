package egress

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/egress/egresstest"
)

// TestProxyTunnelHeadBounded: through a CONNECT to an HTTP port, the
// proxy reads at most about maxHead bytes of request head: a sandbox
// sending an endless request line gets 431 at once, not buffered (in the
// server's memory) until a timeout.
func TestProxyTunnelHeadBounded(t *testing.T) {
	w := newWorld(t, 0)
	c, br := w.connect(t, fmt.Sprintf("CONNECT api.example.test:%d HTTP/1.1\r\n\r\n", w.httpPort))
	defer c.Close()
	go func() {
		io.WriteString(c, "GET /"+strings.Repeat("a", 4*maxHead)) // no end of line, ever
	}()
	_ = c.SetReadDeadline(time.Now().Add(time.Second)) // the read timeout is 2 s
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("a request head of 256 KiB got no answer within 1 s: %v", err)
	}
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("an endless request head: %s; want 431", res.Status)
	}
}

// TestProxyAuditClipped: the host and reason an attempt logs are bounded,
// whatever the sandbox writes as a host.
func TestProxyAuditClipped(t *testing.T) {
	w := newWorld(t, 0)
	n := w.count()
	c, err := net.Dial("tcp", w.proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host := strings.Repeat("é", 50_000) // two bytes each: the cut must not split one
	fmt.Fprintf(c, "CONNECT %s:%d HTTP/1.1\r\n\r\n", host, w.tlsPort)
	a, ok := w.waitAttempt(t, n, 5*time.Second)
	if !ok {
		t.Fatal("no attempt logged")
	}
	if len(a.Host) > maxAuditText || len(a.Reason) > maxAuditText || !strings.HasSuffix(a.Host, "…") || !strings.HasPrefix(host, strings.TrimSuffix(a.Host, "…")) {
		t.Errorf("audit host %d bytes, reason %d bytes (%q); want at most %d, cut on a rune", len(a.Host), len(a.Reason), a.Reason[:min(len(a.Reason), 80)], maxAuditText)
	}
}

// TestProxyNoCompression: plain HTTP goes through as the server sent it:
// the proxy does not ask for gzip on the sandbox's behalf (and then
// decompress, on the server's CPU, what the byte bound counted
// compressed).
func TestProxyNoCompression(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	big := strings.Repeat("z", 1<<20)
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			io.WriteString(rw, "plain")
			return
		}
		rw.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(rw)
		io.WriteString(gz, big)
		gz.Close()
	}))
	defer hs.Close()
	pol, err := Parse([]string{"api.example.test"}, 50_000)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProxy(Options{Policy: pol, Guard: egresstest.Guard("127.0.0.1/32"),
		Resolver: egresstest.Zone{"api.example.test": egresstest.Addrs("127.0.0.1")}, HTTPPorts: []int{egresstest.Port(t, hs.URL)}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ps := httptest.NewServer(p)
	defer ps.Close()
	c, err := net.Dial("tcp", strings.TrimPrefix(ps.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://api.example.test:%d/ HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n", egresstest.Port(t, hs.URL))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "" || !strings.HasSuffix(string(b), "\r\n\r\nplain") {
		t.Errorf("the server was asked with Accept-Encoding %q; the sandbox got %d bytes (%q...); want no encoding asked, \"plain\"", asked, len(b), b[:min(len(b), 60)])
	}
}

// TestProxyIPv6AddressRule: an address rule for an IPv6 address allows
// plain HTTP to it on the default port, written as URLs write it (in
// brackets, no port).
func TestProxyIPv6AddressRule(t *testing.T) {
	pol, err := Parse([]string{"::1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []Attempt
	var mu sync.Mutex
	p, err := NewProxy(Options{Policy: pol, Guard: egresstest.Guard("::1/128"),
		Resolver: egresstest.Zone{}, Log: func(a Attempt) { mu.Lock(); got = append(got, a); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// What listens on [::1]:80, if anything, is not the point: the
	// decision is.
	req := httptest.NewRequest("GET", "http://[::1]/", nil)
	p.ServeHTTP(httptest.NewRecorder(), req)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !got[0].Allowed || got[0].Host != "::1" || got[0].Addr != "[::1]:80" {
		t.Errorf("http://[::1]/ with the rule ::1: %+v; want allowed, dialling [::1]:80", got)
	}
}

type recordingResolver struct {
	mu    sync.Mutex
	asked []string
}

func (r *recordingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, host)
	return egresstest.Addrs("127.0.0.1"), nil
}

// TestProxyResolvesCheckedName: the name the proxy resolves is the one
// the allowlist matched (IDNA's ASCII, lower case), not the host as the
// sandbox spelled it.
func TestProxyResolvesCheckedName(t *testing.T) {
	pol, err := Parse([]string{"api.example.test"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	res := &recordingResolver{}
	p, err := NewProxy(Options{Policy: pol, Guard: egresstest.Guard("127.0.0.1/32"), Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, host := range []string{"API\u3002example\u3002test", "api.Example.test."} {
		if _, err := p.decide(context.Background(), host, 443, []int{443}); err != nil {
			t.Errorf("%q: %v", host, err)
		}
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if len(res.asked) != 2 || res.asked[0] != "api.example.test" || res.asked[1] != "api.example.test" {
		t.Errorf("resolved %q; want the checked name, api.example.test, twice", res.asked)
	}
}
