package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// fakeAPI is a scripted stand-in for the Vertal Run API. Each request to a
// route pops the next scripted reply; when the script is empty the route's
// default reply is used. It records every request it saw.
type fakeAPI struct {
	t  *testing.T
	mu sync.Mutex
	// replies scripted per "METHOD /path" (path without the /api prefix).
	script map[string][]reply
	seen   []seenRequest
	keys   map[string]bool // valid API keys
}

type reply struct {
	status int
	header map[string]string
	body   string
}

type seenRequest struct {
	Method         string
	Path           string
	Auth           string
	IdempotencyKey string
	ContentType    string
	Body           string
}

const okExecution = `{"id":"exe_9392448a9b514e3f90193963b7d948d0","status":"succeeded","stdout":"42\n","stderr":"","exit_code":0,"duration_ms":265,"truncated":false,"usage":{"sandbox_seconds":0.265},"request_id":"req_be05ea1492f949f8a0617a4f3cd738cc"}`

func newFakeAPI(t *testing.T) (*fakeAPI, *httptest.Server) {
	f := &fakeAPI{t: t, script: map[string][]reply{}, keys: map[string]bool{"kubo_sk_test": true}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeAPI) push(route string, rs ...reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script[route] = append(f.script[route], rs...)
}

func (f *fakeAPI) requests() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.seen...)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	path := strings.TrimPrefix(r.URL.Path, "/api")
	route := r.Method + " " + path
	if strings.HasPrefix(path, "/v1/executions/") && r.Method == http.MethodGet {
		route = "GET /v1/executions/{id}"
	}
	f.mu.Lock()
	f.seen = append(f.seen, seenRequest{
		Method: r.Method, Path: r.URL.Path, Auth: r.Header.Get("Authorization"),
		IdempotencyKey: r.Header.Get("Idempotency-Key"), ContentType: r.Header.Get("Content-Type"), Body: string(body),
	})
	var rep reply
	if q := f.script[route]; len(q) > 0 {
		rep, f.script[route] = q[0], q[1:]
	} else {
		rep = f.defaultReply(route, r)
	}
	f.mu.Unlock()

	for k, v := range rep.header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rep.status)
	io.WriteString(w, rep.body)
}

// defaultReply is called with f.mu held.
func (f *fakeAPI) defaultReply(route string, r *http.Request) reply {
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !f.keys[key] {
		return reply{status: 401, header: map[string]string{"X-Request-ID": "req_401"}, body: `{"error":{"code":"unauthorized","message":"invalid or revoked API key"},"request_id":"req_401"}`}
	}
	switch route {
	case "POST /v1/executions":
		return reply{status: 200, body: okExecution}
	case "GET /v1/executions/{id}":
		return reply{status: 200, body: `{"id":"exe_1","status":"failed","stdout":"","stderr":"boom\n","exit_code":1,"duration_ms":12,"truncated":false,"usage":{"sandbox_seconds":0.012},"request_id":"req_2","language":"python","image":"datasci","image_version":"20261201T092047Z-19222","created_at":1700000000}`}
	case "GET /v1/usage":
		return reply{status: 200, body: `{"tenant":"kubo-vibe","plan":"pro","today":{"executions":3,"sandbox_seconds":2.635},"limits":{"executions_per_day":10000,"requests_per_minute":120,"max_timeout_s":60,"memory_mb":256,"gpu":0}}`}
	case "POST /v1/keys/rotate":
		delete(f.keys, key)
		f.keys["kubo_sk_new"] = true
		return reply{status: 200, body: `{"api_key":"kubo_sk_new","key_id":"key_new","revoked_key_id":"key_old","plan":"pro"}`}
	case "GET /v1/languages":
		return reply{status: 200, body: `{"languages":[{"name":"python","version":"3.11.2","aliases":["py"]},{"name":"bash","version":"5.2.15"}]}`}
	}
	return reply{status: 404, body: `{"error":{"code":"not_found","message":"no such route"},"request_id":"req_404"}`}
}

// newTestClient returns a client whose sleeps are recorded, not slept.
func newTestClient(t *testing.T, baseURL string, opts ...Option) (*Client, *[]time.Duration) {
	t.Helper()
	c, err := New(baseURL, "kubo_sk_test", opts...)
	if err != nil {
		t.Fatal(err)
	}
	var slept []time.Duration
	c.sleep = func(_ context.Context, d time.Duration) error {
		slept = append(slept, d)
		return nil
	}
	n := 0
	c.newID = func() string { n++; return fmt.Sprintf("id%d", n) }
	return c, &slept
}

