package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

type sseEvent struct {
	ID, Event, Data string
}

// parseSSE reads a whole event stream; heartbeats are counted apart.
func parseSSE(t *testing.T, body string) (events []sseEvent, heartbeats int) {
	t.Helper()
	for _, block := range strings.Split(body, "\n\n") {
		if block == "" {
			continue
		}
		if block == ": heartbeat" {
			heartbeats++
			continue
		}
		var ev sseEvent
		for _, line := range strings.Split(block, "\n") {
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "id":
				ev.ID = v
			case "event":
				ev.Event = v
			case "data":
				ev.Data = v
			default:
				t.Errorf("unexpected line %q", line)
			}
		}
		events = append(events, ev)
	}
	return events, heartbeats
}

// eventKinds is "id event" of each event.
func eventKinds(evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.ID+" "+e.Event)
	}
	return out
}

func texts(t *testing.T, evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		if e.Event == "stdout" || e.Event == "stderr" {
			var d struct{ Text string }
			if err := json.Unmarshal([]byte(e.Data), &d); err != nil {
				t.Fatal(err)
			}
			out = append(out, e.Event+":"+d.Text)
		}
	}
	return out
}

var streamHeader = map[string]string{"Accept": "text/event-stream"}

// withoutRequestID drops request_id, which differs between two requests.
func withoutRequestID(t *testing.T, data []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
	delete(m, "request_id")
	return m
}

// TestStreamRun: started, the output chunks in order with offset ids (a
// character split across two driver writes arrives whole), then a result
// equal to what GET then shows.
func TestStreamRun(t *testing.T) {
	env := newEnv(t)
	res := env.run("python", "stream", streamHeader)
	if res.status != http.StatusOK || res.header.Get("Content-Type") != "text/event-stream" || res.header.Get("Cache-Control") != "no-store" || res.header.Get("X-Request-ID") == "" {
		t.Fatalf("status %d, headers %v: %s", res.status, res.header, res.body)
	}
	evs, _ := parseSSE(t, string(res.body))
	// "é" is 2 bytes: the first write's lone 0xC3 is held back, so the
	// first chunk ends at byte 8 ("é tick\n"), not 1.
	want := []string{"0-0 started", "8-0 stdout", "8-5 stderr", "13-5 stdout", "end result"}
	if diff := cmp.Diff(want, eventKinds(evs)); diff != "" {
		t.Fatalf("events (-want +got):\n%s\n%s", diff, res.body)
	}
	if diff := cmp.Diff([]string{"stdout:é tick\n", "stderr:warn\n", "stdout:done\n"}, texts(t, evs)); diff != "" {
		t.Errorf("texts (-want +got):\n%s", diff)
	}
	var started struct{ ID, Language string }
	if err := json.Unmarshal([]byte(evs[0].Data), &started); err != nil || started.Language != "python" {
		t.Fatalf("started %s: %v", evs[0].Data, err)
	}
	result := []byte(evs[len(evs)-1].Data)
	if got := withoutRequestID(t, result); got["stdout"] != "é tick\ndone\n" || got["id"] != started.ID {
		t.Errorf("result %s", result)
	}
	get := env.do(request{path: "/v1/executions/" + started.ID})
	if diff := cmp.Diff(withoutRequestID(t, get.body), withoutRequestID(t, result)); diff != "" {
		t.Errorf("result event vs GET (-get +event):\n%s", diff)
	}
	var r struct {
		RequestID string `json:"request_id"`
	}
	_ = json.Unmarshal(result, &r)
	if r.RequestID != res.header.Get("X-Request-ID") {
		t.Errorf("result request_id %q, header %q", r.RequestID, res.header.Get("X-Request-ID"))
	}
}

