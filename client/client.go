// Package client is the Go SDK for the Vertal Run API: run Python,
// JavaScript or Bash in a fresh sandbox and get its output back.
//
// A Client is safe for concurrent use. Every call takes a context; cancel
// it to give up waiting (the server still finishes an execution it has
// started, and a later Run with the same idempotency key returns it).
//
// Requests refused with 503 (overloaded) or 429 (rate_limited), and runs
// answered 409 idempotency_in_progress, are retried after the server's
// Retry-After. Run always sends an Idempotency-Key,
// generating one when the caller gave none, so a retried request can never
// run the code twice.
package client

import (
	"bytes"
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// DefaultBaseURL is the hosted service, used by FromEnv when KUBO_API_URL is
// not set. A self-hosted server's base URL is http(s)://HOST[:PORT], with or
// without the /api suffix.
const DefaultBaseURL = "https://vertalrun.com/api"

// Environment variables read by FromEnv.
const (
	EnvURL = "KUBO_API_URL"
	EnvKey = "KUBO_API_KEY"
)

const (
	defaultMaxRetries   = 3
	defaultMaxRetryWait = 30 * time.Second
	firstBackoff        = 500 * time.Millisecond
	// maxResponseBytes bounds one JSON answer (and one SSE line): two
	// 64 KB output streams plus the largest plan's returned files (50 MB)
	// in base64, with room to spare.
	maxResponseBytes = 96 << 20
	userAgent        = "vertal-go/0.2"
)

// Client calls one Vertal Run server with one API key.
type Client struct {
	baseURL      string
	httpClient   *http.Client
	maxRetries   int
	maxRetryWait time.Duration
	userAgent    string
	header       http.Header // extra headers on every request

	// Injected so tests control time and randomness.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
	newID func() string

	mu  sync.RWMutex
	key string // replaced by RotateKey
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (transport, proxies, TLS). Its
// Timeout, if any, bounds each attempt; prefer a context deadline.
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) {
		if h != nil {
			c.httpClient = h
		}
	}
}

// WithMaxRetries sets how many times a refused request (503, 429) is
// retried; 0 disables retries. The default is 3.
func WithMaxRetries(n int) Option {
	return func(c *Client) { c.maxRetries = max(n, 0) }
}

// WithMaxRetryWait caps how long the client waits before one retry. When
// the server asks for longer (Retry-After), the error is returned at once
// with Error.RetryAfter set. The default is 30 seconds.
func WithMaxRetryWait(d time.Duration) Option {
	return func(c *Client) { c.maxRetryWait = d }
}

// WithUserAgent prefixes the User-Agent header, e.g. "my-app/1.2".
func WithUserAgent(ua string) Option {
	return func(c *Client) {
		if ua != "" {
			c.userAgent = ua + " " + userAgent
		}
	}
}

// WithHeader adds a header to every request, e.g. one a proxy in front of
// the API requires. Authorization, Idempotency-Key and the content headers
// are set by the client and cannot be replaced this way.
func WithHeader(name, value string) Option {
	return func(c *Client) {
		if c.header == nil {
			c.header = http.Header{}
		}
		c.header.Add(name, value)
	}
}

// New returns a client for the server at baseURL (for example
// "https://vertalrun.com/api" or "http://127.0.0.1:8080") using apiKey.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("vertal: base URL %q must be http(s)://host[:port][/path]", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("vertal: base URL %q must not have a query or fragment", baseURL)
	}
	c := &Client{
		baseURL:      strings.TrimRight(u.String(), "/"),
		httpClient:   http.DefaultClient,
		maxRetries:   defaultMaxRetries,
		maxRetryWait: defaultMaxRetryWait,
		userAgent:    userAgent,
		now:          time.Now,
		sleep:        sleepCtx,
		newID:        randomHex,
		key:          strings.TrimSpace(apiKey),
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// FromEnv returns a client configured by KUBO_API_URL (default
// DefaultBaseURL) and KUBO_API_KEY (required).
func FromEnv(opts ...Option) (*Client, error) {
	return fromLookup(os.Getenv, opts...)
}

func fromLookup(getenv func(string) string, opts ...Option) (*Client, error) {
	key := strings.TrimSpace(getenv(EnvKey))
	if key == "" {
		return nil, ErrNoAPIKey
	}
	base := strings.TrimSpace(getenv(EnvURL))
	if base == "" {
		base = DefaultBaseURL
	}
	return New(base, key, opts...)
}

// BaseURL returns the server's base URL without a trailing slash.
func (c *Client) BaseURL() string { return c.baseURL }

func (c *Client) apiKey() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.key
}

