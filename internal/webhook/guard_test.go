package webhook

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// fakeResolver answers from a table and counts its calls; a host it does
// not know does not resolve. No test asks a real DNS server.
type fakeResolver struct {
	answers map[string][][]netip.Addr // host -> answer of the 1st call, 2nd call, ... (the last repeats)
	calls   map[string]int
}

func newResolver(hosts map[string][]string) *fakeResolver {
	r := &fakeResolver{answers: map[string][][]netip.Addr{}, calls: map[string]int{}}
	for h, addrs := range hosts {
		r.answers[h] = [][]netip.Addr{parseAddrs(addrs)}
	}
	return r
}

func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	seq, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.9.9.9:53", IsNotFound: true}
	}
	i := min(r.calls[host], len(seq)-1)
	r.calls[host]++
	return seq[i], nil
}

// mapped and nat64 give the IPv6 forms that carry an IPv4 address.
func mapped(v4 string) string { return "::ffff:" + v4 }
func nat64Of(v4 string) string {
	a := netip.MustParseAddr(v4).As4()
	return netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: a[0], a[1], a[2], a[3]}).String()
}

func TestGuardRefusesEveryRange(t *testing.T) {
	g := NewGuard(nil, nil)
	// One address at each edge of every refused IPv4 range, and the range
	// name the refusal must give.
	v4 := []struct{ addr, name string }{
		{"0.0.0.0", "unspecified"},
		{"0.255.255.255", "unspecified"},
		{"10.0.0.1", "private"},
		{"10.255.255.255", "private"},
		{"100.64.0.1", "carrier-grade NAT"},
		{"100.127.255.254", "carrier-grade NAT"},
		{"127.0.0.1", "loopback"},
		{"127.1.2.3", "loopback"},
		{"169.254.169.254", "cloud metadata"},
		{"169.254.0.1", "link-local"},
		{"172.16.0.1", "private"},
		{"172.31.255.254", "private"},
		{"192.0.0.1", "IETF protocol assignments"},
		{"192.0.0.170", "IETF protocol assignments"},
		{"192.168.0.1", "private"},
		{"192.168.255.255", "private"},
		{"198.18.0.1", "benchmarking"},
		{"198.19.255.254", "benchmarking"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"240.0.0.1", "reserved"},
		{"255.255.255.254", "reserved"},
		{"255.255.255.255", "broadcast"},
	}
	for _, tc := range v4 {
		// Each address is refused as itself, IPv4-mapped, and through NAT64.
		for _, form := range []string{tc.addr, mapped(tc.addr), nat64Of(tc.addr)} {
			t.Run(form, func(t *testing.T) {
				err := g.Allowed(netip.MustParseAddr(form))
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("Allowed(%s) = %v, want ErrRefused", form, err)
				}
				if !strings.Contains(err.Error(), tc.name) {
					t.Errorf("Allowed(%s) = %q, want it to name %q", form, err, tc.name)
				}
			})
		}
	}
	v6 := []struct{ addr, name string }{
		{"::", "unspecified"},
		{"::1", "loopback"},
		{"fc00::1", "unique local"},
		{"fd12:3456:789a::1", "unique local"},
		{"fe80::1", "link-local"},
		{"fe80::1%eth0", "link-local"},
		{"febf:ffff::1", "link-local"},
		{"fec0::1", "site-local"},
		{"ff02::1", "multicast"},
		{"ff05::1:3", "multicast"},
	}
	for _, tc := range v6 {
		t.Run(tc.addr, func(t *testing.T) {
			err := g.Allowed(netip.MustParseAddr(tc.addr))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("Allowed(%s) = %v, want ErrRefused naming %q", tc.addr, err, tc.name)
			}
		})
	}
	if err := g.Allowed(netip.Addr{}); !errors.Is(err, ErrRefused) {
		t.Errorf("Allowed(zero Addr) = %v, want ErrRefused", err)
	}
}

func TestGuardAllowsPublicAddresses(t *testing.T) {
	g := NewGuard(nil, nil)
	for _, a := range []string{
		"8.8.8.8", "1.1.1.1", "100.63.255.255", "100.128.0.1", "172.15.255.255", "172.32.0.1",
		"169.253.255.255", "192.0.1.1", "198.17.255.255", "198.20.0.1", "223.255.255.255", "11.0.0.1",
		mapped("8.8.8.8"), nat64Of("1.1.1.1"),
		"2606:4700:4700::1111", "2001:4860:4860::8888", "fbff::1", "fe00::1",
	} {
		t.Run(a, func(t *testing.T) {
			if err := g.Allowed(netip.MustParseAddr(a)); err != nil {
				t.Fatalf("Allowed(%s) = %v, want nil", a, err)
			}
		})
	}
}

