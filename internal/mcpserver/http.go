package mcpserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPOptions configure the Streamable HTTP endpoint.
type HTTPOptions struct {
	Options
	// Backend, when set, gives the tools of each HTTP request the Backend
	// to call, from the request (whose context carries what the API's key
	// check found); an error from it is answered in the error shape. The
	// API server sets it to call its execution service directly; APIURL,
	// HTTPClient, Verify, ForwardHeaders and VerifyTTL are then unused,
	// since the API checked the key before the request got here.
	Backend func(r *http.Request) (Backend, error)
	// APIURL is the base URL the tools call, e.g. "http://127.0.0.1:8080".
	APIURL string
	// HTTPClient carries the API calls; nil means http.DefaultClient.
	HTTPClient *http.Client
	// Verify checks a bearer key before any MCP message is handled. It
	// returns an *client.Error (typically 401 unauthorized) to refuse. When
	// nil, keys are checked by calling GET /v1/usage with them; a key that
	// passed is trusted for VerifyTTL (the API itself still checks every
	// tool call, so a revoked key cannot run code meanwhile).
	Verify func(ctx context.Context, key string) error
	// ForwardHeaders are copied from each MCP HTTP request onto the API
	// calls it causes. Nil means X-Vertal-Edge-Secret only, so that a
	// server requiring the edge secret accepts the tools' calls; an empty
	// non-nil slice forwards nothing.
	ForwardHeaders []string
	// VerifyTTL is how long a key checked through the API is trusted
	// without asking again. Default 30 seconds.
	VerifyTTL time.Duration
}

// HTTPHandler serves MCP over Streamable HTTP. Every request must carry
// "Authorization: Bearer kubo_sk_..."; the tools forward that key to the
// API, so each caller uses its own tenant, quota and metering.
//
// The handler is stateless: no MCP session lives between requests, so it
// works the same behind a load balancer across several API nodes, and a
// key is checked on every request.
func HTTPHandler(opts HTTPOptions) http.Handler {
	h := &httpHandler{opts: opts, log: opts.logger(), trusted: map[[32]byte]time.Time{}, now: time.Now}
	if h.opts.HTTPClient == nil {
		h.opts.HTTPClient = http.DefaultClient
	}
	if h.opts.ForwardHeaders == nil {
		h.opts.ForwardHeaders = []string{"X-Vertal-Edge-Secret"}
	}
	if h.opts.VerifyTTL <= 0 {
		h.opts.VerifyTTL = 30 * time.Second
	}
	h.tools = &tools{backendFor: h.backendFor, remote: true, log: h.log}
	h.mcp = mcp.NewStreamableHTTPHandler(h.server, &mcp.StreamableHTTPOptions{
		Stateless:    true,
		JSONResponse: true,
		Logger:       sdkLogger(h.log),
		// DNS-rebinding protection rejects loopback connections whose Host
		// is not loopback. Behind a tunnel or reverse proxy on the same host
		// every legitimate request looks like that, and the attack it stops
		// needs ambient credentials, which a bearer key is not.
		DisableLocalhostProtection: true,
	})
	return h
}

type httpHandler struct {
	opts  HTTPOptions
	log   *slog.Logger
	tools *tools
	mcp   *mcp.StreamableHTTPHandler
	now   func() time.Time

	mu        sync.Mutex
	srv       *mcp.Server
	sbxSrv    *mcp.Server // srv with the sandbox tools, for a SandboxBackend's callers
	complete  bool        // srv lists the server's languages with versions
	lastFetch time.Time   // of the languages, to rate-limit retries
	trusted   map[[32]byte]time.Time
}