// runRequest is the body of POST /v1/executions with the key it is sent
// under. Fields the caller did not set are left out of the body, so a
// plain run sends exactly what older servers expect; Async and WebhookURL
// are set by Submit (and WebhookURL by a batch item), never by a
// synchronous run.
type runRequest struct {
	wire.ExecutionRequest

	idempotencyKey string
}

// File is a file placed in the program's working directory before it
// starts, next to main.py (or main.js, main.sh).
type File struct {
	// Path is relative and '/'-separated, e.g. "data.csv" or "in/a.txt".
	// The server refuses "..", absolute paths, duplicates and the name of
	// the code file itself.
	Path string
	// Content is the file's bytes, text or binary.
	Content []byte
}

const (
	encodingUTF8   = "utf8"
	encodingBase64 = "base64"
)

// encodeFile sends text as it is and anything else as base64: bytes
// that are valid UTF-8 without NUL survive a JSON string unchanged, the
// rest would not.
func encodeFile(f File) wire.File {
	if utf8.Valid(f.Content) && bytes.IndexByte(f.Content, 0) < 0 {
		return wire.File{Path: f.Path, Content: string(f.Content), Encoding: encodingUTF8}
	}
	return wire.File{Path: f.Path, Content: base64.StdEncoding.EncodeToString(f.Content), Encoding: encodingBase64}
}

// RunOption configures one Run.
type RunOption func(*runRequest)

// WithLanguage picks the language: "python" (the default), "javascript" or
// "bash". Languages lists what the server offers.
func WithLanguage(name string) RunOption {
	return func(r *runRequest) { r.Language = &name }
}

// WithImage runs on the named image ("default" when not given), e.g.
// "datasci" for pandas and matplotlib. Images lists what the caller may
// use.
func WithImage(name string) RunOption {
	return func(r *runRequest) { r.Image = nonEmpty(name) }
}

// WithTimeout sets the wall-clock limit, between 1 second and the plan's
// max_timeout_s. Without it the server's default (10 s, or the plan's
// maximum if lower) applies.
func WithTimeout(d time.Duration) RunOption {
	s := d.Seconds()
	return func(r *runRequest) { r.TimeoutS = &s }
}

// WithStdin feeds s to the program's standard input.
func WithStdin(s string) RunOption {
	return func(r *runRequest) { r.Stdin = nonEmpty(s) }
}

// WithFiles places files in the program's working directory, where the
// program finds them by relative path (open("data.csv")). Repeated
// options add to the list. The plan caps their number and total size.
func WithFiles(files ...File) RunOption {
	return func(r *runRequest) {
		for _, f := range files {
			r.Files = append(r.Files, encodeFile(f))
		}
	}
}

// WithEnv sets environment variables of the program. Repeated options
// merge, the later value winning. Names are letters, digits and _, not
// starting with a digit; PATH, HOME, LANG, PWD, NODE_OPTIONS and VERTAL_* are
// refused.
func WithEnv(env map[string]string) RunOption {
	return func(r *runRequest) {
		if len(env) == 0 {
			return
		}
		if r.Env == nil {
			r.Env = make(map[string]string, len(env))
		}
		maps.Copy(r.Env, env)
	}
}

// WithArgs passes command-line arguments to the program: sys.argv[1:] in
// Python, process.argv.slice(2) in JavaScript, $1... in Bash. Repeated
// options append.
func WithArgs(args ...string) RunOption {
	return func(r *runRequest) { r.Args = append(r.Args, args...) }
}

// WithReturnFiles asks for the files matching these globs, relative to
// the working directory ("*.png", "out/**"), once the program ends; they
// come back in Execution.Files. Repeated options append.
func WithReturnFiles(globs ...string) RunOption {
	return func(r *runRequest) { r.ReturnFiles = append(r.ReturnFiles, globs...) }
}

