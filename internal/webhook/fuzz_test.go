package webhook

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// Fuzz targets for the webhook URL a tenant submits and the address
// guard behind it. Seeds are the f.Add calls and testdata/fuzz/<Name>/.

// internalAddr is the fuzz oracle, written apart from refusedRanges from
// netip's own classification: an address that reaches this host or its
// private networks.
func internalAddr(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	return a.IsLoopback() || a.IsPrivate() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || netip.MustParsePrefix("100.64.0.0/10").Contains(a)
}

// v4Forms are the textual IPv6 forms that carry the IPv4 address v4 and
// that a stack or gateway may route to it, and v4 itself.
func v4Forms(v4 [4]byte, zone string) []string {
	d := fmt.Sprintf("%d.%d.%d.%d", v4[0], v4[1], v4[2], v4[3])
	hi, lo := uint16(v4[0])<<8|uint16(v4[1]), uint16(v4[2])<<8|uint16(v4[3])
	forms := []string{
		d,
		"::ffff:" + d, fmt.Sprintf("::ffff:%x:%x", hi, lo), fmt.Sprintf("0:0:0:0:0:FFFF:%04X:%04X", hi, lo),
		"::" + d, fmt.Sprintf("::%x:%x", hi, lo),
		"64:ff9b::" + d, fmt.Sprintf("64:FF9B:0:0:0:0:%x:%x", hi, lo),
		fmt.Sprintf("2002:%x:%x::", hi, lo), fmt.Sprintf("2002:%04x:%04x:ffff::1", hi, lo),
	}
	if zone != "" {
		for _, f := range forms[1:] {
			forms = append(forms, f+"%"+zone)
		}
	}
	return forms
}

// FuzzGuardAddress: the guard never admits an internal address in any
// textual form that carries it (IPv4, IPv4-mapped, IPv4-compatible,
// NAT64, 6to4, with a zone), neither given directly nor as a URL's host,
// nor when a name resolves to it among public addresses; and it refuses
// every address inside the server's own networks.
func FuzzGuardAddress(f *testing.F) {
	for _, seed := range []string{"127.0.0.1", "10.1.2.3", "169.254.169.254", "100.64.0.1", "0.0.0.0", "192.168.0.1", "172.16.5.4", "224.0.0.1",
		"8.8.8.8", "::1", "fe80::1", "fc00::1", "ff02::1", "2606:4700::1111", "64:ff9b:1::1", "2001::1", "fec0::1"} {
		a := netip.MustParseAddr(seed).As16()
		f.Add(a[:], "eth0", uint8(24))
	}
	public := netip.MustParseAddr("93.184.216.34")
	f.Fuzz(func(t *testing.T, raw []byte, zone string, ownBits uint8) {
		if len(raw) < 16 {
			raw = append(raw, make([]byte, 16-len(raw))...)
		}
		a16 := netip.AddrFrom16([16]byte(raw[:16]))
		own := netip.PrefixFrom(netip.AddrFrom16([16]byte(raw[:16])).Unmap(), int(ownBits)%129).Masked()
		if !own.IsValid() {
			own = netip.PrefixFrom(a16, int(ownBits)%129).Masked()
		}
		g := NewGuard(nil, func() []netip.Prefix { return []netip.Prefix{own} })
		var texts []string
		texts = append(texts, a16.String(), a16.StringExpanded())
		texts = append(texts, v4Forms([4]byte(raw[12:16]), zone)...)
		for _, s := range texts {
			a, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			refused := errors.Is(g.Allowed(a), ErrRefused)
			for _, c := range candidates(a) {
				if (internalAddr(c) || own.Contains(c)) && !refused {
					t.Fatalf("%s (%s) admitted; own network %s", s, c, own)
				}
			}
			if !refused {
				continue
			}
			host := a.String()
			if a.Is6() {
				host = "[" + strings.ReplaceAll(host, "%", "%25") + "]"
			}
			if _, err := g.CheckURL(context.Background(), "https://"+host+"/hook"); err == nil {
				t.Fatalf("https://%s/hook admitted, but %s is refused", host, s)
			}
			g.Resolver = fixedResolver{public, a}
			if _, err := g.CheckURL(context.Background(), "https://hooks.example/x"); !errors.Is(err, ErrRefused) {
				t.Fatalf("a name resolving to %s and %s: %v, want refused", public, a, err)
			}
			g.Resolver = nil
		}
	})
}

