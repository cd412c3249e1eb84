// Package api is the HTTP API of Vertal Run: routes, authentication with
// hashed keys, rate limits, strict decoding, the one error shape, access
// logs, security headers and Prometheus metrics. Running code (validation,
// idempotency, slots, quota, metering, the stored lifecycle, cancel) is the
// execution service's (internal/execution); the handlers translate.
//
// Every handler returns an error; one adapter turns it into the error
// shape through the table in errors.go and writes the access log. The
// execution service and the Store are injected, so unit tests run against
// storefake and a service over a fake Driver.
package api

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Options configure a Server. Service and Store are required.
type Options struct {
	// Service runs code for every entry point: these handlers, the MCP
	// tools (MCPBackend) and the queue's workers share one. Its plans are
	// the API's. Give it RenderExecution as its Render and the Server's
	// Metrics, Logger and Now, so that webhooks, metrics and logs agree.
	Service *execution.Service
	// Store holds the keys and tenants the API authenticates; the
	// Service's own.
	Store store.Store
	// Version is reported by /health and the OpenAPI document.
	Version string
	// NodeID names this node on the sandbox calls it forwards to the node
	// holding the sandbox (forward.go).
	NodeID string
	// EdgeSecret, when set, must arrive in X-Vertal-Edge-Secret on every
	// request but /health; otherwise 403.
	EdgeSecret string
	// Heartbeat is how often an idle event stream gets a comment line;
	// zero means DefaultHeartbeat (15 s).
	Heartbeat time.Duration
	// Web serves the playground and documentation: it gets GET and HEAD
	// requests for every path outside the API (/v1/, /api/, /health, /mcp).
	// Its 404s are turned into the API's error shape. Nil: not mounted.
	Web http.Handler
	// MCP serves Streamable HTTP MCP at /mcp and /api/mcp (POST only; the
	// handler is stateless, so there is no GET stream), behind the API's
	// key check: a missing, unknown or revoked key gets the API's 401
	// before MCP sees the request. Every MCP request carries one JSON-RPC
	// message (batches are refused) and counts once against the key's
	// per-minute rate; its tools call the execution service (MCPBackend)
	// directly, so nothing they do is counted again. The caller is in the
	// request context (see CallerFromContext). Nil: not mounted.
	MCP http.Handler
	// Accounts and Pages serve the account pages (/signup, /login and its
	// alias /entrar, /dashboard, /operator) and let a signed-in browser
	// use the API without a key (the playground). Nil: not mounted.
	Accounts *account.Service
	Pages    PageRenderer
	// PublicURL is the server's URL as browsers see it; it builds links,
	// snippets and the CSRF origin check. Empty: from each request.
	PublicURL string
	// Metrics collects what /metrics shows (SetEngine adds the engine's
	// slots); nil makes a new one.
	Metrics *Metrics
	// Logger receives the JSON access log; nil discards it.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Sandboxes serves sandboxes that stay (/v1/sandboxes/...) and the
	// sandboxes part of GET /v1/usage; give it the *sandboxes.Service.
	// Nil: every sandbox route answers 404 not_found ("sandboxes are not
	// enabled on this server") to an authenticated caller.
	Sandboxes Sandboxes
	// BodyBudget bounds the memory that request bodies being read and
	// decoded hold at once, over all requests (each counts a few times its
	// size); a request past it is refused at once with 503 overloaded.
	// Zero means DefaultBodyBudget.
	BodyBudget int64
}

// apiStore is what the handlers themselves keep and read; the execution
// service has the store for the run sequence.
type apiStore interface {
	store.Keys
	store.Tenants
	store.Accounts
	store.Quota
	store.Executions
	store.Idempotencies
}

// Server is the HTTP API. It is an http.Handler.
type Server struct {
	opts       Options
	store      apiStore
	exec       *execution.Service
	sbx        Sandboxes
	log        *slog.Logger
	now        func() time.Time
	plans      map[string]config.Plan
	metrics    *Metrics
	mux        *http.ServeMux
	openapi    map[string][]byte // by mount prefix: "" and "/api"
	edgeSecret *[32]byte
	heartbeat  time.Duration
	bodies     *bodyBudget
	e2bWatches watchCount // directory watches of the E2B data plane, by sandbox
}