// TestStreamRefusalsAreJSON: what is refused before the start is the
// usual JSON error.
func TestStreamRefusalsAreJSON(t *testing.T) {
	env := newEnv(t)
	for _, tc := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"language":"python","code":"x","files":[{"path":"../x","content":"a"}]}`, 400, "invalid_request"},
		{`{"language":"python","code":"x","env":{"PATH":"/"}}`, 400, "invalid_request"},
		{`{"language":"cobol","code":"x"}`, 400, "unsupported_language"},
	} {
		res := env.do(request{method: "POST", path: "/v1/executions", body: tc.body, header: streamHeader})
		if res.status != tc.status || res.header.Get("Content-Type") != "application/json" || !strings.Contains(string(res.body), tc.code) {
			t.Errorf("%s: %d %s %s", tc.body, res.status, res.header.Get("Content-Type"), res.body)
		}
	}
}

// TestStreamReplay: an idempotent replay streams the stored output and a
// result marked idempotent_replay, without running again.
func TestStreamReplay(t *testing.T) {
	env := newEnv(t)
	key := map[string]string{"Idempotency-Key": "replay-1"}
	first := env.run("python", "stream", key)
	key["Accept"] = "text/event-stream"
	res := env.run("python", "stream", key)
	evs, _ := parseSSE(t, string(res.body))
	if diff := cmp.Diff([]string{"0-0 started", "13-0 stdout", "13-5 stderr", "end result"}, eventKinds(evs)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	result := withoutRequestID(t, []byte(evs[len(evs)-1].Data))
	want := withoutRequestID(t, first.body)
	want["idempotent_replay"] = true
	if diff := cmp.Diff(want, result); diff != "" {
		t.Errorf("replayed result (-want +got):\n%s", diff)
	}
	if n := env.driver.runs.Load(); n != 1 {
		t.Errorf("driver ran %d times, want 1", n)
	}
}

// TestEventsResume: GET .../events replays a finished execution from the
// store, resumes after Last-Event-ID, ends at once after "end", and treats
// an unreadable id as the start.
func TestEventsResume(t *testing.T) {
	env := newEnv(t)
	id := decode(t, env.run("python", "stream", nil))["id"].(string)
	for _, tc := range []struct {
		last  string
		kinds []string
		texts []string
	}{
		{"", []string{"0-0 started", "13-0 stdout", "13-5 stderr", "end result"}, []string{"stdout:é tick\ndone\n", "stderr:warn\n"}},
		{"garbage", []string{"0-0 started", "13-0 stdout", "13-5 stderr", "end result"}, []string{"stdout:é tick\ndone\n", "stderr:warn\n"}},
		{"0-0", []string{"13-0 stdout", "13-5 stderr", "end result"}, []string{"stdout:é tick\ndone\n", "stderr:warn\n"}},
		// A live id: after the first chunk and stderr.
		{"8-5", []string{"13-0 stdout", "end result"}, []string{"stdout:done\n"}},
		{"13-5", []string{"end result"}, nil},
		{"end", nil, nil},
	} {
		res := env.do(request{path: "/v1/executions/" + id + "/events", header: map[string]string{"Last-Event-ID": tc.last}})
		if res.status != http.StatusOK {
			t.Fatalf("%q: %d %s", tc.last, res.status, res.body)
		}
		evs, _ := parseSSE(t, string(res.body))
		if diff := cmp.Diff(tc.kinds, eventKinds(evs)); diff != "" {
			t.Errorf("Last-Event-ID %q: events (-want +got):\n%s", tc.last, diff)
		}
		if diff := cmp.Diff(tc.texts, texts(t, evs)); diff != "" {
			t.Errorf("Last-Event-ID %q: texts (-want +got):\n%s", tc.last, diff)
		}
	}
	other, _ := env.newKey("other", "pro")
	if res := env.do(request{path: "/v1/executions/" + id + "/events", key: other}); res.status != http.StatusNotFound {
		t.Errorf("another tenant: %d", res.status)
	}
}

// openStream starts a streaming request and returns a reader of its
// events and a cancel that disconnects.
func openStream(t *testing.T, env *testEnv, method, path, body string, header map[string]string) (*bufio.Reader, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, env.http.URL+path, nil)
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, env.http.URL+path, rd)
		req.Header.Set("Content-Type", "application/json")
	}
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+env.key)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := env.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	t.Cleanup(func() { cancel(); res.Body.Close() })
	return bufio.NewReader(res.Body), cancel
}

// nextEvent reads one event (skipping heartbeats).
func nextEvent(t *testing.T, r *bufio.Reader) sseEvent {
	t.Helper()
	var block []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended: %v (so far %q)", err, block)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if len(block) > 0 {
				evs, _ := parseSSE(t, strings.Join(block, "\n"))
				if len(evs) == 1 {
					return evs[0]
				}
			}
			block = nil
			continue
		}
		block = append(block, line)
	}
}

// TestStreamDisconnect: a client that leaves mid-stream does not stop
// the run; its result is stored, GET shows it, and a later attach replays
// it. While it runs, an attach follows it live from a Last-Event-ID.
func TestStreamDisconnect(t *testing.T) {
	env := newEnv(t, withOptions(func(o *Options) { o.Heartbeat = 10 * time.Millisecond }))
	r, disconnect := openStream(t, env, "POST", "/v1/executions", `{"language":"python","code":"slow"}`, nil)
	started := nextEvent(t, r)
	var s struct{ ID string }
	_ = json.Unmarshal([]byte(started.Data), &s)
	if tick := nextEvent(t, r); tick.ID != "5-0" || tick.Event != "stdout" {
		t.Fatalf("second event %+v", tick)
	}
	disconnect()

	// A second client attaches live, resuming after started: it gets the
	// tick from the log, then the tock as it comes, then the result.
	live, _ := openStream(t, env, "GET", "/v1/executions/"+s.ID+"/events", "", map[string]string{"Last-Event-ID": "0-0"})
	if ev := nextEvent(t, live); ev.ID != "5-0" || !strings.Contains(ev.Data, "tick") {
		t.Fatalf("live resume: %+v", ev)
	}
	if got := decode(t, env.do(request{path: "/v1/executions/" + s.ID}))["status"]; got != "running" {
		t.Errorf("status while running = %v", got)
	}
	env.driver.release()
	if ev := nextEvent(t, live); ev.ID != "10-0" || !strings.Contains(ev.Data, "tock") {
		t.Fatalf("live: %+v", ev)
	}
	if ev := nextEvent(t, live); ev.ID != "end" || ev.Event != "result" || !strings.Contains(ev.Data, `"tick\ntock\n"`) {
		t.Fatalf("live result: %+v", ev)
	}

	var got map[string]any
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		got = decode(t, env.do(request{path: "/v1/executions/" + s.ID}))
		if got["status"] == "succeeded" {
			break
		}
	}
	if got["status"] != "succeeded" || got["stdout"] != "tick\ntock\n" {
		t.Fatalf("after the disconnect, GET = %v", got)
	}
	res := env.do(request{path: "/v1/executions/" + s.ID + "/events", header: map[string]string{"Last-Event-ID": "5-0"}})
	evs, _ := parseSSE(t, string(res.body))
	if diff := cmp.Diff([]string{"stdout:tock\n"}, texts(t, evs)); diff != "" {
		t.Errorf("stored resume (-want +got):\n%s", diff)
	}
}

// TestEventsQueued: an attach to a queued execution waits (with
// heartbeats) and follows it once it starts.
func TestEventsQueued(t *testing.T) {
	plans := map[string]config.Plan{}
	for n, p := range config.DefaultPlans() {
		p.MaxConcurrent = 1
		plans[n] = p
	}
	env := newEnv(t, withPlans(plans), withOptions(func(o *Options) { o.Heartbeat = 5 * time.Millisecond }))
	env.driver.started = make(chan string, 2)
	first := env.goRun("python", "block", nil)
	<-env.driver.started
	second := env.goRun("python", "print(6 * 7)", nil)
	var id string
	for deadline := time.Now().Add(5 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		id = env.queuedID(t)
	}
	if id == "" {
		t.Fatal("the second execution never showed as queued")
	}
	r, _ := openStream(t, env, "GET", "/v1/executions/"+id+"/events", "", nil)
	// Heartbeats while queued.
	line, err := r.ReadString('\n')
	if err != nil || line != ": heartbeat\n" {
		t.Fatalf("while queued: %q, %v", line, err)
	}
	env.driver.release()
	<-first
	if ev := nextEvent(t, r); ev.Event != "started" || ev.ID != "0-0" {
		t.Fatalf("first event %+v", ev)
	}
	// The fake writes nothing through Output here; the stored stdout is
	// sent before the result, as a replay would.
	if ev := nextEvent(t, r); ev.Event != "stdout" || ev.ID != "3-0" {
		t.Fatalf("second event %+v", ev)
	}
	if ev := nextEvent(t, r); ev.Event != "result" || !strings.Contains(ev.Data, `"42\n"`) {
		t.Fatalf("third event %+v", ev)
	}
	<-second
}

// TestFilesEnvArgs: the new fields reach the Spec decoded, and returned
// files come back in base64 with files_truncated, in POST, GET and the
// stream alike.
func TestFilesEnvArgs(t *testing.T) {
	env := newEnv(t)
	body := `{"language":"python","code":"x","files":[{"path":"data/in.csv","content":"a,b\n"},` +
		`{"path":"img.bin","content":"AAH/","encoding":"base64"}],"env":{"MODE":"fast"},"args":["--n","3"],"return_files":["*.bin"]}`
	res := env.do(request{method: "POST", path: "/v1/executions", body: body})
	if res.status != http.StatusOK {
		t.Fatalf("%d %s", res.status, res.body)
	}
	spec := env.driver.lastSpec()
	if len(spec.Files) != 2 || string(spec.Files[1].Content) != "\x00\x01\xff" || spec.Env["MODE"] != "fast" ||
		!cmp.Equal(spec.Args, []string{"--n", "3"}) || !cmp.Equal(spec.ReturnFiles, []string{"*.bin"}) {
		t.Errorf("spec %+v", spec)
	}
	var got struct {
		ID    string `json:"id"`
		Files []struct {
			Path, Encoding, Content string
			Size                    int
		} `json:"files"`
		FilesTruncated bool `json:"files_truncated"`
	}
	if err := json.Unmarshal(res.body, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Files) != 2 || got.Files[1].Content != "AAH/" || got.Files[1].Size != 3 || got.Files[1].Encoding != "base64" || !got.FilesTruncated {
		t.Errorf("response %s", res.body)
	}
	get := env.do(request{path: "/v1/executions/" + got.ID})
	if diff := cmp.Diff(withoutRequestID(t, res.body), withoutRequestID(t, get.body)); diff != "" {
		t.Errorf("GET (-post +get):\n%s", diff)
	}
	too := `{"language":"python","code":"x","files":[` + strings.Repeat(`{"path":"a","content":""},`, 60) + `{"path":"b"}]}`
	if res := env.do(request{method: "POST", path: "/v1/executions", body: too}); res.status != http.StatusRequestEntityTooLarge {
		t.Errorf("61 files on pro: %d %s", res.status, res.body)
	}
	if res := env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","files":[{"path":"a","mode":1}]}`}); res.status != http.StatusBadRequest {
		t.Errorf("unknown file field: %d %s", res.status, res.body)
	}
	if res := env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","env":{"A":1}}`}); res.status != http.StatusBadRequest {
		t.Errorf("env number: %d %s", res.status, res.body)
	}
}
