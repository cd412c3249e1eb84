// Package egresstest is a fake internet for the tests of package egress
// and of the services that give code a network (execution, sandboxes):
// a DNS zone that never asks a real resolver, a guard that lets loopback
// through as if it were public, a web site on loopback, and the HTTP
// client code in a sandbox uses, which reaches its proxy through the
// proxy's socket. Every connection stays on loopback.
//
// It does not import package egress, whose own tests use it. (The
// drivers' tests of a sandbox's way out use engine/sandbox/relaytest.)
package egresstest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// Zone is a fake DNS: every test name and what it resolves to. A name
// is looked up in lower case and without its final dot; one it does not
// hold is not found.
type Zone map[string][]netip.Addr

// LookupNetIP implements the proxy's resolver.
func (z Zone) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := z[strings.ToLower(strings.TrimSuffix(host, "."))]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// Addrs parses addresses, panicking on one that is not.
func Addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// Guard is a guard that lets the prefixes through (127.0.0.1/32 standing
// for a public address, as no real guard does) and refuses everything
// else internal, as in production.
func Guard(prefixes ...string) *webhook.Guard {
	var ps []netip.Prefix
	for _, p := range prefixes {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return webhook.NewGuard(ps, nil)
}

// Port is the port of a test server's URL.
func Port(t testing.TB, rawURL string) int {
	t.Helper()
	u, _ := url.Parse(rawURL)
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Site is a web site on 127.0.0.1 that answers every request with
// "hello from <its Host>", under the names allowed.test and other.test.
type Site struct {
	// Port is its HTTP port.
	Port int
	// Zone resolves its names to 127.0.0.1, and nothing else.
	Zone Zone
	// Guard lets 127.0.0.1 through.
	Guard *webhook.Guard
}

// NewSite starts a Site, stopped when the test ends.
func NewSite(t testing.TB) *Site {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.Host)
	}))
	t.Cleanup(srv.Close)
	return &Site{
		Port:  Port(t, srv.URL),
		Zone:  Zone{"allowed.test": Addrs("127.0.0.1"), "other.test": Addrs("127.0.0.1")},
		Guard: Guard("127.0.0.1/32"),
	}
}

// URL is the site's root under host, over plain HTTP.
func (s *Site) URL(host string) string {
	return "http://" + host + ":" + strconv.Itoa(s.Port) + "/"
}

// Client is an HTTP client that sends every request to the proxy on the
// socket sock, as the agent's relay carries a program's.
func Client(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}