// New returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Service == nil || opts.Store == nil {
		return nil, errors.New("api: Service and Store are required")
	}
	s := &Server{
		opts:    opts,
		store:   opts.Store,
		exec:    opts.Service,
		sbx:     opts.Sandboxes,
		log:     opts.Logger,
		now:     opts.Now,
		plans:   opts.Service.Plans(),
		metrics: opts.Metrics,
		mux:     http.NewServeMux(),
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.metrics == nil {
		s.metrics = NewMetrics()
	}
	if p, ok := s.sbx.(*sandboxes.Service); ok && p == nil {
		s.sbx = nil // a typed nil, as a disabled service is easily passed: off
	}
	s.bodies = &bodyBudget{limit: cmp.Or(opts.BodyBudget, DefaultBodyBudget)}
	s.heartbeat = opts.Heartbeat
	if s.heartbeat <= 0 {
		s.heartbeat = DefaultHeartbeat
	}
	if opts.EdgeSecret != "" {
		h := sha256.Sum256([]byte(opts.EdgeSecret))
		s.edgeSecret = &h
	}
	var err error
	if s.openapi, err = openAPIDocuments(opts.Version); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

// Metrics returns the server's metrics, to serve on the operator's
// listener with MetricsHandler.
func (s *Server) Metrics() *Metrics { return s.metrics }

// routes registers every route. Each API route exists under /v1/... and
// under /api/v1/..., so a base URL ending in /api works as on the hosted
// service.
func (s *Server) routes() {
	for _, p := range []string{"", "/api"} {
		s.handle("POST "+p+"/v1/executions", s.authed(s.createExecution))
		s.handle("POST "+p+"/v1/executions/batch", s.authed(s.createBatch))
		s.handle("GET "+p+"/v1/webhook-secret", s.authed(s.getWebhookSecret))
		s.handle("POST "+p+"/v1/webhook-secret/rotate", s.authed(s.rotateWebhookSecret))
		s.handle("GET "+p+"/v1/executions/{id}", s.authed(s.getExecution))
		s.handle("POST "+p+"/v1/executions/{id}/cancel", s.authed(s.cancelExecution))
		s.handle("GET "+p+"/v1/executions/{id}/events", s.authed(s.executionEvents))
		s.handle("GET "+p+"/v1/usage", s.authed(s.getUsage))
		s.handle("POST "+p+"/v1/keys/rotate", s.authed(s.rotateKey))
		s.handle("GET "+p+"/v1/languages", s.authed(s.listLanguages))
		s.handle("GET "+p+"/v1/images", s.authed(s.listImages))
		// Sandboxes that stay (sandboxes.go).
		s.handle("POST "+p+"/v1/sandboxes", s.sandboxesOn(s.createSandbox))
		s.handle("GET "+p+"/v1/sandboxes", s.sandboxesOn(s.listSandboxes))
		s.handle("GET "+p+"/v1/sandboxes/{id}", s.sandbox(s.getSandbox))
		s.handle("DELETE "+p+"/v1/sandboxes/{id}", s.sandbox(s.killSandbox))
		s.handle("POST "+p+"/v1/sandboxes/{id}/timeout", s.sandbox(s.setSandboxTimeout))
		s.handle("POST "+p+"/v1/sandboxes/{id}/pause", s.sandbox(s.pauseSandbox))
		s.handle("POST "+p+"/v1/sandboxes/{id}/resume", s.sandbox(s.resumeSandbox))
		s.handle("POST "+p+"/v1/sandboxes/{id}/commands", s.sandbox(s.runCommand))
		s.handle("GET "+p+"/v1/sandboxes/{id}/commands", s.sandbox(s.listCommands))
		s.handle("POST "+p+"/v1/sandboxes/{id}/commands/{pid}/stdin", s.sandbox(s.commandStdin))
		s.handle("POST "+p+"/v1/sandboxes/{id}/commands/{pid}/signal", s.sandbox(s.signalCommand))
		s.handle("GET "+p+"/v1/sandboxes/{id}/commands/{pid}/events", s.sandbox(s.commandEvents))
		s.handle("GET "+p+"/v1/sandboxes/{id}/files", s.sandbox(s.readFile))
		s.handle("PUT "+p+"/v1/sandboxes/{id}/files", s.sandbox(s.writeFile))
		s.handle("DELETE "+p+"/v1/sandboxes/{id}/files", s.sandbox(s.removeFile))
		s.handle("POST "+p+"/v1/sandboxes/{id}/files/mkdir", s.sandbox(s.mkdir))
		s.handle("POST "+p+"/v1/sandboxes/{id}/files/move", s.sandbox(s.moveFile))
		s.handle("POST "+p+"/v1/sandboxes/{id}/contexts", s.sandbox(s.createContext))
		s.handle("GET "+p+"/v1/sandboxes/{id}/contexts", s.sandbox(s.listContexts))
		s.handle("DELETE "+p+"/v1/sandboxes/{id}/contexts/{cid}", s.sandbox(s.deleteContext))
		s.handle("POST "+p+"/v1/sandboxes/{id}/contexts/{cid}/restart", s.sandbox(s.restartContext))
		s.handle("POST "+p+"/v1/sandboxes/{id}/run", s.sandbox(s.runCode))
		s.e2bRoutes(p)
		s.handle("GET "+p+"/v1/openapi.json", s.getOpenAPI(p))
		s.handle("GET "+p+"/health", s.health)
		if s.opts.MCP != nil {
			s.handle("POST "+p+"/mcp", s.authed(s.serveMCP))
			// OAuth discovery, for MCP clients that start it on a 401
			// (oauth.go). RFC 9728 puts the metadata of /api/mcp at
			// /.well-known/oauth-protected-resource/api/mcp; the
			// /api/.well-known/... paths serve a base URL ending in /api.
			s.handle("GET "+p+"/.well-known/oauth-protected-resource", s.protectedResource(p+"/mcp"))
			s.handle("GET "+p+"/.well-known/oauth-protected-resource/mcp", s.protectedResource(p+"/mcp"))
			s.handle("GET "+p+"/.well-known/oauth-authorization-server", notOAuth)
			s.handle("GET "+p+"/.well-known/openid-configuration", notOAuth)
			s.handle("POST "+p+"/register", notOAuth)
		}
	}
	if s.opts.MCP != nil {
		s.handle("GET /.well-known/oauth-protected-resource/api/mcp", s.protectedResource("/api/mcp"))
	}
	// The account pages. Their POSTs all pass the origin check, and the
	// signed-in ones the session's CSRF token too (see accounts.go).
	for _, p := range []string{"/login", "/entrar"} {
		s.handle("GET "+p, s.page(s.loginPage))
		s.handle("POST "+p, s.page(s.login))
	}
	s.handle("GET /signup", s.page(s.signupPage))
	s.handle("POST /signup", s.page(s.signup))
	s.handle("GET /verify", s.page(s.verify))
	s.handle("POST /verify/resend", s.signedIn(s.resendVerification))
	s.handle("GET /reset", s.page(s.resetPage))
	s.handle("POST /reset", s.page(s.requestReset))
	s.handle("POST /reset/confirm", s.page(s.confirmReset))
	s.handle("GET /session", s.page(s.sessionInfo))
	s.handle("POST /logout", s.signedIn(s.logout))
	s.handle("POST /logout-everywhere", s.signedIn(s.logoutEverywhere))
	s.handle("GET /dashboard", s.signedIn(s.dashboard))
	s.handle("POST /dashboard/keys", s.signedIn(s.createDashboardKey))
	s.handle("GET /dashboard/keys/{id}/revoke", s.signedIn(s.revokePage))
	s.handle("POST /dashboard/keys/{id}/revoke", s.signedIn(s.revokeDashboardKey))
	s.handle("GET /operator", s.operator(s.operatorPage))
	s.handle("POST /operator/tenants/{id}/plan", s.operator(s.operatorSetPlan))
	s.handle("POST /operator/tenants/{id}/disable", s.operator(s.operatorDisable(true)))
	s.handle("POST /operator/tenants/{id}/enable", s.operator(s.operatorDisable(false)))
	s.handle("/", s.fallback)
}

// handlerFunc is what every route implements.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle is the adapter: it records the route for the access log and
// writes a returned error in the error shape.
func (s *Server) handle(pattern string, h handlerFunc) {
	route := pattern
	if i := strings.IndexByte(route, ' '); i >= 0 {
		route = route[i+1:]
	}
	route = strings.TrimPrefix(route, "/api")
	if pattern == "/" {
		route = "other"
	}
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		infoFrom(r.Context()).route = route
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// ServeHTTP runs every request: request id, security headers, edge
// secret, panic recovery, access log and metrics around the routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	info := &requestInfo{id: newRequestID(), start: s.now()}
	if id := r.Header.Get("X-Request-ID"); r.Header.Get(forwardedHeader) != "" && requestIDPattern.MatchString(id) {
		info.id = id // the id the forwarding node gave it (forward.go)
	}
	r = cleanAPIPath(r.WithContext(context.WithValue(r.Context(), infoKey{}, info)))
	sw := &statusWriter{ResponseWriter: w}
	h := sw.Header()
	h.Set("X-Request-ID", info.id)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	defer s.finish(sw, r, info)
	if !s.edgeAllowed(r) {
		s.writeError(sw, r, errorf(KindForbidden, "this origin only accepts requests relayed by its edge"))
		return
	}
	s.mux.ServeHTTP(sw, r)
}

func (s *Server) finish(sw *statusWriter, r *http.Request, info *requestInfo) {
	if p := recover(); p != nil {
		if p == http.ErrAbortHandler {
			panic(p)
		}
		err := fmt.Errorf("panic: %v", p)
		s.log.Error("panic in handler", "request_id", info.id, "panic", fmt.Sprint(p), "stack", stack())
		if !sw.wrote {
			s.writeError(sw, r, internal(err))
		} else {
			info.err = err
		}
	}
	status := sw.status
	if !sw.wrote {
		status = http.StatusOK
		if info.clientGone {
			status = 499 // the client left before an answer; nothing was written
		}
	}
	d := s.now().Sub(info.start)
	s.metrics.observeRequest(info.route, r.Method, status, d)
	attrs := []slog.Attr{
		slog.String("request_id", info.id),
		slog.String("method", r.Method),
		slog.String("path", keyInPath.ReplaceAllString(r.URL.Path, "[redacted-key]")),
		slog.String("route", info.route),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000),
		slog.Int64("bytes", sw.bytes),
		slog.String("remote", r.RemoteAddr),
	}
	if info.tenant != "" {
		attrs = append(attrs, slog.String("tenant", info.tenant), slog.String("key_id", info.keyID))
	}
	if info.executionID != "" {
		attrs = append(attrs, slog.String("execution_id", info.executionID))
	}
	if info.sandboxID != "" {
		attrs = append(attrs, slog.String("sandbox_id", info.sandboxID))
	}
	if info.forwardedTo != "" {
		attrs = append(attrs, slog.String("forwarded_to", info.forwardedTo))
	}
	if info.errCode != "" {
		attrs = append(attrs, slog.String("error_code", info.errCode))
	}
	level := slog.LevelInfo
	if info.abort {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("error", info.err.Error()))
	}
	if info.err != nil && status >= 500 {
		// Overload is the server working as designed; an operator's
		// alert on ERROR should fire for failures only.
		level = slog.LevelError
		if status == http.StatusServiceUnavailable {
			level = slog.LevelWarn
		}
		attrs = append(attrs, slog.String("error", info.err.Error()))
	}
	s.log.LogAttrs(context.Background(), level, "request", attrs...)
	if info.abort {
		panic(http.ErrAbortHandler)
	}
}