// fixedResolver answers every name with the same addresses.
type fixedResolver []netip.Addr

func (r fixedResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return r, nil
}

// hashResolver answers a name with an IPv4 address derived from it, so
// fuzzed names reach every range.
type hashResolver struct{}

func (hashResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	h := fnv.New32a()
	h.Write([]byte(host))
	n := h.Sum32()
	return []netip.Addr{netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})}, nil
}

// FuzzCheckURL: a webhook URL that the guard accepts is an absolute https
// URL without credentials, within the length cap, whose every resolved
// address is public by the oracle, with the port of the URL (or 443).
func FuzzCheckURL(f *testing.F) {
	for _, seed := range []string{"https://example.com/hook", "http://example.com/", "https://user:pw@example.com/", "https://127.0.0.1/",
		"https://[::1]:8443/", "https://[fe80::1%25eth0]/", "https://0x7f.1/", "https://2130706433/", "https://[::ffff:127.0.0.1]/",
		"https://example.com:0/", "https://example.com:65536/", "ftp://example.com/", "//example.com", "https:///x", "https://a%00b/",
		"HTTPS://EXAMPLE.COM/", "https://example.com\\@127.0.0.1/", "https://[64:ff9b::10.0.0.1]/", "https://hooks.example:444/a?b#c"} {
		f.Add(seed)
	}
	g := NewGuard(nil, nil)
	g.Resolver = hashResolver{}
	f.Fuzz(func(t *testing.T, raw string) {
		target, err := g.CheckURL(context.Background(), raw)
		if err != nil {
			if !errors.Is(err, ErrInvalidURL) && !errors.Is(err, ErrRefused) && !errors.Is(err, ErrUnresolvable) {
				t.Fatalf("%q: error %v of no documented kind", raw, err)
			}
			return
		}
		u := target.URL
		if len(raw) > maxURLBytes || u.Scheme != "https" || u.User != nil || !u.IsAbs() || target.Host == "" || target.Host != u.Hostname() || len(target.Addrs) == 0 {
			t.Fatalf("%q accepted: %+v", raw, target)
		}
		for _, ap := range target.Addrs {
			if internalAddr(ap.Addr()) || ap.Port() == 0 || (u.Port() == "" && ap.Port() != 443) {
				t.Fatalf("%q accepted with address %s", raw, ap)
			}
			for _, c := range candidates(ap.Addr()) {
				if internalAddr(c) {
					t.Fatalf("%q accepted with address %s, which carries %s", raw, ap, c)
				}
			}
		}
	})
}

// FuzzVerify: a receiver's Vertal-Signature check never panics, accepts
// what Sign wrote for the same body and secret, and accepts any header
// only if one of its v1 values is the body's signature for its t.
func FuzzVerify(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	secret := "whsec_fuzz"
	for _, seed := range []string{Sign([]byte(secret), now, []byte(`{"id":"exe_1"}`)), "t=1,v1=00", "v1=ab", "t=,v1=", " t=1700000000 , v0=x ,v1=y",
		"t=1700000000,t=1700000000,v1=x", "t=9999999999999,v1=x", ",,", ""} {
		f.Add(seed, []byte(`{"id":"exe_1"}`))
	}
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		if err := Verify(secret, Sign([]byte(secret), now, body), body, 0, now); err != nil {
			t.Fatalf("Sign's own header refused for %q: %v", body, err)
		}
		err := Verify(secret, header, body, 0, now)
		if err == nil {
			ts, sigs, perr := parseSignature(header)
			want := signature([]byte(secret), ts, body)
			found := false
			for _, s := range sigs {
				found = found || s == want
			}
			if perr != nil || !found {
				t.Fatalf("header %q accepted for %q", header, body)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || e.Msg == "" {
			t.Fatalf("header %q: error %#v", header, err)
		}
	})
}