func TestRunSendsDocumentedRequest(t *testing.T) {
	for _, suffix := range []string{"", "/api", "/api/"} {
		t.Run("base"+suffix, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			c, _ := newTestClient(t, srv.URL+suffix)
			got, err := c.Run(context.Background(), "print(6 * 7)")
			if err != nil {
				t.Fatal(err)
			}
			want := &Execution{
				ID: "exe_9392448a9b514e3f90193963b7d948d0", Status: StatusSucceeded, Stdout: "42\n",
				DurationMS: 265, Usage: ExecutionUsage{SandboxSeconds: 0.265}, RequestID: "req_be05ea1492f949f8a0617a4f3cd738cc",
			}
			if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Execution{}, "Raw")); diff != "" {
				t.Errorf("Run result (-want +got):\n%s", diff)
			}
			if string(got.Raw) != okExecution {
				t.Errorf("Raw = %s, want the body as received", got.Raw)
			}
			wantReq := []seenRequest{{
				Method: "POST", Path: strings.TrimRight(suffix, "/") + "/v1/executions",
				Auth: "Bearer kubo_sk_test", IdempotencyKey: "vertal-id1", ContentType: "application/json",
				Body: `{"language":"python","code":"print(6 * 7)"}`,
			}}
			if diff := cmp.Diff(wantReq, f.requests()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunOptions(t *testing.T) {
	f, srv := newFakeAPI(t)
	c, _ := newTestClient(t, srv.URL)
	_, err := c.Run(context.Background(), "cat", WithLanguage("bash"), WithTimeout(5*time.Second), WithStdin("hi\n"), WithIdempotencyKey("order-1234"))
	if err != nil {
		t.Fatal(err)
	}
	got := f.requests()[0]
	if got.IdempotencyKey != "order-1234" {
		t.Errorf("Idempotency-Key = %q, want the caller's", got.IdempotencyKey)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(got.Body), &body); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"language": "bash", "code": "cat", "timeout_s": 5.0, "stdin": "hi\n"}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
}

func TestRetries(t *testing.T) {
	overloaded := reply{status: 503, header: map[string]string{"Retry-After": "2"}, body: `{"error":{"code":"overloaded","message":"all sandboxes are busy"},"request_id":"req_a"}`}
	rateLimited := reply{status: 429, header: map[string]string{"Retry-After": "7"}, body: `{"error":{"code":"rate_limited","message":"120 requests per minute"},"request_id":"req_c"}`}
	quota := reply{status: 429, header: map[string]string{"Retry-After": "3"}, body: `{"error":{"code":"quota_exceeded","message":"daily quota of 100 executions reached"},"request_id":"req_d"}`}
	longWait := reply{status: 503, header: map[string]string{"Retry-After": "3600"}, body: `{"error":{"code":"overloaded","message":"busy"},"request_id":"req_e"}`}
	badRequest := reply{status: 400, body: `{"error":{"code":"invalid_timeout","message":"timeout_s must be between 1 and 60"},"request_id":"req_f"}`}
	internal := reply{status: 500, body: `{"error":{"code":"internal","message":"internal error"},"request_id":"req_g"}`}

	for _, tc := range []struct {
		name      string
		route     string
		script    []reply
		call      func(*Client) error
		wantSleep []time.Duration
		wantCode  string // "" for success
		wantTries int
	}{
		{
			name: "503 then success honours Retry-After", route: "POST /v1/executions",
			script: []reply{overloaded}, wantSleep: []time.Duration{2 * time.Second}, wantTries: 2,
		},
		{
			name: "429 rate_limited honours Retry-After", route: "POST /v1/executions",
			script: []reply{rateLimited, rateLimited}, wantSleep: []time.Duration{7 * time.Second, 7 * time.Second}, wantTries: 3,
		},
		{
			name: "gives up after max retries", route: "POST /v1/executions",
			script:    []reply{overloaded, overloaded, overloaded, overloaded, overloaded},
			wantSleep: []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}, wantCode: CodeOverloaded, wantTries: 4,
		},
		{
			name: "quota_exceeded is not retried", route: "POST /v1/executions",
			script: []reply{quota}, wantCode: CodeQuotaExceeded, wantTries: 1,
		},
		{
			name: "Retry-After over the cap is returned at once", route: "POST /v1/executions",
			script: []reply{longWait}, wantCode: CodeOverloaded, wantTries: 1,
		},
		{
			name: "409 idempotency_in_progress is retried", route: "POST /v1/executions",
			script:    []reply{{status: 409, header: map[string]string{"Retry-After": "1"}, body: `{"error":{"code":"idempotency_in_progress","message":"still running"},"request_id":"req_i"}`}},
			wantSleep: []time.Duration{time.Second}, wantTries: 2,
		},
		{
			name: "409 idempotency_conflict is not retried", route: "POST /v1/executions",
			script:   []reply{{status: 409, body: `{"error":{"code":"idempotency_conflict","message":"different body"},"request_id":"req_j"}`}},
			wantCode: CodeIdempotencyConflict, wantTries: 1,
		},
		{
			name: "400 is not retried", route: "POST /v1/executions",
			script: []reply{badRequest}, wantCode: CodeInvalidTimeout, wantTries: 1,
		},
		{
			name: "500 is not retried", route: "POST /v1/executions",
			script: []reply{internal}, wantCode: "internal", wantTries: 1,
		},
		{
			name: "GET is retried on 503", route: "GET /v1/usage",
			script: []reply{overloaded}, wantSleep: []time.Duration{2 * time.Second}, wantTries: 2,
			call: func(c *Client) error { _, err := c.Usage(context.Background()); return err },
		},
		{
			name: "rotate is not retried on 503", route: "POST /v1/keys/rotate",
			script: []reply{overloaded}, wantCode: CodeOverloaded, wantTries: 1,
			call: func(c *Client) error { _, err := c.RotateKey(context.Background()); return err },
		},
		{
			name: "rotate is retried on 429 rate_limited", route: "POST /v1/keys/rotate",
			script: []reply{rateLimited}, wantSleep: []time.Duration{7 * time.Second}, wantTries: 2,
			call: func(c *Client) error { _, err := c.RotateKey(context.Background()); return err },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			f.push(tc.route, tc.script...)
			c, slept := newTestClient(t, srv.URL)
			call := tc.call
			if call == nil {
				call = func(c *Client) error { _, err := c.Run(context.Background(), "print(1)"); return err }
			}
			err := call(c)
			var gotCode string
			if err != nil {
				var apiErr *Error
				if !errors.As(err, &apiErr) {
					t.Fatalf("error %v is not an *Error", err)
				}
				gotCode = apiErr.Code
			}
			if gotCode != tc.wantCode {
				t.Errorf("error code = %q (err %v), want %q", gotCode, err, tc.wantCode)
			}
			if diff := cmp.Diff(tc.wantSleep, *slept); diff != "" {
				t.Errorf("sleeps (-want +got):\n%s", diff)
			}
			reqs := f.requests()
			if len(reqs) != tc.wantTries {
				t.Fatalf("server saw %d requests, want %d", len(reqs), tc.wantTries)
			}
			// Every attempt of one Run carries the same idempotency key and
			// body, so the server can recognise a retry and never run twice.
			for _, r := range reqs[1:] {
				if r.IdempotencyKey != reqs[0].IdempotencyKey || r.Body != reqs[0].Body {
					t.Errorf("retry sent key %q body %q, first attempt sent %q %q", r.IdempotencyKey, r.Body, reqs[0].IdempotencyKey, reqs[0].Body)
				}
			}
		})
	}
}