// fallback answers every request no route matched: the web handler for
// pages, else 405 when the path exists with other methods, else 404.
func (s *Server) fallback(w http.ResponseWriter, r *http.Request) error {
	web := s.opts.Web != nil && !isAPIPath(r.URL.Path)
	if web && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		infoFrom(r.Context()).route = "web"
		return s.serveWeb(w, r)
	}
	var allow []string
	if web {
		allow = []string{http.MethodGet, http.MethodHead}
	} else {
		allow = s.allowedMethods(r)
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		return errorf(KindMethodNotAllowed, "method %s is not allowed here; allowed: %s", r.Method, strings.Join(allow, ", "))
	}
	return errorf(KindNotFound, "no such endpoint; the API is described at /v1/openapi.json")
}

var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// allowedMethods lists the methods some route accepts for r's path.
func (s *Server) allowedMethods(r *http.Request) []string {
	var allow []string
	for _, m := range probeMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	sort.Strings(allow)
	return allow
}

// keyInPath finds an API key pasted into a URL path by mistake, so that
// it never reaches the access log.
var keyInPath = regexp.MustCompile(`kubo_sk_[0-9A-Za-z]*`)

// cleanAPIPath collapses repeated slashes and dot segments in an API path.
// ServeMux would answer those with an HTML redirect, which a POST client
// rarely follows; a base URL ending in "/" joined with "/v1/..." should
// simply work. A trailing slash is kept: it stays a 404 like any other
// unknown path.
func cleanAPIPath(r *http.Request) *http.Request {
	p := r.URL.Path
	if r.URL.RawPath != "" || !strings.HasPrefix(p, "/") {
		return r
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	if c == p || !isAPIPath(c) {
		return r
	}
	u := *r.URL
	u.Path = c
	r.URL = &u
	return r
}

func isAPIPath(p string) bool {
	return p == "/health" || p == "/v1" || p == "/api" || p == "/mcp" ||
		strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/mcp/")
}

// serveWeb runs the web handler and, for clients other than browsers,
// replaces its 404 with the API's error shape. A browser (Accept names
// text/html) gets the site's page-not-found.
func (s *Server) serveWeb(w http.ResponseWriter, r *http.Request) error {
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		s.opts.Web.ServeHTTP(w, r)
		return nil
	}
	ww := &webWriter{ResponseWriter: w}
	s.opts.Web.ServeHTTP(ww, r)
	if ww.notFound {
		for _, h := range []string{"Content-Type", "Content-Length", "Content-Encoding", "Content-Security-Policy"} {
			w.Header().Del(h)
		}
		return errorf(KindNotFound, "no such page")
	}
	return nil
}

