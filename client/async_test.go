package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	queuedBody  = `{"id":"exe_1","status":"queued","stdout":"","stderr":"","exit_code":0,"duration_ms":0,"truncated":false,"usage":{"sandbox_seconds":0},"request_id":"req_q","language":"python","image":"default","image_version":null,"created_at":1700000000,"files":[],"files_truncated":false,"reason":null,"webhook":{"url":"https://hooks.example.com/v","state":"pending","attempts":0,"last_status":null,"last_error":null}}`
	runningBody = `{"id":"exe_1","status":"running","stdout":"","stderr":"","exit_code":0,"duration_ms":0,"truncated":false,"usage":{"sandbox_seconds":0},"request_id":"req_r","webhook":null,"reason":null}`
	crashedBody = `{"id":"exe_1","status":"error","stdout":"","stderr":"","exit_code":0,"duration_ms":0,"truncated":false,"usage":{"sandbox_seconds":0},"request_id":"req_x","reason":"the node running it stopped","webhook":{"url":"https://hooks.example.com/v","state":"failed","attempts":7,"last_status":500,"last_error":"HTTP 500"}}`
)

func accepted(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", strings.TrimSuffix(r.URL.Path, "/batch")+"/exe_1")
		jsonReply(http.StatusAccepted, body)(w, r)
	}
}

func ptr[T any](v T) *T { return &v }