func TestBackoffWithoutRetryAfter(t *testing.T) {
	f, srv := newFakeAPI(t)
	busy := reply{status: 503, body: `{"error":{"code":"overloaded","message":"busy"},"request_id":"req_b"}`}
	f.push("POST /v1/executions", busy, busy)
	c, slept := newTestClient(t, srv.URL)
	if _, err := c.Run(context.Background(), "print(1)"); err != nil {
		t.Fatal(err)
	}
	if len(*slept) != 2 {
		t.Fatalf("slept %v, want two backoffs", *slept)
	}
	for i, d := range *slept {
		lo := firstBackoff << i
		if d < lo || d > lo+lo/4 {
			t.Errorf("backoff %d = %v, want in [%v, %v]", i, d, lo, lo+lo/4)
		}
	}
}

// failingTransport fails the first n round trips as a dropped connection.
type failingTransport struct {
	mu   sync.Mutex
	n    int
	seen []string // Idempotency-Key of every attempt
}

func (ft *failingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ft.mu.Lock()
	ft.seen = append(ft.seen, r.Header.Get("Idempotency-Key"))
	fail := ft.n > 0
	ft.n--
	ft.mu.Unlock()
	if fail {
		return nil, errors.New("connection reset by peer")
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestConnectionErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		call      func(*Client) error
		wantErr   bool
		wantTries int
	}{
		{"run retries with the same key", func(c *Client) error { _, err := c.Run(context.Background(), "print(1)"); return err }, false, 2},
		{"get retries", func(c *Client) error { _, err := c.Get(context.Background(), "exe_1"); return err }, false, 2},
		{"rotate does not retry", func(c *Client) error { _, err := c.RotateKey(context.Background()); return err }, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := newFakeAPI(t)
			ft := &failingTransport{n: 1}
			c, _ := newTestClient(t, srv.URL, WithHTTPClient(&http.Client{Transport: ft}))
			err := tc.call(c)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if len(ft.seen) != tc.wantTries {
				t.Fatalf("%d attempts, want %d", len(ft.seen), tc.wantTries)
			}
			for _, k := range ft.seen[1:] {
				if k != ft.seen[0] {
					t.Errorf("attempts used keys %q, want one key", ft.seen)
				}
			}
		})
	}
}

