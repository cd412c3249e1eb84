package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Caller is the authenticated tenant behind a request.
type Caller = execution.Caller

type callerKey struct{}

// CallerFromContext returns the caller of an authenticated request (the
// MCP handler uses it); ok is false outside one.
func CallerFromContext(ctx context.Context) (*Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(*Caller)
	return c, ok
}

type authedFunc func(w http.ResponseWriter, r *http.Request, c *Caller) error

// authed authenticates the bearer key, then counts the request against
// the tenant's per-minute rate, before h runs.
func (s *Server) authed(h authedFunc) handlerFunc { return s.authedAfter(nil, h) }

// authedAfter is authed with pre run before the rate limit: when pre
// answered the request itself (done), it is not counted here (a sandbox
// call forwarded to the node that holds it is counted there).
func (s *Server) authedAfter(pre func(w http.ResponseWriter, r *http.Request, c *Caller) (done bool, err error), h authedFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		c, err := s.authenticate(r)
		if err != nil && s.opts.Accounts != nil && len(r.Header.Values("Authorization")) == 0 {
			// The dashboard's playground: a signed-in browser runs code
			// without a key, with the session's CSRF token in a header.
			if sc, serr := s.sessionCaller(r); sc != nil || serr != nil {
				c, err = sc, serr
			}
		}
		if err != nil {
			return err
		}
		return s.serveCaller(w, r, c, pre, h)
	}
}

// serveCaller runs h for an authenticated caller: the connection's tenant
// check, then pre (done: it answered, uncounted), then the rate limit.
func (s *Server) serveCaller(w http.ResponseWriter, r *http.Request, c *Caller, pre func(w http.ResponseWriter, r *http.Request, c *Caller) (done bool, err error), h authedFunc) error {
	if err := tenantConn(w, r, c.Key.Tenant); err != nil {
		return err
	}
	if pre != nil {
		if done, err := pre(w, r, c); done || err != nil {
			return err
		}
	}
	if err := s.rateLimit(w, r, c); err != nil {
		return err
	}
	return h(w, r, c)
}

// authenticate looks the key up on every request (no cache), so a key
// revoked on any node fails on every node at once. A known key's tenant
// goes into the access log even if the request fails later.
func (s *Server) authenticate(r *http.Request) (*Caller, error) {
	auths := r.Header.Values("Authorization")
	if len(auths) == 0 || auths[0] == "" {
		return nil, errorf(KindUnauthorized, "missing API key: send Authorization: Bearer kubo_sk_...")
	}
	if len(auths) > 1 {
		// Which one counts would depend on who reads the request (a proxy
		// may take the last); refuse rather than pick.
		return nil, errorf(KindUnauthorized, "send exactly one Authorization header")
	}
	auth := auths[0]
	scheme, secret, ok := strings.Cut(auth, " ")
	secret = strings.TrimSpace(secret)
	if !ok || !strings.EqualFold(scheme, "Bearer") || !wellFormedKey(secret) {
		return nil, errorf(KindUnauthorized, "invalid API key: send Authorization: Bearer kubo_sk_...")
	}
	return s.authenticateKey(r, secret)
}

// authenticateKey authenticates a well-formed key, however it was sent.
func (s *Server) authenticateKey(r *http.Request, secret string) (*Caller, error) {
	k, err := s.store.KeyByHash(r.Context(), HashAPIKey(secret))
	if errors.Is(err, store.ErrNotFound) {
		return nil, errorf(KindUnauthorized, "invalid or revoked API key")
	}
	if err != nil {
		return nil, internal(err)
	}
	c, err := s.callerOfKey(r.Context(), k)
	if err != nil {
		return nil, err
	}
	// Last use is kept to the minute, so a busy key costs one write a
	// minute, not one per request.
	if now := s.now(); now.Sub(k.LastUsedAt) >= time.Minute {
		if err := s.store.TouchKey(r.Context(), k.ID, now.Truncate(time.Minute)); err != nil {
			s.log.Warn("recording a key's last use", "key_id", k.ID, "error", err)
		}
	}
	return c, nil
}

// callerOfKey is the caller a known key acts as: its tenant (logged) and
// plan; a disabled tenant is refused.
func (s *Server) callerOfKey(ctx context.Context, k store.Key) (*Caller, error) {
	info := infoFrom(ctx)
	info.tenant, info.keyID = k.Tenant, k.ID
	if k.TenantDisabled {
		return nil, errTenantDisabled
	}
	plan, ok := s.plans[k.Plan]
	if !ok {
		return nil, internal(errors.New("key " + k.ID + " has plan " + k.Plan + ", which is not configured"))
	}
	return &Caller{Key: k, Plan: plan}, nil
}

// errTenantDisabled is what every request of a disabled tenant gets: the
// flag is read with the key on every request, so it holds on every node
// from the next request on.
var errTenantDisabled = errorf(KindForbidden, "this account is disabled; ask the server's operator")

// rateLimit counts the request in the tenant's fixed one-minute window
// (shared by all nodes through the store) and sets the X-RateLimit-*
// headers on the answer, whatever it turns out to be.
func (s *Server) rateLimit(w http.ResponseWriter, r *http.Request, c *Caller) error {
	now := s.now().UTC()
	window := now.Truncate(time.Minute)
	reset := window.Add(time.Minute)
	n, err := s.store.CountRequest(r.Context(), c.Key.Tenant, window)
	if err != nil {
		return internal(err)
	}
	limit := c.Plan.RequestsPerMinute
	h := w.Header()
	h.Set("X-RateLimit-Limit", strconv.FormatInt(limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(max(0, limit-n), 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	if n > limit {
		e := errorf(KindRateLimited, "rate limit of %d requests per minute reached", limit)
		e.RetryAfter = secondsUntil(now, reset)
		return e
	}
	return nil
}

// secondsUntil rounds up, and is at least 1 so a client never retries at once.
func secondsUntil(now, t time.Time) int {
	d := t.Sub(now)
	secs := int((d + time.Second - 1) / time.Second)
	return max(1, secs)
}