type (
	keyContextKey     struct{}
	forwardContextKey struct{}
	// sandboxesContextKey marks a request whose Backend is a
	// SandboxBackend: it is served the tools of sandboxes too.
	sandboxesContextKey struct{}
)

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		// Stateless: no GET event stream and no session to DELETE. The
		// SDK would answer in plain text; keep the API's error shape.
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &client.Error{StatusCode: http.StatusMethodNotAllowed, Code: "method_not_allowed",
			Message: "method " + r.Method + " is not allowed here; allowed: POST"})
		return
	}
	key, ok := bearerKey(r.Header.Get("Authorization"))
	ctx := context.WithValue(context.WithValue(r.Context(), keyContextKey{}, key), forwardContextKey{}, h.forwarded(r.Header))
	if !ok {
		writeError(w, &client.Error{StatusCode: http.StatusUnauthorized, Code: client.CodeUnauthorized,
			Message: "missing API key: send Authorization: Bearer kubo_sk_..."})
		return
	}
	if h.opts.Backend != nil {
		b, err := h.opts.Backend(r)
		if err != nil {
			var apiErr *client.Error
			if !errors.As(err, &apiErr) {
				h.log.Error("mcp: no backend for the request", "err", err)
				apiErr = &client.Error{StatusCode: http.StatusInternalServerError, Code: "internal_error",
					Message: "internal error; quote the request id when reporting it"}
			}
			writeError(w, apiErr)
			return
		}
		// The tool handlers get the Backend as the SDK hands on bearer
		// token information: through the request's context.
		withToken := auth.RequireBearerToken(func(context.Context, string, *http.Request) (*auth.TokenInfo, error) {
			return &auth.TokenInfo{Extra: map[string]any{backendExtra: b}}, nil
		}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
		if _, ok := b.(SandboxBackend); ok {
			ctx = context.WithValue(ctx, sandboxesContextKey{}, true)
		}
		h.ensureServer(ctx, key)
		withToken(h.mcp).ServeHTTP(w, r.WithContext(ctx))
		return
	}
	if err := h.verify(ctx, key); err != nil {
		var apiErr *client.Error
		if !errors.As(err, &apiErr) {
			h.log.Warn("mcp: verifying key", "err", err)
			apiErr = &client.Error{StatusCode: http.StatusServiceUnavailable, Code: "unavailable",
				Message: "the API is unavailable; try again shortly", RetryAfter: 5 * time.Second}
		}
		writeError(w, apiErr)
		return
	}
	h.ensureServer(ctx, key)
	h.mcp.ServeHTTP(w, r.WithContext(ctx))
}

func (h *httpHandler) forwarded(from http.Header) http.Header {
	fwd := http.Header{}
	for _, name := range h.opts.ForwardHeaders {
		if v := from.Values(name); len(v) > 0 {
			fwd[http.CanonicalHeaderKey(name)] = v
		}
	}
	return fwd
}

func bearerKey(header string) (string, bool) {
	scheme, key, ok := strings.Cut(strings.TrimSpace(header), " ")
	key = strings.TrimSpace(key)
	if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" {
		return "", false
	}
	return key, true
}

func (h *httpHandler) verify(ctx context.Context, key string) error {
	if h.opts.Verify != nil {
		return h.opts.Verify(ctx, key)
	}
	sum := sha256.Sum256([]byte(key))
	now := h.now()
	h.mu.Lock()
	until, ok := h.trusted[sum]
	h.mu.Unlock()
	if ok && now.Before(until) {
		return nil
	}
	c, err := h.newClient(ctx, key)
	if err != nil {
		return err
	}
	if _, err := c.Usage(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.trusted) > 10000 { // bound memory; expired or not, start over
		clear(h.trusted)
	}
	h.trusted[sum] = now.Add(h.opts.VerifyTTL)
	return nil
}

// newClient returns an API client with the caller's key and the headers
// forwarded from the caller's request (in ctx).
func (h *httpHandler) newClient(ctx context.Context, key string) (*client.Client, error) {
	// One attempt only: the remote agent decides whether to retry, and a
	// server-side wait would hold an HTTP request open.
	opts := []client.Option{client.WithHTTPClient(h.opts.HTTPClient), client.WithMaxRetries(0), client.WithUserAgent("vertal-mcp-http")}
	fwd, _ := ctx.Value(forwardContextKey{}).(http.Header)
	for name, vs := range fwd {
		for _, v := range vs {
			opts = append(opts, client.WithHeader(name, v))
		}
	}
	return client.New(h.opts.APIURL, key, opts...)
}