func TestContextCancelStopsRetrying(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.push("POST /v1/executions", reply{status: 503, header: map[string]string{"Retry-After": "5"}, body: `{"error":{"code":"overloaded","message":"busy"},"request_id":"r"}`})
	c, err := New(srv.URL, "kubo_sk_test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.sleep = func(ctx context.Context, d time.Duration) error {
		cancel()
		return sleepCtx(ctx, d)
	}
	if _, err := c.Run(ctx, "print(1)"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("server saw %d requests after cancel, want 1", n)
	}
}

func TestErrorTyping(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rep      reply
		want     *Error
		sentinel error
	}{
		{
			name: "api error shape",
			rep:  reply{status: 400, body: `{"error":{"code":"invalid_timeout","message":"timeout_s must be between 1 and 60"},"request_id":"req_x"}`},
			want: &Error{StatusCode: 400, Code: "invalid_timeout", Message: "timeout_s must be between 1 and 60", RequestID: "req_x"},
		},
		{
			name:     "quota with Retry-After",
			rep:      reply{status: 429, header: map[string]string{"Retry-After": "3600"}, body: `{"error":{"code":"quota_exceeded","message":"daily quota of 100 executions reached"},"request_id":"req_q"}`},
			want:     &Error{StatusCode: 429, Code: "quota_exceeded", Message: "daily quota of 100 executions reached", RequestID: "req_q", RetryAfter: time.Hour},
			sentinel: ErrQuotaExceeded,
		},
		{
			name:     "unauthorized",
			rep:      reply{status: 401, body: `{"error":{"code":"unauthorized","message":"invalid API key"},"request_id":"req_u"}`},
			want:     &Error{StatusCode: 401, Code: "unauthorized", Message: "invalid API key", RequestID: "req_u"},
			sentinel: ErrUnauthorized,
		},
		{
			name: "not the api shape: request id from header",
			rep:  reply{status: 502, header: map[string]string{"X-Request-ID": "req_h"}, body: `<html>bad gateway</html>`},
			want: &Error{StatusCode: 502, Code: "http_502", Message: "Bad Gateway", RequestID: "req_h"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			f.push("POST /v1/executions", tc.rep)
			c, _ := newTestClient(t, srv.URL, WithMaxRetries(0))
			_, err := c.Run(context.Background(), "x")
			var got *Error
			if !errors.As(err, &got) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.sentinel)
			}
			if errors.Is(err, ErrNotFound) {
				t.Errorf("errors.Is(%v, ErrNotFound) = true", err)
			}
			for _, part := range []string{tc.want.Code, tc.want.RequestID} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("message %q lacks %q", err.Error(), part)
				}
			}
		})
	}
}

