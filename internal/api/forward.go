package api

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
)

// A call for a sandbox that another node holds live is forwarded to that
// node (docs/SANDBOXES.md, "Several nodes"): the node that took the call
// authenticates it, finds the owner (Sandboxes.Owner, with the address
// the owner sends with its heartbeats) and proxies the request there as
// it came, bearer key included, so the owner authenticates it again and
// counts it once against the tenant's rate (the forwarding node does
// not). Answers stream through unbuffered, so SSE works. The forwarded
// request carries forwardedHeader, and a node never forwards a request
// that has it: a stale view of who holds a sandbox is a 503 to retry,
// never a loop.
const forwardedHeader = "X-Vertal-Forwarded-By"

// requestIDPattern is what newRequestID makes: a forwarded request keeps
// the id its first node gave it, so both nodes' log lines share it.
var requestIDPattern = regexp.MustCompile(`^req_[0-9a-f]{32}$`)

// headersOfOurs are set by ServeHTTP on every answer: the owner's copies
// are dropped, so none appears twice.
var headersOfOurs = []string{"X-Request-ID", "X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options", "Cross-Origin-Resource-Policy"}

// forwardSandbox proxies the call to the node holding sandbox id, if that
// is another node; done reports that it answered.
func (s *Server) forwardSandbox(w http.ResponseWriter, r *http.Request, c *Caller, id string) (done bool, err error) {
	if r.Header.Get(forwardedHeader) != "" {
		return false, nil // one hop at most: this node answers
	}
	addr, err := s.sbx.Owner(r.Context(), *c, id)
	if err != nil || addr == "" {
		return err != nil, err
	}
	target, err := url.Parse(addr)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return true, errorf(KindUnavailable, "the node holding sandbox %s has an address that cannot be reached: %q", id, clip(addr, 80))
	}
	info := infoFrom(r.Context())
	info.forwardedTo = target.Host
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Header.Set(forwardedHeader, s.opts.NodeID)
			pr.Out.Header.Set("X-Request-ID", info.id)
		},
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			for _, h := range headersOfOurs {
				res.Header.Del(h)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			e := errorf(KindUnavailable, "the node holding sandbox %s did not answer; retry shortly", id)
			e.RetryAfter = 1
			info.err = err
			s.writeError(w, r, e)
		},
	}
	rp.ServeHTTP(w, r)
	return true, nil
}
