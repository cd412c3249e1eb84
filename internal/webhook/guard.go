// Package webhook delivers an execution's final result to a tenant's URL,
// signed, one attempt at a time, and refuses URLs that would let a tenant
// reach what the server can reach and they cannot (SSRF).
//
// It is a pure library: the queue decides when to call Client.Deliver and
// what to do with its answer; the API calls Guard.CheckURL at submit.
//
// The address policy is applied three times: to every address the host
// resolves to (CheckURL), by dialing only the address that was checked
// (pinned: there is no second resolution for DNS rebinding to answer), and
// in a net.Dialer.Control hook that refuses a refused address again right
// before connect(2).
package webhook

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// maxURLBytes bounds a webhook URL; it is stored with every execution.
const maxURLBytes = 2048

// refusedRange is one block of addresses webhooks may not reach, with the
// name a refusal message gives it.
type refusedRange struct {
	prefix netip.Prefix
	name   string
}

// refusedRanges is the address policy, IPv4 then IPv6. The first match
// names the refusal, so narrower ranges come before the ranges holding them.
// IPv4-mapped (::ffff:a.b.c.d), NAT64 (64:ff9b::a.b.c.d) and 6to4
// (2002:aabb:ccdd::) addresses are checked as the IPv4 address they carry,
// as well as themselves (see candidates).
var refusedRanges = []refusedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},

	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	// The deprecated IPv4-compatible form ::a.b.c.d: no public host uses
	// it, and a stack that still routes it sends it to a.b.c.d.
	{netip.MustParsePrefix("::/96"), "IPv4-compatible"},
	// Local-use NAT64 (RFC 8215): the operator's own translator, whose
	// mapping to IPv4 is theirs to choose, so no embedded address can be
	// trusted to say where it leads.
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local NAT64"},
	// Teredo tunnels reach a client through a relay at the IPv4 address
	// (obfuscated) inside; no webhook receiver lives there, and a relay on
	// the server's network would deliver to whatever address the tenant
	// wrote.
	{netip.MustParsePrefix("2001::/32"), "Teredo"},
	{netip.MustParsePrefix("fc00::/7"), "private (unique local)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	// Site-local was deprecated for unique local addresses but a host may
	// still route it privately.
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// nat64 is the well-known NAT64 prefix (RFC 6052): a gateway translates
// 64:ff9b::a.b.c.d to a.b.c.d, so the IPv4 address decides.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// sixToFour is 6to4 (RFC 3056): 2002:aabb:ccdd::/48 is tunnelled to the
// IPv4 address aa.bb.cc.dd, so that address decides as well.
var sixToFour = netip.MustParsePrefix("2002::/16")

// Resolver resolves a host name; *net.Resolver is one. Tests inject a fake
// so that no test ever asks a real DNS server.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Guard is the address policy. It is safe for concurrent use once built;
// set Resolver before sharing it.
type Guard struct {
	allow []netip.Prefix
	own   func() []netip.Prefix
	// Resolver resolves webhook hosts; nil means net.DefaultResolver.
	Resolver Resolver
}

// NewGuard returns the policy. Addresses inside allow (the operator's
// --webhook-allow-cidr) are allowed whatever else they are, and may be
// reached over plain http. own, if not nil, returns the networks the
// server's interfaces are connected to (see InterfaceNetworks); every
// address inside them is refused, since a neighbour on a public subnet is
// as internal as a private one. It is called at every check, so an address
// added to an interface later is refused too.
func NewGuard(allow []netip.Prefix, own func() []netip.Prefix) *Guard {
	g := &Guard{own: own}
	for _, p := range allow {
		g.allow = append(g.allow, unmapPrefix(p))
	}
	return g
}

// InterfaceNetworks returns the connected networks of this host's
// interfaces (each address with its prefix length, masked), for NewGuard's
// own. If the interfaces cannot be listed it returns what it has (the fixed
// ranges still hold: loopback and private addresses are refused anyway).
func InterfaceNetworks() []netip.Prefix {
	addrs, _ := net.InterfaceAddrs()
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ones, bits := n.Mask.Size()
		switch {
		case bits == 32: // an IPv4 mask, whether the address is 4 or 16 bytes
			ip = ip.Unmap()
		case bits == 0: // a non-canonical mask: refuse at least the address
			ip, ones = ip.Unmap(), ip.Unmap().BitLen()
		}
		out = append(out, unmapPrefix(netip.PrefixFrom(ip, ones)))
	}
	return out
}

// unmapPrefix turns ::ffff:a.b.c.d/n (n >= 96) into a.b.c.d/(n-96), so that
// allow ranges are compared with unmapped addresses.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96).Masked()
	}
	return p
}

// candidates returns the forms of a that must all be acceptable: a itself
// (unmapped, without zone) and, for NAT64 and 6to4, the IPv4 address it
// carries.
func candidates(a netip.Addr) []netip.Addr {
	a = a.WithZone("").Unmap()
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return []netip.Addr{a, netip.AddrFrom4([4]byte(b[12:]))}
	case sixToFour.Contains(a):
		return []netip.Addr{a, netip.AddrFrom4([4]byte(b[2:6]))}
	}
	return []netip.Addr{a}
}

