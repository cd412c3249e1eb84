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
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
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
	maxResponseBytes    = 16 << 20
	userAgent           = "vertal-go/0.2"
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

// runRequest is the body of POST /v1/executions.
type runRequest struct {
	Language string   `json:"language"`
	Code     string   `json:"code"`
	TimeoutS *float64 `json:"timeout_s,omitempty"`
	Stdin    string   `json:"stdin,omitempty"`

	idempotencyKey string
}

// RunOption configures one Run.
type RunOption func(*runRequest)

// WithLanguage picks the language: "python" (the default), "javascript" or
// "bash". Languages lists what the server offers.
func WithLanguage(name string) RunOption {
	return func(r *runRequest) { r.Language = name }
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
	return func(r *runRequest) { r.Stdin = s }
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
	req := runRequest{Language: "python", Code: code}
	for _, o := range opts {
		o(&req)
	}
	if req.idempotencyKey == "" {
		req.idempotencyKey = "vertal-" + c.newID()
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("vertal: encoding request: %w", err)
	}
	var ex Execution
	raw, err := c.do(ctx, call{
		method:  http.MethodPost,
		path:    "/v1/executions",
		body:    body,
		header:  http.Header{"Idempotency-Key": {req.idempotencyKey}},
		retry:   retryAlways,
		decodes: &ex,
	})
	if err != nil {
		return nil, err
	}
	ex.Raw = raw
	return &ex, nil
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
	decodes any
}

// do sends a call, retrying as its policy allows, and decodes a 2xx body
// into c.decodes. It returns the raw body.
func (c *Client) do(ctx context.Context, cl call) (json.RawMessage, error) {
	for attempt := 0; ; attempt++ {
		raw, wait, err := c.attempt(ctx, cl, attempt)
		if err == nil || wait < 0 || attempt >= c.maxRetries {
			return raw, err
		}
		if err := c.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// attempt sends the call once. A negative wait means the error is final.
func (c *Client) attempt(ctx context.Context, cl call, n int) (json.RawMessage, time.Duration, error) {
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
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if cl.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}

	resp, err := c.httpClient.Do(req)
	if err != nil {
		if ctx.Err() != nil || cl.retry != retryAlways {
			return nil, -1, fmt.Errorf("vertal: %s %s: %w", cl.method, cl.path, err)
		}
		return nil, c.backoff(n), fmt.Errorf("vertal: %s %s: %w", cl.method, cl.path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		if ctx.Err() != nil || cl.retry != retryAlways {
			return nil, -1, fmt.Errorf("vertal: reading %s %s response: %w", cl.method, cl.path, err)
		}
		return nil, c.backoff(n), fmt.Errorf("vertal: reading %s %s response: %w", cl.method, cl.path, err)
	}

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, cl.decodes); err != nil {
			return nil, -1, fmt.Errorf("vertal: decoding %s %s response: %w", cl.method, cl.path, err)
		}
		return raw, 0, nil
	}

	apiErr := c.parseError(resp, raw)
	return nil, c.retryWait(cl.retry, apiErr, n), apiErr
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
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
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
