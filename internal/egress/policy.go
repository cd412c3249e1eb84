// Package egress decides and carries the network a sandbox may reach
// (issue 25): an allowlist of domain names and address ranges, checked
// outside the sandbox, by a proxy that resolves and dials the allowed
// name itself and refuses internal addresses whatever a name resolves to.
//
// This file is the policy: what an operator allows a plan, and what a
// request may narrow it to. proxy.go is the host-side proxy that enforces
// it for HTTP (by Host) and TLS (by CONNECT target and SNI).
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// MaxRules bounds an allowlist, a plan's or a request's.
const MaxRules = 64

// ErrWiden is the error of a request that asks for more than its plan
// allows.
var ErrWiden = errors.New("egress: the request asks for more than the plan allows")

// Rule is one allowlist entry: a domain name (exactly that name), a
// wildcard ("*.example.com": every name under example.com, not
// example.com itself), or an address range ("203.0.113.0/24", or one
// address).
type Rule struct {
	Name     string       // the name, or the wildcard's suffix, in ASCII lower case
	Wildcard bool         // Name's subdomains
	Prefix   netip.Prefix // valid for an address rule
}

// String is the rule as it is written.
func (r Rule) String() string {
	switch {
	case r.Prefix.IsValid():
		if r.Prefix.IsSingleIP() {
			return r.Prefix.Addr().String()
		}
		return r.Prefix.String()
	case r.Wildcard:
		return "*." + r.Name
	}
	return r.Name
}

// Policy is what a sandbox may reach: nothing when Allow is empty.
type Policy struct {
	Allow []Rule
	// MaxBytes bounds the bytes in and out of all the sandbox's
	// connections together; past it they are cut. 0 means no bound.
	MaxBytes int64
}

// Enabled says whether the policy allows anything.
func (p Policy) Enabled() bool { return len(p.Allow) > 0 }

// Strings is the allowlist as written.
func (p Policy) Strings() []string {
	out := make([]string, len(p.Allow))
	for i, r := range p.Allow {
		out[i] = r.String()
	}
	return out
}

// Parse reads an allowlist; every entry must be a rule (ParseRule), and
// there are at most MaxRules.
func Parse(allow []string, maxBytes int64) (Policy, error) {
	if len(allow) > MaxRules {
		return Policy{}, fmt.Errorf("egress: %d rules; at most %d", len(allow), MaxRules)
	}
	if maxBytes < 0 {
		return Policy{}, fmt.Errorf("egress: max_bytes %d is negative", maxBytes)
	}
	p := Policy{MaxBytes: maxBytes}
	for _, s := range allow {
		r, err := ParseRule(s)
		if err != nil {
			return Policy{}, err
		}
		if !slices.Contains(p.Allow, r) {
			p.Allow = append(p.Allow, r)
		}
	}
	return p, nil
}

// ParseRule reads one allowlist entry. Names are checked and lowered as
// DNS looks them up (IDNA, so "bücher.example" is "xn--bcher-kva.example");
// a wildcard is "*." and at least two labels; an address range is CIDR
// notation or one address, IPv4 or IPv6.
func ParseRule(s string) (Rule, error) {
	if len(s) > maxRuleBytes {
		// Refused before anything echoes it whole.
		return Rule{}, fmt.Errorf("egress: %q... is %d bytes; a rule is at most %d (a name is at most 253 characters)", clipRule(s), len(s), maxRuleBytes)
	}
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		if a.Zone() != "" {
			return Rule{}, fmt.Errorf("egress: %q: an address with a zone", s)
		}
		return Rule{Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	if strings.Contains(s, "://") {
		return Rule{}, fmt.Errorf("egress: %q is a URL; a rule is a host name (pypi.org), *.suffix or an address range (203.0.113.0/24)", s)
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Rule{}, fmt.Errorf("egress: %q is not an address range: write an address, a slash and a prefix length, like 203.0.113.0/24 or 2001:db8::/32", s)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
		}
		return Rule{Prefix: p.Masked()}, nil
	}
	wild := false
	name := s
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		wild, name = true, rest
	}
	n, err := normalName(name)
	if err != nil {
		return Rule{}, fmt.Errorf("egress: %q: %v", s, err)
	}
	if wild && !strings.Contains(n, ".") {
		return Rule{}, fmt.Errorf("egress: %q: a wildcard needs at least two labels after \"*.\" (a whole top-level domain is too wide)", s)
	}
	return Rule{Name: n, Wildcard: wild}, nil
}