func TestGuardOwnNetworks(t *testing.T) {
	// Public networks, as a host with a public address on its interface
	// has: its neighbours are refused, not only its own address.
	own := func() []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:5::/64")}
	}
	g := NewGuard(nil, own)
	checkRefusals(t, g, []addrCase{
		{"203.0.113.9", true},
		{"203.0.113.10", true}, // a neighbour on the connected subnet
		{"203.0.113.255", true},
		{mapped("203.0.113.77"), true},
		{nat64Of("203.0.113.77"), true},
		{"2002:cb00:7101::1", true}, // 6to4 of 203.0.113.1
		{"2001:db8:5::9", true},
		{"2001:db8:5::ffff:1", true},
		{"203.0.114.1", false},
		{"203.0.112.255", false},
		{"2001:db8:6::1", false},
	})
	err := g.Allowed(netip.MustParseAddr("203.0.113.10"))
	if err == nil || !strings.Contains(err.Error(), "network of this server (203.0.113.0/24)") {
		t.Errorf("message %v does not name the server's network", err)
	}
}

// TestInterfaceNetworks: the real host's networks hold each of its
// interface addresses and are masked, so a whole subnet is refused.
func TestInterfaceNetworks(t *testing.T) {
	nets := InterfaceNetworks()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if len(nets) != len(addrs) {
		t.Fatalf("InterfaceNetworks = %v for the interface addresses %v", nets, addrs)
	}
	g := NewGuard(nil, InterfaceNetworks)
	for i, a := range addrs {
		n := a.(*net.IPNet)
		ip, _ := netip.AddrFromSlice(n.IP)
		ip = ip.Unmap()
		if nets[i] != nets[i].Masked() || !nets[i].Contains(ip) {
			t.Errorf("network %v for %v is not the masked subnet holding it", nets[i], n)
		}
		if err := g.Allowed(ip); !errors.Is(err, ErrRefused) {
			t.Errorf("Allowed(%v) = %v, want the host's own address refused", ip, err)
		}
	}
}

// TestGuardEmbeddedIPv4: IPv6 forms that lead to an IPv4 address (or to a
// translator the operator controls) are refused like that address.
func TestGuardEmbeddedIPv4(t *testing.T) {
	g := NewGuard(nil, nil)
	for _, tc := range []struct{ addr, name string }{
		{"64:ff9b:1::a00:1", "local NAT64"},
		{"64:ff9b:1::808:808", "local NAT64"}, // whatever it embeds: the mapping is local
		{"64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "local NAT64"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"::10.0.0.1", "IPv4-compatible"},
		{"::8.8.8.8", "IPv4-compatible"},
		{"::169.254.169.254", "IPv4-compatible"},
		{"2002:7f00:1::1", "loopback"},          // 6to4 of 127.0.0.1
		{"2002:a00:1::", "private"},             // 6to4 of 10.0.0.1
		{"2002:a9fe:a9fe::1", "cloud metadata"}, // 6to4 of 169.254.169.254
		{"2002:c0a8:101:5::1", "private"},       // 6to4 of 192.168.1.1
		{"2002:6440:1::1", "carrier-grade NAT"}, // 6to4 of 100.64.0.1
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"},
		{"2001::1", "Teredo"},
		{nat64Of("10.0.0.1"), "private"},
		{nat64Of("169.254.169.254"), "cloud metadata"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			err := g.Allowed(netip.MustParseAddr(tc.addr))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.name) {
				t.Fatalf("Allowed(%s) = %v, want ErrRefused naming %q", tc.addr, err, tc.name)
			}
		})
	}
	checkRefusals(t, g, []addrCase{
		{"2002:808:808::1", false}, // 6to4 of a public address
		{nat64Of("8.8.8.8"), false},
		{"64:ff9b:2::1", false}, // outside the local-use /48
		{"2001:1::1", false},    // outside Teredo's /32
		{"::ffff:8.8.8.8", false},
	})
}

type addrCase struct {
	addr    string
	refused bool
}

func checkRefusals(t *testing.T, g *Guard, cases []addrCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.addr, func(t *testing.T) {
			err := g.Allowed(netip.MustParseAddr(tc.addr))
			if got := errors.Is(err, ErrRefused); got != tc.refused {
				t.Fatalf("Allowed(%s) = %v, want refused=%v", tc.addr, err, tc.refused)
			}
		})
	}
}