// WithNetwork sets what the program may reach over the network: names
// ("pypi.org"), wildcards ("*.pythonhosted.org") and address prefixes
// ("203.0.113.0/24"), each within the plan's egress allowlist (a rule
// beyond it is refused with 403 forbidden). Without this option the run
// gets the plan's whole allowlist, and the built-in plans allow nothing;
// WithNetwork() with no rules asks for no network at all. Repeated
// options add to the list. A run with a network reports what it reached
// in Execution.Network.
func WithNetwork(allow ...string) RunOption {
	return func(r *runRequest) {
		if r.Network == nil {
			r.Network = &wire.NetworkRequest{Allow: []string{}}
		}
		r.Network.Allow = append(r.Network.Allow, allow...)
	}
}

// WithIdempotencyKey makes Run retry-safe across processes: the same key
// with the same request returns the first result (IdempotentReplay set)
// without running the code or using quota again. Keys are 1-255 letters,
// digits and . _ : -. Without this option Run generates a key per call,
// which protects only its own retries.
func WithIdempotencyKey(key string) RunOption {
	return func(r *runRequest) { r.idempotencyKey = key }
}

// Run executes code in a fresh sandbox and waits for it to finish. A
// program that fails, times out or runs out of memory is a result, not an
// error: check Execution.Status and ExitCode. The error is an *Error when
// the API refused the request.
func (c *Client) Run(ctx context.Context, code string, opts ...RunOption) (*Execution, error) {
	cl, err := c.runCall(code, opts)
	if err != nil {
		return nil, err
	}
	var ex Execution
	cl.decodes = &ex
	raw, err := c.do(ctx, cl)
	if err != nil {
		return nil, err
	}
	ex.Raw = raw
	return &ex, nil
}

// newRunRequest applies the options to a request for code.
func newRunRequest(code string, opts []RunOption) runRequest {
	lang := "python"
	req := runRequest{ExecutionRequest: wire.ExecutionRequest{Language: &lang, Code: &code}}
	for _, o := range opts {
		o(&req)
	}
	return req
}

// runCall builds the POST /v1/executions call shared by Run, Stream and
// Submit (async).
func (c *Client) runCall(code string, opts []RunOption) (call, error) {
	return c.runCallAsync(code, opts, false)
}

func (c *Client) runCallAsync(code string, opts []RunOption, async bool) (call, error) {
	req := newRunRequest(code, opts)
	if async {
		req.Async = &async
	}
	if req.WebhookURL != nil && !async {
		return call{}, errors.New("vertal: WithWebhook is for Submit and Batch; a synchronous run has no webhook")
	}
	return c.postCall("/v1/executions", req, req.idempotencyKey)
}

// postCall is a retry-safe POST: it carries the caller's idempotency key,
// or one generated for this call, so a retry never runs anything twice.
func (c *Client) postCall(path string, body any, idempotencyKey string) (call, error) {
	if idempotencyKey == "" {
		idempotencyKey = "vertal-" + c.newID()
	}
	b, err := json.Marshal(body)
	if err != nil {
		return call{}, fmt.Errorf("vertal: encoding request: %w", err)
	}
	return call{
		method: http.MethodPost,
		path:   path,
		body:   b,
		header: http.Header{"Idempotency-Key": {idempotencyKey}},
		retry:  retryAlways,
	}, nil
}

// Get returns a stored execution of this key's tenant.
func (c *Client) Get(ctx context.Context, id string) (*Execution, error) {
	if id == "" {
		return nil, errors.New("vertal: empty execution id")
	}
	var ex Execution
	raw, err := c.do(ctx, call{
		method:  http.MethodGet,
		path:    "/v1/executions/" + url.PathEscape(id),
		retry:   retryAlways,
		decodes: &ex,
	})
	if err != nil {
		return nil, err
	}
	ex.Raw = raw
	return &ex, nil
}

// Usage returns today's usage (UTC) and the plan's limits.
func (c *Client) Usage(ctx context.Context) (*Usage, error) {
	var u Usage
	raw, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/usage", retry: retryAlways, decodes: &u})
	if err != nil {
		return nil, err
	}
	u.Raw = raw
	return &u, nil
}

