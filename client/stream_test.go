package client

import (
	"context"
	"encoding/json"
	"errors"
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

// streamFake answers each request with the next of its handlers and
// records what it was asked.
type streamFake struct {
	mu       sync.Mutex
	handlers []http.HandlerFunc
	seen     []streamRequest
}

type streamRequest struct {
	Method, Path, Accept, LastEventID, IdempotencyKey, Body string
}

func newStreamFake(t *testing.T, handlers ...http.HandlerFunc) (*streamFake, *Client, *[]time.Duration) {
	t.Helper()
	f := &streamFake{handlers: handlers}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, slept := newTestClient(t, srv.URL+"/api")
	return f, c, slept
}

func (f *streamFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, streamRequest{r.Method, strings.TrimPrefix(r.URL.Path, "/api"), r.Header.Get("Accept"),
		r.Header.Get("Last-Event-ID"), r.Header.Get("Idempotency-Key"), string(body)})
	if len(f.handlers) == 0 {
		f.mu.Unlock()
		http.Error(w, "no more scripted replies", http.StatusTeapot)
		return
	}
	h := f.handlers[0]
	f.handlers = f.handlers[1:]
	f.mu.Unlock()
	h(w, r)
}

func (f *streamFake) requests() []streamRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]streamRequest(nil), f.seen...)
}

// sse answers with these raw event stream lines, flushing each.
func sse(lines ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Request-ID", "req_stream")
		w.WriteHeader(http.StatusOK)
		for _, l := range lines {
			io.WriteString(w, l)
			w.(http.Flusher).Flush()
		}
	}
}

func jsonReply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

const (
	evStarted  = "id: 0-0\nevent: started\ndata: {\"id\":\"exe_1\",\"language\":\"python\"}\n\n"
	evHello    = "id: 6-0\nevent: stdout\ndata: {\"text\":\"hello\\n\"}\n\n"
	evOops     = "id: 6-5\nevent: stderr\ndata: {\"text\":\"oops\\n\"}\n\n"
	evMore     = "id: 11-5\nevent: stdout\ndata: {\"text\":\"more\\n\"}\n\n"
	resultBody = `{"id":"exe_1","status":"succeeded","stdout":"hello\nmore\n","stderr":"oops\n","exit_code":0,"duration_ms":5,"truncated":false,"usage":{"sandbox_seconds":0.005},"request_id":"req_stream","files":[{"path":"out/a.bin","size":3,"encoding":"base64","content":"AAH/"}],"files_truncated":false}`
	evResult   = "id: end\nevent: result\ndata: " + resultBody + "\n\n"
)

var wantResult = &Execution{
	ID: "exe_1", Status: StatusSucceeded, Stdout: "hello\nmore\n", Stderr: "oops\n", DurationMS: 5,
	Usage: ExecutionUsage{SandboxSeconds: 0.005}, RequestID: "req_stream",
	Files: []ReturnedFile{{Path: "out/a.bin", Size: 3, Content: []byte{0, 1, 0xff}}},
}

var wantEvents = []Event{
	{Type: EventStarted, ID: "0-0", ExecutionID: "exe_1", Language: "python"},
	{Type: EventStdout, ID: "6-0", ExecutionID: "exe_1", Text: "hello\n"},
	{Type: EventStderr, ID: "6-5", ExecutionID: "exe_1", Text: "oops\n"},
	{Type: EventStdout, ID: "11-5", ExecutionID: "exe_1", Text: "more\n"},
	{Type: EventResult, ID: "end", ExecutionID: "exe_1", Execution: wantResult},
}

// collected is one yielded pair, the error kept as its text.
type collected struct {
	Event Event
	Err   string
}

func collect(seq func(func(Event, error) bool)) []collected {
	var out []collected
	for ev, err := range seq {
		c := collected{Event: ev}
		if err != nil {
			c.Err = err.Error()
		}
		out = append(out, c)
	}
	return out
}

func events(evs ...Event) []collected {
	out := make([]collected, len(evs))
	for i, ev := range evs {
		out[i] = collected{Event: ev}
	}
	return out
}

var ignoreRaw = cmpopts.IgnoreFields(Execution{}, "Raw")