func TestGuardAllowCIDR(t *testing.T) {
	allow := []netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("::ffff:10.1.0.0/112"), // written mapped: means 10.1.0.0/16
		netip.MustParsePrefix("fd00:1::/32"),
	}
	// The server's own loopback address is allowed too once loopback is.
	own := func() []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("192.168.1.0/24")}
	}
	g := NewGuard(allow, own)
	checkRefusals(t, g, []addrCase{
		{"127.0.0.1", false},
		{"127.9.9.9", false},
		{mapped("127.0.0.1"), false},
		{"10.1.2.3", false},
		{mapped("10.1.2.3"), false},
		{"fd00:1::5", false},
		{"10.2.0.1", true},    // outside the allowed /16
		{"192.168.1.5", true}, // private and own, not allowed
		{"::1", true},         // IPv6 loopback was not allowed
		{"fd00:2::5", true},
		{"169.254.169.254", true},
		{nat64Of("127.0.0.1"), false}, // NAT64 is judged by the IPv4 address it carries
		{nat64Of("10.2.0.1"), true},
	})
}

func TestCheckURL(t *testing.T) {
	r := newResolver(map[string][]string{
		"hooks.example.com":  {"93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"},
		"localhost":          {"127.0.0.1", "::1"},
		"loopback.example":   {"127.0.0.1"},
		"mixed.example":      {"93.184.216.34", "10.0.0.7"},
		"metadata.example":   {"169.254.169.254"},
		"mapped.example":     {"::ffff:127.0.0.1"},
		"empty.example":      {},
		"allowed.lan":        {"10.20.30.40"},
		"partly-allowed.lan": {"10.20.30.40", "93.184.216.34"},
		"sixtofour.example":  {"2002:a9fe:a9fe::1"},
	})
	g := NewGuard([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, nil)
	g.Resolver = r
	for _, tc := range []struct {
		url       string
		kind      error  // nil: accepted
		msg       string // part of the message
		wantAddrs []string
	}{
		{url: "https://hooks.example.com/hook?x=1", wantAddrs: []string{"93.184.216.34:443", "[2606:2800:220:1:248:1893:25c8:1946]:443"}},
		{url: "https://hooks.example.com:8443/h", wantAddrs: []string{"93.184.216.34:8443", "[2606:2800:220:1:248:1893:25c8:1946]:8443"}},
		{url: "https://93.184.216.34/h", wantAddrs: []string{"93.184.216.34:443"}},
		{url: "https://[::ffff:93.184.216.34]/h", wantAddrs: []string{"93.184.216.34:443"}},
		{url: "http://allowed.lan/h", wantAddrs: []string{"10.20.30.40:80"}},
		{url: "https://allowed.lan/h", wantAddrs: []string{"10.20.30.40:443"}},

		{url: "/relative/path", kind: ErrInvalidURL, msg: "absolute"},
		{url: "hooks.example.com/hook", kind: ErrInvalidURL, msg: "absolute"},
		{url: "ftp://hooks.example.com/", kind: ErrInvalidURL, msg: `not "ftp"`},
		{url: "mailto:a@example.com", kind: ErrInvalidURL, msg: "absolute"},
		{url: "http://hooks.example.com/h", kind: ErrInvalidURL, msg: "must use https"},
		{url: "http://partly-allowed.lan/h", kind: ErrInvalidURL, msg: "must use https"},
		{url: "https://user:pw@hooks.example.com/h", kind: ErrInvalidURL, msg: "credentials"},
		{url: "https://user@hooks.example.com/h", kind: ErrInvalidURL, msg: "credentials"},
		{url: "https:///path", kind: ErrInvalidURL, msg: "no host"},
		{url: "https://:443/path", kind: ErrInvalidURL, msg: "no host"},
		{url: "https://hooks.example.com:0/", kind: ErrInvalidURL, msg: "port"},
		{url: "https://hooks.example.com:99999/", kind: ErrInvalidURL, msg: "port"},
		{url: "https://hooks.example.com/%zz", kind: ErrInvalidURL, msg: "not a valid URL"},
		{url: "https://hooks.example.com/" + strings.Repeat("a", maxURLBytes), kind: ErrInvalidURL, msg: "longer than"},

		{url: "https://127.0.0.1/h", kind: ErrRefused, msg: "loopback"},
		{url: "https://127.1.2.3/h", kind: ErrRefused, msg: "loopback"},
		{url: "https://[::1]/h", kind: ErrRefused, msg: "loopback"},
		{url: "https://[::ffff:127.0.0.1]/h", kind: ErrRefused, msg: "loopback"},
		{url: "https://[64:ff9b::a9fe:a9fe]/h", kind: ErrRefused, msg: "metadata"},
		{url: "https://[fe80::1%25eth0]/h", kind: ErrRefused, msg: "link-local"},
		{url: "https://169.254.169.254/latest/meta-data/", kind: ErrRefused, msg: "metadata"},
		{url: "https://localhost/h", kind: ErrRefused, msg: `host "localhost" resolves to address 127.0.0.1`},
		{url: "https://loopback.example:8443/h", kind: ErrRefused, msg: "loopback"},
		{url: "https://mixed.example/h", kind: ErrRefused, msg: "10.0.0.7 is refused for webhooks: private (10.0.0.0/8)"},
		{url: "https://metadata.example/h", kind: ErrRefused, msg: "cloud metadata"},
		{url: "https://mapped.example/h", kind: ErrRefused, msg: "loopback"},
		{url: "https://100.64.0.1/h", kind: ErrRefused, msg: "carrier-grade NAT"},
		{url: "https://[64:ff9b:1::a00:1]/h", kind: ErrRefused, msg: "local NAT64"},
		{url: "https://[::127.0.0.1]/h", kind: ErrRefused, msg: "IPv4-compatible"},
		{url: "https://[2002:7f00:1::1]/h", kind: ErrRefused, msg: "(127.0.0.1) is refused for webhooks: loopback"},
		{url: "https://sixtofour.example/h", kind: ErrRefused, msg: `host "sixtofour.example" resolves to address 2002:a9fe:a9fe::1 (169.254.169.254)`},
		{url: "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/h", kind: ErrRefused, msg: "Teredo"},

		{url: "https://nowhere.example/h", kind: ErrUnresolvable, msg: `host "nowhere.example" does not resolve`},
		{url: "https://empty.example/h", kind: ErrUnresolvable, msg: "no address"},
	} {
		name := tc.url
		if len(name) > 60 {
			name = name[:60]
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			target, err := g.CheckURL(ctx, tc.url)
			if tc.kind == nil {
				if err != nil {
					t.Fatalf("CheckURL = %v, want it accepted", err)
				}
				var got []string
				for _, a := range target.Addrs {
					got = append(got, a.String())
				}
				if strings.Join(got, " ") != strings.Join(tc.wantAddrs, " ") {
					t.Errorf("Addrs = %v, want %v", got, tc.wantAddrs)
				}
				return
			}
			if !errors.Is(err, tc.kind) {
				t.Fatalf("CheckURL = %v, want kind %v", err, tc.kind)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q does not contain %q", err, tc.msg)
			}
			if strings.Contains(err.Error(), "10.9.9.9") {
				t.Errorf("message %q names the resolver", err)
			}
		})
	}
}