// Languages lists the languages the server runs, with their versions.
func (c *Client) Languages(ctx context.Context) ([]Language, error) {
	var raw json.RawMessage
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/languages", retry: retryAlways, decodes: &raw}); err != nil {
		return nil, err
	}
	return decodeLanguages(raw)
}

// Images lists the images the caller's plan may run on, with their
// languages and packages (GET /v1/images).
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var out struct {
		Images []Image `json:"images"`
	}
	if _, err := c.do(ctx, call{method: http.MethodGet, path: "/v1/images", retry: retryAlways, decodes: &out}); err != nil {
		return nil, err
	}
	return out.Images, nil
}

// decodeLanguages accepts {"languages": [...]} or a bare array.
func decodeLanguages(raw json.RawMessage) ([]Language, error) {
	var langs []Language
	if err := json.Unmarshal(raw, &langs); err == nil {
		return langs, nil
	}
	var wrapped struct {
		Languages []Language `json:"languages"`
	}
	if err := json.Unmarshal(raw, &wrapped); err != nil {
		return nil, fmt.Errorf("vertal: decoding languages: %w", err)
	}
	return wrapped.Languages, nil
}

// RotateKey asks for a new key (same tenant and plan) and revokes the one
// this client used. The client switches to the new key; the result holds
// it so the caller can store it, since it is shown only once.
func (c *Client) RotateKey(ctx context.Context) (*KeyRotation, error) {
	var kr KeyRotation
	// Only a 429 is retried: it means the server did not act. Any other
	// failure may hide a rotation that happened, and retrying with the
	// revoked key could not succeed anyway.
	if _, err := c.do(ctx, call{method: http.MethodPost, path: "/v1/keys/rotate", retry: retryRateLimitOnly, decodes: &kr}); err != nil {
		return nil, err
	}
	if kr.APIKey == "" {
		return nil, errors.New("vertal: rotate response carried no api_key")
	}
	c.mu.Lock()
	c.key = kr.APIKey
	c.mu.Unlock()
	return &kr, nil
}

// retryPolicy says which failures of a call may be retried.
type retryPolicy int

const (
	// retryAlways: the call is idempotent (GET, or an execution with an
	// Idempotency-Key), so refusals and lost connections are retried.
	retryAlways retryPolicy = iota
	// retryRateLimitOnly: only a 429 rate_limited, which the server
	// answers before doing anything, is retried.
	retryRateLimitOnly
)

type call struct {
	method  string
	path    string
	body    []byte
	header  http.Header
	retry   retryPolicy
	accept  string // default application/json
	ctype   string // of the body; default application/json
	decodes any
	// gotHeader, when set, receives the headers of the 2xx answer.
	gotHeader *http.Header
}

// doDecode sends a call and decodes its 2xx body into a W.
func doDecode[W any](ctx context.Context, c *Client, cl call) (W, error) {
	var w W
	cl.decodes = &w
	_, err := c.do(ctx, cl)
	return w, err
}

// do sends a call, retrying as its policy allows, and decodes a 2xx body
// into c.decodes. It returns the raw body.
func (c *Client) do(ctx context.Context, cl call) (json.RawMessage, error) {
	return withRetries(ctx, c, func(n int) (json.RawMessage, time.Duration, error) { return c.attempt(ctx, cl, n) })
}

// open is do for a streamed answer: it retries like do, and returns the
// first 2xx response with its body unread. The caller closes the body.
func (c *Client) open(ctx context.Context, cl call) (*http.Response, error) {
	return withRetries(ctx, c, func(n int) (*http.Response, time.Duration, error) { return c.roundTrip(ctx, cl, n) })
}

// withRetries runs try(0), try(1), ... until it succeeds, its error is
// final (negative wait) or the retries are spent, sleeping between tries.
func withRetries[T any](ctx context.Context, c *Client, try func(n int) (T, time.Duration, error)) (T, error) {
	for n := 0; ; n++ {
		v, wait, err := try(n)
		if err == nil || wait < 0 || n >= c.maxRetries {
			return v, err
		}
		if err := c.sleep(ctx, wait); err != nil {
			var zero T
			return zero, err
		}
	}
}