func TestRotateKeySwitchesKey(t *testing.T) {
	f, srv := newFakeAPI(t)
	c, _ := newTestClient(t, srv.URL)
	got, err := c.RotateKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := &KeyRotation{APIKey: "kubo_sk_new", KeyID: "key_new", RevokedKeyID: "key_old", Plan: "pro"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rotation (-want +got):\n%s", diff)
	}
	if _, err := c.Usage(context.Background()); err != nil {
		t.Fatalf("usage after rotate: %v", err)
	}
	reqs := f.requests()
	if reqs[1].Auth != "Bearer kubo_sk_new" {
		t.Errorf("request after rotate used %q, want the new key", reqs[1].Auth)
	}

	// A second client still holding the old key is refused.
	old, _ := newTestClient(t, srv.URL)
	if _, err := old.Usage(context.Background()); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("old key: err = %v, want unauthorized", err)
	}
}

func TestGetUsageLanguages(t *testing.T) {
	_, srv := newFakeAPI(t)
	c, _ := newTestClient(t, srv.URL+"/api")
	ctx := context.Background()

	ex, err := c.Get(ctx, "exe_1")
	if err != nil {
		t.Fatal(err)
	}
	wantEx := &Execution{ID: "exe_1", Status: StatusFailed, Stderr: "boom\n", ExitCode: 1, DurationMS: 12,
		Usage: ExecutionUsage{SandboxSeconds: 0.012}, RequestID: "req_2", Language: "python", CreatedAt: 1700000000,
		Image: "datasci", ImageVersion: "20261201T092047Z-19222"}
	if diff := cmp.Diff(wantEx, ex, cmpopts.IgnoreFields(Execution{}, "Raw")); diff != "" {
		t.Errorf("Get (-want +got):\n%s", diff)
	}

	u, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantU := &Usage{Tenant: "kubo-vibe", Plan: "pro", Today: UsageToday{Executions: 3, SandboxSeconds: 2.635},
		Limits: Limits{ExecutionsPerDay: 10000, RequestsPerMinute: 120, MaxTimeoutS: 60, MemoryMB: 256}}
	if diff := cmp.Diff(wantU, u, cmpopts.IgnoreFields(Usage{}, "Raw")); diff != "" {
		t.Errorf("Usage (-want +got):\n%s", diff)
	}
	if !strings.Contains(string(u.Raw), `"gpu":0`) {
		t.Errorf("Usage.Raw %s lost a field the struct does not know", u.Raw)
	}

	langs, err := c.Languages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantL := []Language{{Name: "python", Version: "3.11.2", Aliases: []string{"py"}}, {Name: "bash", Version: "5.2.15"}}
	if diff := cmp.Diff(wantL, langs); diff != "" {
		t.Errorf("Languages (-want +got):\n%s", diff)
	}
}

func TestDecodeLanguagesBareArray(t *testing.T) {
	got, err := decodeLanguages(json.RawMessage(`[{"name":"javascript","version":"22.23.5"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Language{{Name: "javascript", Version: "22.23.5"}}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      map[string]string
		wantBase string
		wantErr  error
	}{
		{"both", map[string]string{EnvURL: "http://127.0.0.1:8080/api/", EnvKey: "kubo_sk_a"}, "http://127.0.0.1:8080/api", nil},
		{"default url", map[string]string{EnvKey: "kubo_sk_a"}, DefaultBaseURL, nil},
		{"no key", map[string]string{EnvURL: "http://x"}, "", ErrNoAPIKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := fromLookup(func(k string) string { return tc.env[k] })
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && c.BaseURL() != tc.wantBase {
				t.Errorf("BaseURL = %q, want %q", c.BaseURL(), tc.wantBase)
			}
		})
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "vertalrun.com/api", "ftp://x", "http://", "http://x/api?k=1"} {
		if _, err := New(u, "k"); err == nil {
			t.Errorf("New(%q) = nil error", u)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{"-1", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestGeneratedIdempotencyKeysDiffer(t *testing.T) {
	f, srv := newFakeAPI(t)
	c, err := New(srv.URL, "kubo_sk_test")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.Run(context.Background(), "print(1)"); err != nil {
			t.Fatal(err)
		}
	}
	reqs := f.requests()
	a, b := reqs[0].IdempotencyKey, reqs[1].IdempotencyKey
	if a == b || !strings.HasPrefix(a, "vertal-") || len(a) != len("vertal-")+32 {
		t.Errorf("generated keys %q and %q: want distinct vertal-<32 hex>", a, b)
	}
}
