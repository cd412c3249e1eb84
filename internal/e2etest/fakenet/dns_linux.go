package fakenet

import (
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// answerDNS answers the query q from the fake zone: A and AAAA records of
// its names, NXDOMAIN for any other name (golang.org/x/net's dnsmessage
// reads and writes the wire format). It returns nil for what is not a
// query.
func (n *Net) answerDNS(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	question := qs[0]
	name := strings.TrimSuffix(strings.ToLower(question.Name.String()), ".")
	var addrs []netip.Addr
	known := false
	for _, e := range n.zone() {
		for _, h := range e.names {
			if h == name {
				known = true
				addrs = append(addrs, netip.MustParseAddr(e.addr))
			}
		}
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(question) != nil || b.StartAnswers() != nil {
		return nil
	}
	rr := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 5}
	for _, a := range addrs {
		switch {
		case a.Is4() && question.Type == dnsmessage.TypeA:
			_ = b.AResource(rr, dnsmessage.AResource{A: a.As4()})
		case a.Is6() && question.Type == dnsmessage.TypeAAAA:
			_ = b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