// maxRuleBytes bounds a rule: "*." and the longest name (253), with a
// trailing dot.
const maxRuleBytes = 256

// clipRule is the start of a rule too long to echo, valid UTF-8.
func clipRule(s string) string {
	s = s[:40]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// normalName is a host name as DNS looks it up: ASCII, lower case, no
// trailing dot, each label a letter-digit-hyphen label.
func normalName(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	if s == "" || strings.ContainsAny(s, "*/:@ \t") {
		return "", errors.New("not a domain name")
	}
	if !utf8.ValidString(s) {
		return "", errors.New("not UTF-8")
	}
	a, err := idna.Lookup.ToASCII(s)
	if err != nil {
		return "", fmt.Errorf("not a domain name: %v", err)
	}
	a = strings.ToLower(a)
	// What reads back differently is no name: an A-label must decode.
	if _, err := idna.Lookup.ToUnicode(a); err != nil {
		return "", fmt.Errorf("not a domain name: %v", err)
	}
	if len(a) > 253 {
		return "", errors.New("a name longer than 253 characters")
	}
	for _, l := range strings.Split(a, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("label %q", l)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("label %q", l)
			}
		}
	}
	if _, err := netip.ParseAddr(a); err == nil {
		return "", errors.New("an address, not a name")
	}
	return a, nil
}

// covers says whether r allows everything o does.
func (r Rule) covers(o Rule) bool {
	switch {
	case r.Prefix.IsValid() || o.Prefix.IsValid():
		return r.Prefix.IsValid() && o.Prefix.IsValid() && r.Prefix.Bits() <= o.Prefix.Bits() && r.Prefix.Contains(o.Prefix.Addr())
	case !r.Wildcard:
		return !o.Wildcard && r.Name == o.Name
	}
	// *.b covers a.b, *.b and *.a.b, not b.
	return o.Wildcard && o.Name == r.Name || strings.HasSuffix(o.Name, "."+r.Name)
}

// Narrow is the policy a request asking for allow gets under p: exactly
// those rules, each of which p must cover (else ErrWiden, naming the
// first that it does not), with p's byte bound. A request that names no
// rules gets p itself.
func (p Policy) Narrow(allow []string) (Policy, error) {
	if allow == nil {
		return p, nil
	}
	req, err := Parse(allow, 0)
	if err != nil {
		return Policy{}, err
	}
	for _, r := range req.Allow {
		if !slices.ContainsFunc(p.Allow, func(pr Rule) bool { return pr.covers(r) }) {
			return Policy{}, fmt.Errorf("%w: %q", ErrWiden, r.String())
		}
	}
	req.MaxBytes = p.MaxBytes
	return req, nil
}

// AllowsName says whether the policy allows connecting to host by name
// (a domain rule matches it). An address written as a host is never a
// name: see AllowsAddr.
func (p Policy) AllowsName(host string) bool {
	n, err := normalName(host)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(p.Allow, func(r Rule) bool {
		return !r.Prefix.IsValid() && (n == r.Name && !r.Wildcard || r.Wildcard && strings.HasSuffix(n, "."+r.Name))
	})
}

// AllowsAddr says whether an address rule allows a.
func (p Policy) AllowsAddr(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	return slices.ContainsFunc(p.Allow, func(r Rule) bool { return r.Prefix.IsValid() && r.Prefix.Contains(a) })
}