// backendExtra names the Backend in auth.TokenInfo.Extra.
const backendExtra = "vertal.backend"

// backendFor returns the Backend for a tool call: the one HTTPOptions.Backend
// gave the HTTP request carrying it, or a client with that request's key.
func (h *httpHandler) backendFor(ctx context.Context, req *mcp.CallToolRequest) (Backend, error) {
	if h.opts.Backend != nil {
		if req.Extra != nil && req.Extra.TokenInfo != nil {
			if b, ok := req.Extra.TokenInfo.Extra[backendExtra].(Backend); ok {
				return b, nil
			}
		}
		return nil, errors.New("the request's caller is unknown; try again")
	}
	c, err := h.clientFor(ctx, req)
	if err != nil {
		return nil, err
	}
	return clientBackend{c}, nil
}

// clientFor builds a client with the key of the HTTP request carrying the
// tool call.
func (h *httpHandler) clientFor(ctx context.Context, req *mcp.CallToolRequest) (*client.Client, error) {
	key, _ := ctx.Value(keyContextKey{}).(string)
	if req.Extra != nil && req.Extra.Header != nil {
		// The headers of the HTTP request that carried this call.
		key, _ = bearerKey(req.Extra.Header.Get("Authorization"))
		ctx = context.WithValue(ctx, forwardContextKey{}, h.forwarded(req.Extra.Header))
	}
	if key == "" {
		return nil, errors.New("missing API key: send the header Authorization: Bearer kubo_sk_<key>")
	}
	return h.newClient(ctx, key)
}

// ensureServer builds the MCP server the first time a verified caller
// arrives, asking the API for its languages with that caller's key unless
// Options.Languages were given. A server built without versions (the API
// did not answer) is rebuilt at most once a minute until one is complete.
func (h *httpHandler) ensureServer(ctx context.Context, key string) {
	h.mu.Lock()
	if h.srv != nil && (h.complete || h.now().Sub(h.lastFetch) < time.Minute) {
		h.mu.Unlock()
		return
	}
	h.lastFetch = h.now()
	h.mu.Unlock()

	langs, images := h.opts.Languages, h.opts.Images
	if langs == nil && h.opts.Backend == nil {
		if c, err := h.newClient(ctx, key); err == nil {
			langs = fetchLanguages(ctx, c, h.log)
			if images == nil {
				images = fetchImages(ctx, c)
			}
		}
	}
	srv := newServer(h.tools, langs, images, h.opts.Version, false)
	var sbxSrv *mcp.Server
	if h.opts.Backend != nil {
		// Only an API server's own Backend can serve sandboxes; which
		// of the two servers a request gets is its Backend's to say.
		sbxSrv = newServer(h.tools, langs, images, h.opts.Version, true)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.complete {
		h.srv, h.sbxSrv, h.complete = srv, sbxSrv, langs != nil
	}
}

func (h *httpHandler) server(r *http.Request) *mcp.Server {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sbx, _ := r.Context().Value(sandboxesContextKey{}).(bool); sbx && h.sbxSrv != nil {
		return h.sbxSrv
	}
	return h.srv
}

// writeError answers in the API's error shape.
func writeError(w http.ResponseWriter, e *client.Error) {
	id := e.RequestID
	if id == "" {
		id = w.Header().Get("X-Request-ID")
	}
	if id == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id = "req_" + hex.EncodeToString(b[:])
	}
	w.Header().Set("X-Request-ID", id)
	w.Header().Set("Content-Type", "application/json")
	if e.StatusCode == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="vertal-run"`)
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strings.TrimSuffix(e.RetryAfter.Round(time.Second).String(), "s"))
	}
	w.WriteHeader(e.StatusCode)
	json.NewEncoder(w).Encode(map[string]any{
		"error":      map[string]string{"code": e.Code, "message": e.Message},
		"request_id": id,
	})
}