// Allowed says whether a webhook may connect to a: nil, or an *Error of
// kind ErrRefused naming the range.
func (g *Guard) Allowed(a netip.Addr) error {
	if err := g.check(a); err != nil {
		return err
	}
	return nil
}

func (g *Guard) check(a netip.Addr) *Error {
	if !a.IsValid() {
		return newError(ErrRefused, nil, "is not a valid IP address")
	}
	var own []netip.Prefix
	if g.own != nil {
		own = g.own()
	}
	for _, c := range candidates(a) {
		if g.inAllowed(c) {
			continue
		}
		for _, r := range refusedRanges {
			if r.prefix.Contains(c) {
				return g.refusal(a, c, fmt.Sprintf("%s (%s)", r.name, r.prefix))
			}
		}
		for _, o := range own {
			if o.Contains(c) {
				return g.refusal(a, c, fmt.Sprintf("on a network of this server (%s)", o))
			}
		}
	}
	return nil
}

// refusal names a, and c when it is the IPv4 address a carries.
func (g *Guard) refusal(a, c netip.Addr, why string) *Error {
	if a.WithZone("") != c {
		return newError(ErrRefused, nil, "address %s (%s) is refused for webhooks: %s", a, c, why)
	}
	return newError(ErrRefused, nil, "address %s is refused for webhooks: %s", a, why)
}

// inAllowed says whether a is inside an allow range.
func (g *Guard) inAllowed(a netip.Addr) bool {
	for _, p := range g.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// allowsHTTP says whether plain http may be used to a: only when every form
// of it is inside an allow range.
func (g *Guard) allowsHTTP(a netip.Addr) bool {
	for _, c := range candidates(a) {
		if !g.inAllowed(c) {
			return false
		}
	}
	return true
}

// Control is a net.Dialer.Control hook: it refuses, before connect(2), a
// connection to an address the guard refuses, whoever asked for it.
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return newError(ErrRefused, err, "cannot check the address %q", address)
	}
	return g.Allowed(ap.Addr())
}

// Target is a checked webhook URL: every address its host resolved to is
// allowed, and a delivery dials Addrs[0] and nothing else.
type Target struct {
	URL   *url.URL
	Host  string           // the host name (or IP literal) of the URL, for Host and TLS ServerName
	Addrs []netip.AddrPort // every resolved address with the port, all allowed
}

// CheckURL parses raw, resolves its host and checks every address. The
// error is an *Error of kind ErrInvalidURL, ErrRefused or ErrUnresolvable,
// whose message is written to follow the field name ("webhook_url: ...").
func (g *Guard) CheckURL(ctx context.Context, raw string) (*Target, error) {
	u, err := parseURL(raw)
	if err != nil {
		return nil, err
	}
	host := u.Hostname()
	port := uint16(443)
	if u.Scheme == "http" {
		port = 80
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return nil, newError(ErrInvalidURL, err, "port %q is not a number from 1 to 65535", p)
		}
		port = uint16(n)
	}
	addrs, err := g.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	t := &Target{URL: u, Host: host}
	for _, a := range addrs {
		if err := g.check(a); err != nil {
			if a.String() != host {
				err.Msg = fmt.Sprintf("host %q resolves to %s", host, err.Msg)
			}
			return nil, err
		}
		if u.Scheme == "http" && !g.allowsHTTP(a) {
			return nil, newError(ErrInvalidURL, nil,
				"must use https: http is allowed only to addresses inside --webhook-allow-cidr, and %s is not", a)
		}
		// Unmapped, so that the address the dialer reports to the
		// Control hook is the pinned one written the same way.
		t.Addrs = append(t.Addrs, netip.AddrPortFrom(a.Unmap(), port))
	}
	return t, nil
}

// parseURL checks the shape of raw without resolving anything.
func parseURL(raw string) (*url.URL, error) {
	if len(raw) > maxURLBytes {
		return nil, newError(ErrInvalidURL, nil, "is longer than %d bytes", maxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, newError(ErrInvalidURL, err, "is not a valid URL")
	}
	switch {
	case !u.IsAbs() || u.Opaque != "":
		return nil, newError(ErrInvalidURL, nil, "must be an absolute URL such as https://example.com/hook")
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, newError(ErrInvalidURL, nil, "must use https, not %q", u.Scheme)
	case u.User != nil:
		return nil, newError(ErrInvalidURL, nil, "must not contain credentials (user:password@); put a token in the path or query instead")
	case u.Hostname() == "":
		return nil, newError(ErrInvalidURL, nil, "has no host")
	}
	return u, nil
}

// resolve returns the addresses of host: the literal itself, or what the
// resolver answers.
func (g *Guard) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	if strings.Contains(host, "%") {
		return nil, newError(ErrInvalidURL, nil, "host %q is not a valid host name", host)
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, newError(ErrUnresolvable, err, "host %q does not resolve", host)
	}
	if len(addrs) == 0 {
		return nil, newError(ErrUnresolvable, nil, "host %q resolves to no address", host)
	}
	return addrs, nil
}