// TestControlRefusesBeforeConnecting: the Control hook refuses refused
// addresses. Called directly for every family, and inside a real
// net.Dialer, where Go calls it after socket(2) and before connect(2), so
// the refusal comes from the guard and no packet leaves the host.
func TestControlRefusesBeforeConnecting(t *testing.T) {
	g := NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nil)
	for _, tc := range []struct {
		address string
		refused bool
	}{
		{"10.0.0.1:443", true},
		{"172.16.5.4:443", true},
		{"192.168.1.1:80", true},
		{"100.64.0.1:443", true},
		{"169.254.169.254:80", true},
		{"[::ffff:169.254.169.254]:80", true},
		{"[64:ff9b::a00:1]:443", true},
		{"[fd00::1]:443", true},
		{"[fe80::1%eth0]:443", true},
		{"[::1]:443", true},
		{"127.0.0.1:443", false}, // allowed by the CIDR
		{"93.184.216.34:443", false},
		{"not-an-address", true},
	} {
		t.Run(tc.address, func(t *testing.T) {
			err := g.Control("tcp", tc.address, nil)
			if got := errors.Is(err, ErrRefused); got != tc.refused {
				t.Fatalf("Control(%s) = %v, want refused=%v", tc.address, err, tc.refused)
			}
		})
	}
	for _, address := range []string{"10.0.0.1:443", "169.254.169.254:80", "192.168.0.1:80"} {
		t.Run("dial "+address, func(t *testing.T) {
			d := net.Dialer{Control: g.Control, Timeout: time.Second}
			conn, err := d.Dial("tcp4", address)
			if err == nil {
				conn.Close()
				t.Fatalf("dialed %s", address)
			}
			var we *Error
			if !errors.As(err, &we) || !errors.Is(err, ErrRefused) {
				t.Fatalf("Dial(%s) = %v, want the guard's refusal", address, err)
			}
		})
	}
}