func TestStream(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handlers []http.HandlerFunc
		want     []collected
		wantReqs []string // "METHOD path Last-Event-ID"
		wantErr  string   // a substring of the last yielded error
	}{
		{
			name:     "events in order, heartbeats and unknown events skipped",
			handlers: []http.HandlerFunc{sse(evStarted, ": heartbeat\n\n", evHello, "event: progress\ndata: {}\n\n", evOops, evMore, evResult)},
			want:     events(wantEvents...),
			wantReqs: []string{"POST /v1/executions "},
		},
		{
			name: "refused before the start, retried like Run",
			handlers: []http.HandlerFunc{
				jsonReply(503, `{"error":{"code":"overloaded","message":"busy"},"request_id":"req_a"}`),
				sse(evStarted, evHello, evOops, evMore, evResult),
			},
			want:     events(wantEvents...),
			wantReqs: []string{"POST /v1/executions ", "POST /v1/executions "},
		},
		{
			name:     "a refusal is an *Error",
			handlers: []http.HandlerFunc{jsonReply(400, `{"error":{"code":"invalid_request","message":"files[0].path: must be relative"},"request_id":"req_b"}`)},
			want:     []collected{{Err: "vertal: invalid_request: files[0].path: must be relative (HTTP 400, request req_b)"}},
			wantReqs: []string{"POST /v1/executions "},
		},
		{
			name:     "an error event ends the stream with an *Error",
			handlers: []http.HandlerFunc{sse(evStarted, evHello, "id: end\nevent: error\ndata: {\"error\":{\"code\":\"internal\",\"message\":\"the sandbox failed\"}}\n\n")},
			want: append(events(wantEvents[:2]...), collected{
				Event: Event{Type: EventError, ID: "end", ExecutionID: "exe_1", Error: &Error{Code: "internal", Message: "the sandbox failed", RequestID: "req_stream"}},
				Err:   "vertal: internal: the sandbox failed (request req_stream)",
			}),
			wantReqs: []string{"POST /v1/executions "},
		},
		{
			name: "a dropped connection reattaches after the last event",
			handlers: []http.HandlerFunc{
				sse(evStarted, evHello),
				sse(evOops, evMore, evResult),
			},
			want:     events(wantEvents...),
			wantReqs: []string{"POST /v1/executions ", "GET /v1/executions/exe_1/events 6-0"},
		},
		{
			name: "dropped before started: the same POST again",
			handlers: []http.HandlerFunc{
				sse(": heartbeat\n\n"),
				sse(evStarted, evHello, evOops, evMore, evResult),
			},
			want:     events(wantEvents...),
			wantReqs: []string{"POST /v1/executions ", "POST /v1/executions "},
		},
		{
			name: "gives up after the retries",
			handlers: []http.HandlerFunc{
				sse(evStarted), sse(), sse(), sse(),
			},
			want:     []collected{{Event: wantEvents[0]}, {Err: "vertal: reading event stream: unexpected EOF"}},
			wantReqs: []string{"POST /v1/executions ", "GET /v1/executions/exe_1/events 0-0", "GET /v1/executions/exe_1/events 0-0", "GET /v1/executions/exe_1/events 0-0"},
		},
		{
			name:     "a server that does not stream answers JSON",
			handlers: []http.HandlerFunc{jsonReply(200, resultBody)},
			want: events(
				Event{Type: EventStarted, ID: "0-0", ExecutionID: "exe_1"},
				Event{Type: EventStdout, ID: "11-0", ExecutionID: "exe_1", Text: "hello\nmore\n"},
				Event{Type: EventStderr, ID: "11-5", ExecutionID: "exe_1", Text: "oops\n"},
				Event{Type: EventResult, ID: "end", ExecutionID: "exe_1", Execution: wantResult},
			),
			wantReqs: []string{"POST /v1/executions "},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, _ := newStreamFake(t, tc.handlers...)
			got := collect(c.Stream(context.Background(), "print('hello')", WithIdempotencyKey("k-1")))
			if diff := cmp.Diff(tc.want, got, ignoreRaw); diff != "" {
				t.Errorf("yielded (-want +got):\n%s", diff)
			}
			var reqs []string
			for _, r := range f.requests() {
				reqs = append(reqs, r.Method+" "+r.Path+" "+r.LastEventID)
				if r.Accept != "text/event-stream" {
					t.Errorf("%s %s: Accept %q", r.Method, r.Path, r.Accept)
				}
				if r.Method == "POST" && (r.IdempotencyKey != "k-1" || r.Body != `{"language":"python","code":"print('hello')"}`) {
					t.Errorf("POST sent key %q body %s", r.IdempotencyKey, r.Body)
				}
			}
			if diff := cmp.Diff(tc.wantReqs, reqs); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStreamResultRaw(t *testing.T) {
	_, c, _ := newStreamFake(t, sse(evStarted, evResult))
	for ev, err := range c.Stream(context.Background(), "x") {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == EventResult && string(ev.Execution.Raw) != resultBody {
			t.Errorf("Raw = %s, want the event's data", ev.Execution.Raw)
		}
	}
}

// Breaking out of the loop closes the connection at once, while the
// server still holds it open.
func TestStreamBreakClosesBody(t *testing.T) {
	closed := make(chan struct{})
	_, c, _ := newStreamFake(t, func(w http.ResponseWriter, r *http.Request) {
		sse(evStarted, evHello)(w, r)
		<-r.Context().Done()
		close(closed)
	})
	n := 0
	for ev, err := range c.Stream(context.Background(), "x") {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if ev.Type == EventStdout {
			break
		}
	}
	if n != 2 {
		t.Errorf("%d events before the break, want 2", n)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the server still holds the connection after the loop ended")
	}
}

func TestStreamContextCancel(t *testing.T) {
	_, c, _ := newStreamFake(t, func(w http.ResponseWriter, r *http.Request) {
		sse(evStarted)(w, r)
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var last error
	for ev, err := range c.Stream(ctx, "x") {
		if ev.Type == EventStarted {
			cancel()
		}
		last = err
	}
	if !errors.Is(last, context.Canceled) {
		t.Errorf("last error %v, want context.Canceled", last)
	}
}

func TestAttach(t *testing.T) {
	for _, tc := range []struct {
		name        string
		id, lastID  string
		handler     http.HandlerFunc
		want        []collected
		wantRequest string
	}{
		{
			name: "from the start", id: "exe_1", handler: sse(evStarted, evHello, evOops, evMore, evResult),
			want: events(wantEvents...), wantRequest: "GET /v1/executions/exe_1/events ",
		},
		{
			name: "after an event", id: "exe_1", lastID: "6-5", handler: sse(evMore, evResult),
			want: events(wantEvents[3:]...), wantRequest: "GET /v1/executions/exe_1/events 6-5",
		},
		{
			name: "after the end there is nothing", id: "exe_1", lastID: "end", handler: sse(),
			wantRequest: "GET /v1/executions/exe_1/events end",
		},
		{
			name: "not found", id: "exe_0", handler: jsonReply(404, `{"error":{"code":"not_found","message":"no such execution"},"request_id":"req_n"}`),
			want:        []collected{{Err: "vertal: not_found: no such execution (HTTP 404, request req_n)"}},
			wantRequest: "GET /v1/executions/exe_0/events ",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, _ := newStreamFake(t, tc.handler)
			got := collect(c.Attach(context.Background(), tc.id, tc.lastID))
			if diff := cmp.Diff(tc.want, got, ignoreRaw); diff != "" {
				t.Errorf("yielded (-want +got):\n%s", diff)
			}
			reqs := f.requests()
			if len(reqs) != 1 || reqs[0].Method+" "+reqs[0].Path+" "+reqs[0].LastEventID != tc.wantRequest || reqs[0].Accept != "text/event-stream" {
				t.Errorf("requests %+v, want one %q", reqs, tc.wantRequest)
			}
		})
	}
	c, _ := newTestClient(t, "http://127.0.0.1:1")
	if got := collect(c.Attach(context.Background(), "", "")); len(got) != 1 || got[0].Err == "" {
		t.Errorf("Attach with no id yielded %+v, want one error", got)
	}
}

func TestAttachNotFoundIsSentinel(t *testing.T) {
	_, c, _ := newStreamFake(t, jsonReply(404, `{"error":{"code":"not_found","message":"no such execution"},"request_id":"req_n"}`))
	for _, err := range c.Attach(context.Background(), "exe_0", "") {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("err = %v, want ErrNotFound", err)
		}
	}
}

func TestRunFilesEnvArgsReturn(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.push("POST /v1/executions", reply{status: 200, body: resultBody})
	c, _ := newTestClient(t, srv.URL)
	ex, err := c.Run(context.Background(), "import sys; print(sys.argv)",
		WithFiles(File{Path: "data.csv", Content: []byte("a,b\n1,2\n")}, File{Path: "in/logo.png", Content: []byte("\x89PNG\r\n\x1a\n")}),
		WithFiles(File{Path: "nul.txt", Content: []byte("a\x00b")}, File{Path: "empty", Content: nil}),
		WithEnv(map[string]string{"MODE": "fast", "LEVEL": "1"}), WithEnv(map[string]string{"LEVEL": "2"}),
		WithArgs("--n", "3"), WithArgs("x y"),
		WithReturnFiles("*.png"), WithReturnFiles("out/**"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantResult, ex, ignoreRaw); diff != "" {
		t.Errorf("execution (-want +got):\n%s", diff)
	}
	var body any
	if err := json.Unmarshal([]byte(f.requests()[0].Body), &body); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "testdata/run_request_files.json", body)
}

func TestReturnedFileDecoding(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    ReturnedFile
		wantErr bool
	}{
		{in: `{"path":"a.png","size":3,"encoding":"base64","content":"AAH/"}`, want: ReturnedFile{Path: "a.png", Size: 3, Content: []byte{0, 1, 0xff}}},
		{in: `{"path":"e","size":0,"encoding":"base64","content":""}`, want: ReturnedFile{Path: "e", Content: []byte{}}},
		{in: `{"path":"t.txt","size":2,"encoding":"utf8","content":"hi"}`, want: ReturnedFile{Path: "t.txt", Size: 2, Content: []byte("hi")}},
		{in: `{"path":"x","encoding":"base64","content":"not base64!"}`, wantErr: true},
		{in: `{"path":"x","encoding":"gzip","content":""}`, wantErr: true},
	} {
		var got ReturnedFile
		err := json.Unmarshal([]byte(tc.in), &got)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if diff := cmp.Diff(tc.want, got); err == nil && diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.in, diff)
		}
	}
}