// webWriter swallows a 404 from the web handler so that the adapter can
// answer in the error shape.
type webWriter struct {
	http.ResponseWriter
	notFound bool
	wrote    bool
}

func (w *webWriter) WriteHeader(code int) {
	if !w.wrote && code == http.StatusNotFound {
		w.notFound = true
	}
	if !w.notFound {
		w.ResponseWriter.WriteHeader(code)
	}
	w.wrote = true
}

func (w *webWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.notFound {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

func (w *webWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveMCP checks the body as createExecution does (a lone surrogate in a
// tool argument would otherwise become U+FFFD on its way to the API) and
// refuses JSON-RPC batches, so that one request is one counted message.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request, c *Caller) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBodyBytes(c.Plan)))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return errorf(KindPayloadTooLarge, "request body is over %d bytes", tooLarge.Limit)
	}
	if err != nil {
		return errorf(KindInvalidRequest, "could not read the request body")
	}
	if err := checkJSONText(body); err != nil {
		return err
	}
	if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		return errorf(KindInvalidRequest, "JSON-RPC batches are not supported; send one message per request")
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	s.opts.MCP.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	return nil
}

// health is public: it tells a load balancer the process is serving.
func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	return s.writeJSON(w, r, http.StatusOK, wire.Health{Status: "ok", Version: s.opts.Version})
}