// attempt sends the call once and reads its answer. A negative wait means
// the error is final.
func (c *Client) attempt(ctx context.Context, cl call, n int) (json.RawMessage, time.Duration, error) {
	resp, wait, err := c.roundTrip(ctx, cl, n)
	if err != nil {
		return nil, wait, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, c.transportWait(ctx, cl, n), fmt.Errorf("vertal: reading %s %s response: %w", cl.method, cl.path, err)
	}
	if err := json.Unmarshal(raw, cl.decodes); err != nil {
		return nil, -1, fmt.Errorf("vertal: decoding %s %s response: %w", cl.method, cl.path, err)
	}
	if cl.gotHeader != nil {
		*cl.gotHeader = resp.Header
	}
	return raw, 0, nil
}

// roundTrip sends the call once. It returns a 2xx response unread; any
// other answer becomes an *Error, with the wait before a retry (negative:
// final).
func (c *Client) roundTrip(ctx context.Context, cl call, n int) (*http.Response, time.Duration, error) {
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, c.baseURL+cl.path, body)
	if err != nil {
		return nil, -1, fmt.Errorf("vertal: building request: %w", err)
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	for k, vs := range cl.header {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey())
	req.Header.Set("Accept", cmp.Or(cl.accept, "application/json"))
	req.Header.Set("User-Agent", c.userAgent)
	if cl.body != nil {
		req.Header.Set("Content-Type", cmp.Or(cl.ctype, "application/json"))
	}

	resp, err := c.httpClient.Do(req)
	if err != nil {
		return nil, c.transportWait(ctx, cl, n), fmt.Errorf("vertal: %s %s: %w", cl.method, cl.path, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, 0, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, c.transportWait(ctx, cl, n), fmt.Errorf("vertal: reading %s %s response: %w", cl.method, cl.path, err)
	}
	apiErr := c.parseError(resp, raw)
	return nil, c.retryWait(cl.retry, apiErr, n), apiErr
}

// transportWait is the wait before retrying a call whose connection
// failed: only idempotent calls are sent again, never after the caller
// gave up.
func (c *Client) transportWait(ctx context.Context, cl call, n int) time.Duration {
	if ctx.Err() != nil || cl.retry != retryAlways {
		return -1
	}
	return c.backoff(n)
}

// retryWait decides whether a refused request is retried and after how
// long; -1 means not at all.
func (c *Client) retryWait(p retryPolicy, e *Error, n int) time.Duration {
	switch {
	case e.StatusCode == http.StatusTooManyRequests && e.Code == CodeQuotaExceeded:
		return -1 // the daily quota does not come back within a retry
	case e.StatusCode == http.StatusTooManyRequests:
	case e.StatusCode == http.StatusServiceUnavailable && p == retryAlways:
	case e.StatusCode == http.StatusConflict && e.Code == CodeIdempotencyInProgress && p == retryAlways:
		// The first request with this key is still running; asking again
		// returns its result once it is stored, never a second run.
	default:
		return -1
	}
	if e.RetryAfter == 0 {
		return c.backoff(n)
	}
	if e.RetryAfter > c.maxRetryWait {
		return -1
	}
	return e.RetryAfter
}

// backoff is the wait before retry n+1 when the server gave no hint:
// exponential with jitter, capped at maxRetryWait.
func (c *Client) backoff(n int) time.Duration {
	d := firstBackoff << min(n, 10)
	d += time.Duration(rand.Int64N(int64(d)/4 + 1))
	return min(d, c.maxRetryWait)
}

func (c *Client) parseError(resp *http.Response, raw []byte) *Error {
	e := &Error{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), c.now())}
	var body wire.Error
	if json.Unmarshal(raw, &body) == nil && body.Error.Code != "" {
		e.Code, e.Message, e.RequestID = body.Error.Code, body.Error.Message, body.RequestID
	} else {
		e.Code = "http_" + strconv.Itoa(resp.StatusCode)
		e.Message = http.StatusText(resp.StatusCode)
	}
	if e.RequestID == "" {
		e.RequestID = resp.Header.Get("X-Request-ID")
	}
	return e
}

// parseRetryAfter reads delta-seconds or an HTTP date; 0 if absent or bad.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		return time.Duration(max(s, 0)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func randomHex() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