func TestSubmit(t *testing.T) {
	overloaded := jsonReply(503, `{"error":{"code":"overloaded","message":"busy"},"request_id":"req_a"}`)
	for _, tc := range []struct {
		name     string
		handlers []http.HandlerFunc
		opts     []RunOption
		wantBody string
		wantKeys []string
		want     *Execution
		wantErr  string
	}{
		{
			name:     "202 with the queued execution",
			handlers: []http.HandlerFunc{accepted(queuedBody)},
			opts:     []RunOption{WithWebhook("https://hooks.example.com/v"), WithIdempotencyKey("job-7")},
			wantBody: `{"language":"python","code":"print(1)","async":true,"webhook_url":"https://hooks.example.com/v"}`,
			wantKeys: []string{"job-7"},
			want: &Execution{ID: "exe_1", Status: StatusQueued, RequestID: "req_q", Language: "python", Image: "default", CreatedAt: 1700000000, Files: []ReturnedFile{},
				Webhook: &WebhookState{URL: "https://hooks.example.com/v", State: DeliveryPending}},
		},
		{
			name:     "retried under the same generated key",
			handlers: []http.HandlerFunc{overloaded, accepted(queuedBody)},
			wantBody: `{"language":"python","code":"print(1)","async":true}`,
			wantKeys: []string{"vertal-id1", "vertal-id1"},
			want: &Execution{ID: "exe_1", Status: StatusQueued, RequestID: "req_q", Language: "python", Image: "default", CreatedAt: 1700000000, Files: []ReturnedFile{},
				Webhook: &WebhookState{URL: "https://hooks.example.com/v", State: DeliveryPending}},
		},
		{
			name:     "the id from Location when the body has none",
			handlers: []http.HandlerFunc{accepted(`{"status":"queued"}`)},
			wantBody: `{"language":"python","code":"print(1)","async":true}`,
			wantKeys: []string{"vertal-id1"},
			want:     &Execution{ID: "exe_1", Status: StatusQueued},
		},
		{
			name:     "a refusal is an *Error",
			handlers: []http.HandlerFunc{jsonReply(400, `{"error":{"code":"invalid_request","message":"webhook_url: loopback address refused"},"request_id":"req_b"}`)},
			opts:     []RunOption{WithWebhook("https://127.0.0.1/")},
			wantBody: `{"language":"python","code":"print(1)","async":true,"webhook_url":"https://127.0.0.1/"}`,
			wantKeys: []string{"vertal-id1"},
			wantErr:  "vertal: invalid_request: webhook_url: loopback address refused (HTTP 400, request req_b)",
		},
		{
			name:     "quota is not retried",
			handlers: []http.HandlerFunc{jsonReply(429, `{"error":{"code":"quota_exceeded","message":"daily quota reached"},"request_id":"req_d"}`)},
			wantBody: `{"language":"python","code":"print(1)","async":true}`,
			wantKeys: []string{"vertal-id1"},
			wantErr:  "vertal: quota_exceeded: daily quota reached (HTTP 429, request req_d)",
		},
		{
			name:     "an answer naming no execution",
			handlers: []http.HandlerFunc{jsonReply(202, `{"status":"queued"}`)},
			wantBody: `{"language":"python","code":"print(1)","async":true}`,
			wantKeys: []string{"vertal-id1"},
			wantErr:  "vertal: submit answered without an execution id",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, _ := newStreamFake(t, tc.handlers...)
			got, err := c.Submit(context.Background(), "print(1)", tc.opts...)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, ignoreRaw); diff != "" {
				t.Errorf("execution (-want +got):\n%s", diff)
			}
			var keys []string
			for _, r := range f.requests() {
				if r.Method != "POST" || r.Path != "/v1/executions" || r.Body != tc.wantBody {
					t.Errorf("request %s %s %s, want POST /v1/executions %s", r.Method, r.Path, r.Body, tc.wantBody)
				}
				keys = append(keys, r.IdempotencyKey)
			}
			if diff := cmp.Diff(tc.wantKeys, keys); diff != "" {
				t.Errorf("Idempotency-Key (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWebhookOnlyAsync(t *testing.T) {
	f, c, _ := newStreamFake(t)
	if _, err := c.Run(context.Background(), "print(1)", WithWebhook("https://hooks.example.com/v")); err == nil || !strings.Contains(err.Error(), "WithWebhook is for Submit and Batch") {
		t.Errorf("Run with a webhook: %v", err)
	}
	for _, err := range c.Stream(context.Background(), "print(1)", WithWebhook("https://hooks.example.com/v")) {
		if err == nil || !strings.Contains(err.Error(), "WithWebhook is for Submit and Batch") {
			t.Errorf("Stream with a webhook: %v", err)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d requests sent, want none", n)
	}
}

func TestWait(t *testing.T) {
	errorEvent := "id: end\nevent: error\ndata: {\"error\":{\"code\":\"internal\",\"message\":\"node lost\"}}\n\n"
	notFound := jsonReply(404, `{"error":{"code":"not_found","message":"no such execution"},"request_id":"req_n"}`)
	for _, tc := range []struct {
		name      string
		handlers  []http.HandlerFunc
		want      *Execution
		wantReqs  []string // "METHOD path Last-Event-ID"
		wantSleep []time.Duration
		wantErr   error
	}{
		{
			name:     "the result event of the stream",
			handlers: []http.HandlerFunc{sse(": heartbeat\n\n", evStarted, evHello, evOops, evMore, evResult)},
			want:     wantResult,
			wantReqs: []string{"GET /v1/executions/exe_1/events "},
		},
		{
			name:      "a dropped stream resumes after its last event",
			handlers:  []http.HandlerFunc{sse(evStarted, evHello), sse(evOops, evMore, evResult)},
			want:      wantResult,
			wantReqs:  []string{"GET /v1/executions/exe_1/events ", "GET /v1/executions/exe_1/events 6-0"},
			wantSleep: []time.Duration{500 * time.Millisecond},
		},
		{
			name: "an error event: polls until final",
			handlers: []http.HandlerFunc{sse(evStarted, errorEvent),
				jsonReply(200, runningBody), jsonReply(200, runningBody), jsonReply(200, crashedBody)},
			want: &Execution{ID: "exe_1", Status: StatusError, RequestID: "req_x", Reason: "the node running it stopped",
				Webhook: &WebhookState{URL: "https://hooks.example.com/v", State: DeliveryFailed, Attempts: 7, LastStatus: ptr(500), LastError: ptr("HTTP 500")}},
			wantReqs:  []string{"GET /v1/executions/exe_1/events ", "GET /v1/executions/exe_1 ", "GET /v1/executions/exe_1 ", "GET /v1/executions/exe_1 "},
			wantSleep: []time.Duration{500 * time.Millisecond, time.Second},
		},
		{
			name: "a stream that keeps breaking: polls",
			handlers: []http.HandlerFunc{sse(evStarted), sse(), sse(), sse(),
				jsonReply(200, queuedBody), jsonReply(200, resultBody)},
			want: wantResult,
			wantReqs: []string{"GET /v1/executions/exe_1/events ", "GET /v1/executions/exe_1/events 0-0", "GET /v1/executions/exe_1/events 0-0",
				"GET /v1/executions/exe_1/events 0-0", "GET /v1/executions/exe_1 ", "GET /v1/executions/exe_1 "},
			// Three reconnections of the stream, then one wait between GETs.
			wantSleep: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 500 * time.Millisecond},
		},
		{
			name:     "no events route: polls",
			handlers: []http.HandlerFunc{notFound, jsonReply(200, resultBody)},
			want:     wantResult,
			wantReqs: []string{"GET /v1/executions/exe_1/events ", "GET /v1/executions/exe_1 "},
		},
		{
			name:     "an unknown id",
			handlers: []http.HandlerFunc{notFound, notFound},
			wantReqs: []string{"GET /v1/executions/exe_1/events ", "GET /v1/executions/exe_1 "},
			wantErr:  ErrNotFound,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, slept := newStreamFake(t, tc.handlers...)
			got, err := c.Wait(context.Background(), "exe_1")
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, ignoreRaw); diff != "" {
				t.Errorf("execution (-want +got):\n%s", diff)
			}
			var reqs []string
			for _, r := range f.requests() {
				reqs = append(reqs, r.Method+" "+r.Path+" "+r.LastEventID)
			}
			if diff := cmp.Diff(tc.wantReqs, reqs); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			// Waits carry jitter: compare them rounded down to the base.
			var sleeps []time.Duration
			for _, d := range *slept {
				sleeps = append(sleeps, roundToBase(d))
			}
			if diff := cmp.Diff(tc.wantSleep, sleeps); diff != "" {
				t.Errorf("waits (-want +got):\n%s", diff)
			}
		})
	}
}

// roundToBase maps a jittered wait back to its power-of-two base of
// firstBackoff (the jitter adds at most a quarter of it).
func roundToBase(d time.Duration) time.Duration {
	base := firstBackoff
	for base*2 <= d*5/4 {
		base *= 2
	}
	return base
}

func TestPollWaitIsCapped(t *testing.T) {
	for n := range 20 {
		if d := pollWait(n); d <= 0 || d > maxPollWait {
			t.Errorf("pollWait(%d) = %v, want in (0, %v]", n, d, maxPollWait)
		}
	}
}

func TestWaitGivesUpWithTheContext(t *testing.T) {
	f, c, _ := newStreamFake(t, jsonReply(404, `{"error":{"code":"not_found","message":"no events here"},"request_id":"req_n"}`))
	for range 50 {
		f.handlers = append(f.handlers, jsonReply(200, queuedBody))
	}
	ctx, cancel := context.WithCancel(context.Background())
	polls := 0
	c.sleep = func(ctx context.Context, d time.Duration) error {
		if polls++; polls == 3 {
			cancel()
		}
		return ctx.Err()
	}
	if _, err := c.Wait(ctx, "exe_1"); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if _, err := c.Wait(context.Background(), ""); err == nil {
		t.Error("Wait with an empty id succeeded")
	}
}

func TestBatch(t *testing.T) {
	items := []BatchItem{
		{Code: "print(1)"},
		{Code: "echo $1", Language: "bash", Timeout: 5 * time.Second, Stdin: "in", Args: []string{"a"}, Env: map[string]string{"K": "v"},
			Files: []File{{Path: "d.bin", Content: []byte{0, 1}}}, ReturnFiles: []string{"*.txt"}, WebhookURL: "https://own.example.com/"},
	}
	twoQueued := `{"executions":[` + strings.Replace(queuedBody, "exe_1", "exe_a", 1) + `,` + strings.Replace(runningBody, "exe_1", "exe_b", 1) + `]}`
	wantItems := `{"executions":[{"language":"python","code":"print(1)"},` +
		`{"language":"bash","code":"echo $1","timeout_s":5,"stdin":"in","files":[{"path":"d.bin","content":"AAE=","encoding":"base64"}],"env":{"K":"v"},"args":["a"],"return_files":["*.txt"],"webhook_url":"https://own.example.com/"}],` +
		`"webhook_url":"https://batch.example.com/"}`
	overloaded := jsonReply(503, `{"error":{"code":"overloaded","message":"busy"},"request_id":"req_a"}`)
	for _, tc := range []struct {
		name     string
		handlers []http.HandlerFunc
		opts     []BatchOption
		wantIDs  []string
		wantKeys []string
		wantErr  string
	}{
		{
			name:     "in order, batch webhook, own key",
			handlers: []http.HandlerFunc{accepted(twoQueued)},
			opts:     []BatchOption{WithBatchWebhook("https://batch.example.com/"), WithBatchIdempotencyKey("batch-1")},
			wantIDs:  []string{"exe_a", "exe_b"},
			wantKeys: []string{"batch-1"},
		},
		{
			name:     "retried under the same generated key",
			handlers: []http.HandlerFunc{overloaded, accepted(twoQueued)},
			opts:     []BatchOption{WithBatchWebhook("https://batch.example.com/")},
			wantIDs:  []string{"exe_a", "exe_b"},
			wantKeys: []string{"vertal-id1", "vertal-id1"},
		},
		{
			name:     "an invalid item is an *Error naming its index",
			handlers: []http.HandlerFunc{jsonReply(400, `{"error":{"code":"invalid_request","message":"executions[1].language: unsupported language \"cobol\""},"request_id":"req_b"}`)},
			opts:     []BatchOption{WithBatchWebhook("https://batch.example.com/")},
			wantKeys: []string{"vertal-id1"},
			wantErr:  `vertal: invalid_request: executions[1].language: unsupported language "cobol" (HTTP 400, request req_b)`,
		},
		{
			name:     "a batch over the quota is refused whole, not retried",
			handlers: []http.HandlerFunc{jsonReply(429, `{"error":{"code":"quota_exceeded","message":"the batch needs 2 executions, 1 left today"},"request_id":"req_d"}`)},
			opts:     []BatchOption{WithBatchWebhook("https://batch.example.com/")},
			wantKeys: []string{"vertal-id1"},
			wantErr:  "vertal: quota_exceeded: the batch needs 2 executions, 1 left today (HTTP 429, request req_d)",
		},
		{
			name:     "an answer of the wrong length",
			handlers: []http.HandlerFunc{accepted(`{"executions":[` + queuedBody + `]}`)},
			opts:     []BatchOption{WithBatchWebhook("https://batch.example.com/")},
			wantKeys: []string{"vertal-id1"},
			wantErr:  "vertal: batch of 2 answered 1 executions",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, _ := newStreamFake(t, tc.handlers...)
			got, err := c.Batch(context.Background(), items, tc.opts...)
			if tc.wantErr != "" {
				var apiErr *Error
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.HasPrefix(tc.wantErr, "vertal: invalid_request") && !errors.As(err, &apiErr) {
					t.Errorf("err is %T, want *Error", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, ex := range got {
				ids = append(ids, ex.ID)
				if !json.Valid(ex.Raw) || !strings.Contains(string(ex.Raw), ex.ID) {
					t.Errorf("Raw of %s = %s, want its own object", ex.ID, ex.Raw)
				}
			}
			if diff := cmp.Diff(tc.wantIDs, ids); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
			var keys []string
			for _, r := range f.requests() {
				if r.Method != "POST" || r.Path != "/v1/executions/batch" || r.Body != wantItems {
					t.Errorf("request %s %s\n%s\nwant POST /v1/executions/batch\n%s", r.Method, r.Path, r.Body, wantItems)
				}
				keys = append(keys, r.IdempotencyKey)
			}
			if diff := cmp.Diff(tc.wantKeys, keys); diff != "" {
				t.Errorf("Idempotency-Key (-want +got):\n%s", diff)
			}
		})
	}
	_, c, _ := newStreamFake(t)
	if _, err := c.Batch(context.Background(), nil); err == nil {
		t.Error("an empty batch was sent")
	}
}
