package egress

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "" means refused
	}{
		{"pypi.org", "pypi.org"},
		{"PyPI.org.", "pypi.org"},
		{"*.pythonhosted.org", "*.pythonhosted.org"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"203.0.113.0/24", "203.0.113.0/24"},
		{"203.0.113.9/24", "203.0.113.0/24"},
		{"203.0.113.7", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"2001:db8::/32", "2001:db8::/32"},
		{"*.com", ""},
		{"*", ""},
		{"a.*.example", ""},
		{"", ""},
		{"exa mple.com", ""},
		{"-bad.example", ""},
		{"under_score.example", ""},
		{"user@host.example", ""},
		{"host.example:443", ""},
		{"203.0.113.0/33", ""},
		{"fe80::1%eth0", ""},
		{"http://pypi.org", ""},
	} {
		r, err := ParseRule(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("ParseRule(%q) = %v; want an error", tc.in, r)
		case tc.want != "" && err != nil:
			t.Errorf("ParseRule(%q): %v", tc.in, err)
		case tc.want != "" && r.String() != tc.want:
			t.Errorf("ParseRule(%q) = %q; want %q", tc.in, r, tc.want)
		}
	}
	if _, err := Parse(make([]string, MaxRules+1), 0); err == nil {
		t.Error("Parse took more than MaxRules rules")
	}
	if _, err := Parse(nil, -1); err == nil {
		t.Error("Parse took a negative byte bound")
	}
}

// TestNarrow: a request may keep or narrow its plan's list, never widen it.
func TestNarrow(t *testing.T) {
	plan, err := Parse([]string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24", "2001:db8::/32"}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  []string
		want string // "" means ErrWiden
	}{
		{[]string{"pypi.org"}, "[pypi.org]"},
		{[]string{"files.pythonhosted.org", "*.cdn.pythonhosted.org"}, "[files.pythonhosted.org *.cdn.pythonhosted.org]"},
		{[]string{"203.0.113.128/25", "203.0.113.5", "2001:db8:1::/48"}, "[203.0.113.128/25 203.0.113.5 2001:db8:1::/48]"},
		{[]string{}, "[]"},
		{[]string{"pythonhosted.org"}, ""}, // the wildcard does not cover its own name
		{[]string{"*.pythonhosted.org"}, "[*.pythonhosted.org]"},
		{[]string{"*.python.org"}, ""},
		{[]string{"evil.pypi.org"}, ""},
		{[]string{"203.0.112.0/23"}, ""},
		{[]string{"198.51.100.1"}, ""},
		{[]string{"0.0.0.0/0"}, ""},
	} {
		got, err := plan.Narrow(tc.req)
		if tc.want == "" {
			if !errors.Is(err, ErrWiden) {
				t.Errorf("Narrow(%q) = %v, %v; want ErrWiden", tc.req, got.Strings(), err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Narrow(%q): %v", tc.req, err)
			continue
		}
		if s := fmtList(got.Strings()); s != tc.want || got.MaxBytes != 1000 {
			t.Errorf("Narrow(%q) = %s (max %d); want %s (max 1000)", tc.req, s, got.MaxBytes, tc.want)
		}
	}
	if got, err := plan.Narrow(nil); err != nil || len(got.Allow) != 4 {
		t.Errorf("no list in the request: %v, %v; want the plan's", got.Strings(), err)
	}
}

func fmtList(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}

func TestAllows(t *testing.T) {
	p, err := Parse([]string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"pypi.org": true, "PYPI.ORG.": true, "files.pythonhosted.org": true, "a.b.pythonhosted.org": true,
		"pythonhosted.org": false, "evil-pypi.org": false, "pypi.org.evil.example": false, "xpythonhosted.org": false,
		"203.0.113.7": false, "": false, "*.pythonhosted.org": false,
	} {
		if got := p.AllowsName(name); got != want {
			t.Errorf("AllowsName(%q) = %v; want %v", name, got, want)
		}
	}
	for addr, want := range map[string]bool{"203.0.113.7": true, "::ffff:203.0.113.7": true, "203.0.114.1": false, "2001:db8::1": false} {
		if got := p.AllowsAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("AllowsAddr(%s) = %v; want %v", addr, got, want)
		}
	}
}

// FuzzPolicy: any string either is refused or reads as a rule that
// writes back to itself; a plan always covers a request for its own
// rules, and never one it refused to narrow to.
func FuzzPolicy(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24", "2001:db8::/32", "bücher.example", "*.com", "::ffff:1.2.3.4", "a..b", "xn--bcher-kva.example."} {
		f.Add(s, "*.example.com")
	}
	f.Fuzz(func(t *testing.T, s, planRule string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRule(%q) = %q, which reads back as %q, %v", s, r, again, err)
		}
		plan, err := Parse([]string{r.String()}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := plan.Narrow([]string{s}); err != nil {
			t.Fatalf("a plan of %q refuses a request for %q: %v", r, s, err)
		}
		if other, err := Parse([]string{planRule}, 0); err == nil {
			if got, err := other.Narrow([]string{s}); err == nil {
				for _, x := range got.Allow {
					if x.Prefix.IsValid() != r.Prefix.IsValid() {
						t.Fatalf("%q narrowed to %q changed kind", s, x)
					}
				}
			}
		}
	})
}

// TestParseRuleAddressRangeError: a malformed address range is named as
// one, with an example, and not with the Go parser's words.
func TestParseRuleAddressRangeError(t *testing.T) {
	for _, s := range []string{"allowed.test/x", "203.0.113.0/33", "203.0.113/24"} {
		_, err := ParseRule(s)
		if err == nil || !strings.Contains(err.Error(), "is not an address range") || !strings.Contains(err.Error(), "like 203.0.113.0/24") ||
			strings.Contains(err.Error(), "netip") || strings.Contains(err.Error(), "ParseAddr") {
			t.Errorf("ParseRule(%q): %v", s, err)
		}
	}
}

// TestParseRuleClipsALongRule: a rule too long to be one is refused
// without being echoed whole.
func TestParseRuleClipsALongRule(t *testing.T) {
	for _, s := range []string{strings.Repeat("a", 400000) + ".test", "*." + strings.Repeat("é", 300)} {
		_, err := ParseRule(s)
		if err == nil || len(err.Error()) > 200 || !strings.Contains(err.Error(), "bytes; a rule is at most") {
			t.Errorf("ParseRule of %d bytes: %.300v", len(s), err)
		}
	}
	if _, err := ParseRule(strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + ".test"); err != nil {
		t.Errorf("a name of 126 bytes: %v", err)
	}
}
