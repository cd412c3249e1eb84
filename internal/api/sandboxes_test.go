package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/api/sandboxfake"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// newSandboxEnv is a server whose sandboxes are a sandboxfake.
func newSandboxEnv(t *testing.T, opts ...envOption) (*testEnv, *sandboxfake.Fake) {
	t.Helper()
	fake := sandboxfake.New()
	env := newEnv(t, append([]envOption{withOptions(func(o *Options) { o.Sandboxes = fake })}, opts...)...)
	return env, fake
}

// createSandbox creates one and returns its id.
func (e *testEnv) createSandbox(t *testing.T, body string) string {
	t.Helper()
	r := e.do(request{method: "POST", path: "/v1/sandboxes", body: body})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	return decode(t, r)["id"].(string)
}

func TestSandboxLifecycle(t *testing.T) {
	env, fake := newSandboxEnv(t)
	r := env.do(request{method: "POST", path: "/api/v1/sandboxes", header: map[string]string{"Idempotency-Key": "sbx-1"},
		body: `{"timeout_s":600,"env":{"A":"1"},"metadata":{"team":"ml"},"on_timeout":"pause",` +
			`"files":[{"path":"a.txt","content":"hi"},{"path":"b.bin","content":"AAEC","encoding":"base64"}]}`})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	sb := decode(t, r)
	id := sb["id"].(string)
	if got := r.header.Get("Location"); got != "/api/v1/sandboxes/"+id {
		t.Errorf("Location = %q", got)
	}
	want := sandboxes.CreateRequest{TimeoutS: 600, Env: map[string]string{"A": "1"}, Metadata: map[string]string{"team": "ml"}, OnTimeout: "pause",
		Files: []sandboxes.File{{Path: "a.txt", Content: []byte("hi")}, {Path: "b.bin", Content: []byte{0, 1, 2}}}}
	if diff := cmp.Diff(want, fake.LastCreate); diff != "" {
		t.Errorf("service got (-want +got):\n%s", diff)
	}
	if fake.LastIdemKey != "sbx-1" {
		t.Errorf("idempotency key %q", fake.LastIdemKey)
	}
	if sb["status"] != "running" || sb["on_timeout"] != "pause" || sb["reason"] != nil || sb["expires_at"] != "2026-03-14T15:19:27Z" {
		t.Errorf("created %v", sb)
	}
	// The same key answers the same sandbox.
	again := env.do(request{method: "POST", path: "/v1/sandboxes", header: map[string]string{"Idempotency-Key": "sbx-1"},
		body: `{"timeout_s":600,"env":{"A":"1"},"metadata":{"team":"ml"},"on_timeout":"pause",` +
			`"files":[{"path":"a.txt","content":"hi"},{"path":"b.bin","content":"AAEC","encoding":"base64"}]}`})
	if decode(t, again)["id"] != id {
		t.Errorf("replay made another sandbox: %s", again.body)
	}
	other := env.createSandbox(t, `{"metadata":{"team":"web"}}`)
	if !strings.Contains(env.logs.String(), `"route":"/v1/sandboxes","status":201`) || !strings.Contains(env.logs.String(), `"sandbox_id":"`+other+`"`) {
		t.Errorf("the access log does not name the sandbox created:\n%s", env.logs.String())
	}

	got := decode(t, env.do(request{path: "/v1/sandboxes/" + id}))
	if got["id"] != id || got["metadata"].(map[string]any)["team"] != "ml" {
		t.Errorf("get %v", got)
	}
	// Lists: filters reach the service; pages follow the cursor.
	list := decode(t, env.do(request{path: "/v1/sandboxes?status=running&metadata%5Bteam%5D=ml"}))
	if n := len(list["sandboxes"].([]any)); n != 1 || list["next_cursor"] != nil {
		t.Errorf("filtered list %v", list)
	}
	if diff := cmp.Diff(sandboxes.ListRequest{Status: "running", Metadata: map[string]string{"team": "ml"}}, fake.LastList); diff != "" {
		t.Errorf("list request (-want +got):\n%s", diff)
	}
	if got := decode(t, env.do(request{path: "/v1/sandboxes?metadata.team=web"})); len(got["sandboxes"].([]any)) != 1 {
		t.Errorf("list by metadata.team %v", got)
	}
	page := decode(t, env.do(request{path: "/v1/sandboxes?limit=1"}))
	if page["sandboxes"].([]any)[0].(map[string]any)["id"] != other || page["next_cursor"] != "1" {
		t.Fatalf("first page %v", page)
	}
	page = decode(t, env.do(request{path: "/v1/sandboxes?limit=1&cursor=1"}))
	if page["sandboxes"].([]any)[0].(map[string]any)["id"] != id || page["next_cursor"] != nil {
		t.Errorf("second page %v", page)
	}

	if got := decode(t, env.do(request{method: "POST", path: "/v1/sandboxes/" + id + "/timeout", body: `{"timeout_s":1200}`})); got["expires_at"] != "2026-03-14T15:29:27Z" {
		t.Errorf("timeout %v", got)
	}
	if got := decode(t, env.do(request{method: "POST", path: "/v1/sandboxes/" + id + "/pause", body: ` {} `})); got["status"] != "paused" {
		t.Errorf("pause %v", got)
	}
	if got := decode(t, env.do(request{method: "POST", path: "/v1/sandboxes/" + id + "/resume"})); got["status"] != "running" {
		t.Errorf("resume %v", got)
	}
	killed := decode(t, env.do(request{method: "DELETE", path: "/v1/sandboxes/" + id}))
	if killed["status"] != "ended" || killed["reason"] != "killed" || killed["ended_at"] == nil {
		t.Errorf("kill %v", killed)
	}
	for _, p := range []string{"/pause", "/resume"} {
		if r := env.do(request{method: "POST", path: "/v1/sandboxes/" + id + p}); r.status != http.StatusConflict || errCode(t, r) != "sandbox_not_running" {
			t.Errorf("%s of an ended sandbox: %d %s", p, r.status, r.body)
		}
	}
}

// sandboxRequests are one call of every sandbox route on sandbox id.
func sandboxRequests(id string) []request {
	b := "/v1/sandboxes/" + id
	return []request{
		{path: b}, {method: "DELETE", path: b},
		{method: "POST", path: b + "/timeout", body: `{"timeout_s":60}`},
		{method: "POST", path: b + "/pause"}, {method: "POST", path: b + "/resume"},
		{method: "POST", path: b + "/commands", body: `{"cmd":"echo hi"}`}, {path: b + "/commands"},
		{method: "POST", path: b + "/commands/101/stdin", body: `{"data":"x"}`},
		{method: "POST", path: b + "/commands/101/signal", body: `{"signal":"TERM"}`},
		{path: b + "/commands/101/events"},
		{path: b + "/files?path=a.txt"}, {method: "PUT", path: b + "/files?path=a.txt", body: "x", ctype: ptr("application/octet-stream")},
		{method: "DELETE", path: b + "/files?path=a.txt"},
		{method: "POST", path: b + "/files/mkdir", body: `{"path":"d"}`},
		{method: "POST", path: b + "/files/move", body: `{"from":"a.txt","to":"b.txt"}`},
		{method: "POST", path: b + "/contexts", body: `{}`}, {path: b + "/contexts"},
		{method: "DELETE", path: b + "/contexts/ctx_00000000000000000000000000000101"}, {method: "POST", path: b + "/contexts/ctx_00000000000000000000000000000101/restart"},
		{method: "POST", path: b + "/run", body: `{"code":"1"}`},
	}
}

// TestSandboxTenants: another tenant's sandbox is not found on every
// route, nor is a malformed id; a server without sandboxes says so.
func TestSandboxTenants(t *testing.T) {
	env, _ := newSandboxEnv(t)
	id := env.createSandbox(t, `{"files":[{"path":"a.txt","content":"mine"}]}`)
	intruder, _ := env.newKey("intruder", "pro")
	for _, r := range sandboxRequests(id) {
		r.key = intruder
		if got := env.do(r); got.status != http.StatusNotFound || errCode(t, got) != "not_found" {
			t.Errorf("%s %s by another tenant: %d %s", r.method, r.path, got.status, got.body)
		}
	}
	for _, bad := range []string{"sbx_XYZ", "exe_00000000000000000000000000000000", "sbx_" + strings.Repeat("0", 65)} {
		if got := env.do(request{path: "/v1/sandboxes/" + bad}); got.status != http.StatusNotFound {
			t.Errorf("%s: %d", bad, got.status)
		}
	}
	if got := env.do(request{path: "/v1/sandboxes/" + id + "/commands/0x1/events"}); got.status != http.StatusNotFound {
		t.Errorf("malformed pid: %d", got.status)
	}
	off := newEnv(t)
	for _, r := range append(sandboxRequests(id), request{path: "/v1/sandboxes"}, request{method: "POST", path: "/v1/sandboxes", body: `{}`}) {
		got := off.do(r)
		if got.status != http.StatusNotFound || errCode(t, got) != "not_found" || !strings.Contains(string(got.body), "not enabled") {
			t.Errorf("%s %s without sandboxes: %d %s", r.method, r.path, got.status, got.body)
		}
	}
	var none *sandboxes.Service
	typedNil := newEnv(t, withOptions(func(o *Options) { o.Sandboxes = none }))
	if got := typedNil.do(request{path: "/v1/sandboxes"}); got.status != http.StatusNotFound || !strings.Contains(string(got.body), "not enabled") {
		t.Errorf("a nil *sandboxes.Service: %d %s", got.status, got.body)
	}
	if got := off.do(request{path: "/v1/sandboxes", key: "-"}); got.status != http.StatusUnauthorized {
		t.Errorf("no key: %d", got.status)
	}
}

func TestSandboxBadRequests(t *testing.T) {
	env, _ := newSandboxEnv(t)
	id := env.createSandbox(t, `{}`)
	b := "/v1/sandboxes/" + id
	for _, tc := range []struct {
		r    request
		code string
		msg  string
	}{
		{request{method: "POST", path: "/v1/sandboxes", body: `{"image":"default","timeout":5}`}, "invalid_request", `unknown field "timeout"; allowed: image, timeout_s, env, metadata, files, on_timeout`},
		{request{method: "POST", path: "/v1/sandboxes", body: `{"timeout_s":1.5}`}, "invalid_timeout", "whole number"},
		{request{method: "POST", path: "/v1/sandboxes", body: `{"on_timeout":"sleep"}`}, "invalid_request", "on_timeout"},
		{request{method: "POST", path: "/v1/sandboxes", body: `{"files":[{"path":"a","content":"!!","encoding":"base64"}]}`}, "invalid_request", "files[0]"},
		{request{method: "POST", path: "/v1/sandboxes", body: `{"image":"gpu"}`}, "invalid_request", "unknown image"},
		{request{method: "POST", path: "/v1/sandboxes", body: `{}`, header: map[string]string{"Idempotency-Key": "bad key"}}, "invalid_idempotency_key", ""},
		{request{method: "POST", path: "/v1/sandboxes", body: `{}`, ctype: ptr("text/plain")}, "invalid_content_type", ""},
		{request{path: "/v1/sandboxes?status=gone"}, "invalid_request", "status"},
		{request{path: "/v1/sandboxes?limit=500"}, "invalid_request", "limit"},
		{request{path: "/v1/sandboxes?owner=me"}, "invalid_request", `unknown query parameter "owner"`},
		{request{path: "/v1/sandboxes?cursor=zz"}, "invalid_request", "cursor"},
		{request{path: "/v1/sandboxes?metadata.role=x%zz"}, "invalid_request", "query string is malformed"},
		{request{path: "/v1/sandboxes?status=ended;x"}, "invalid_request", "query string is malformed"},
		{request{path: b + "/files?path=a%zz&path=b"}, "invalid_request", "query string is malformed"},
		{request{method: "POST", path: b + "/pause", body: `{"force":true}`}, "invalid_request", `unknown field "force"; this route takes no body`},
		{request{method: "POST", path: b + "/resume", body: `[1]`}, "invalid_request", "takes no body"},
		{request{method: "POST", path: b + "/resume", body: `null`}, "invalid_request", "takes no body"},
		{request{method: "POST", path: b + "/pause", body: "{\"a\xff\":1}"}, "invalid_json", "UTF-8"},
		{request{method: "POST", path: b + "/timeout", body: `{}`}, "invalid_timeout", "required"},
		{request{method: "POST", path: b + "/timeout", body: `{"timeout_s":999999}`}, "invalid_timeout", "lifetime"},
		{request{method: "POST", path: b + "/commands", body: `{"cmd":"ls","argv":["ls"]}`}, "invalid_request", "exactly one"},
		{request{method: "POST", path: b + "/commands", body: `{}`}, "invalid_request", "exactly one"},
		{request{method: "POST", path: b + "/commands", body: `{"cmd":"ls","cmd":"rm"}`}, "invalid_request", "more than once"},
		{request{method: "POST", path: b + "/commands", body: `{"cmd":"ls","timeout_s":0}`}, "invalid_timeout", ""},
		{request{method: "POST", path: b + "/files/mkdir", body: `{}`}, "invalid_request", "path is required"},
		{request{method: "POST", path: b + "/files/move", body: `{"from":"a"}`}, "invalid_request", "from and to"},
		{request{path: b + "/files"}, "invalid_request", "?path="},
		{request{method: "PUT", path: b + "/files?path=/etc/passwd", body: "x", ctype: ptr("application/octet-stream")}, "invalid_request", "permission denied"},
	} {
		got := env.do(tc.r)
		msg := decode(t, got)["error"].(map[string]any)["message"].(string)
		if code := errCode(t, got); code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s %s %s: %d %s, want %s naming %q", tc.r.method, tc.r.path, tc.r.body, got.status, got.body, tc.code, tc.msg)
		}
	}
}

func TestSandboxLimit(t *testing.T) {
	env, _ := newSandboxEnv(t)
	for range sandboxfake.MaxRunning {
		env.createSandbox(t, `{}`)
	}
	if got := env.do(request{method: "POST", path: "/v1/sandboxes", body: `{}`}); got.status != http.StatusTooManyRequests || errCode(t, got) != "sandbox_limit" {
		t.Errorf("over the limit: %d %s", got.status, got.body)
	}
}

// events parses a server-sent event stream into id, event and data.
func events(t *testing.T, r response) [][3]string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q: %s", ct, r.body)
	}
	var out [][3]string
	for _, block := range strings.Split(strings.TrimSpace(string(r.body)), "\n\n") {
		var ev [3]string
		for _, line := range strings.Split(block, "\n") {
			k, v, _ := strings.Cut(line, ": ")
			switch k {
			case "id":
				ev[0] = v
			case "event":
				ev[1] = v
			case "data":
				ev[2] = v
			}
		}
		out = append(out, ev)
	}
	return out
}

func TestSandboxCommands(t *testing.T) {
	env, fake := newSandboxEnv(t)
	id := env.createSandbox(t, `{}`)
	b := "/v1/sandboxes/" + id
	res := decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"echo hello","cwd":"/tmp","env":{"X":"1"},"timeout_s":5}`}))
	if res["stdout"] != "hello\n" || res["status"] != "succeeded" || res["exit_code"].(float64) != 0 {
		t.Errorf("foreground %v", res)
	}
	if diff := cmp.Diff(sandboxes.CommandRequest{Cmd: "echo hello", Cwd: "/tmp", Env: map[string]string{"X": "1"}, TimeoutS: 5}, fake.LastCommand); diff != "" {
		t.Errorf("command (-want +got):\n%s", diff)
	}
	failed := decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"argv":["exit","3"]}`}))
	if failed["status"] != "failed" || failed["exit_code"].(float64) != 3 || failed["stderr"] != "boom\n" {
		t.Errorf("failed %v", failed)
	}
	if got := env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"crash"}`}); got.status != 500 || errCode(t, got) != "internal_error" || strings.Contains(string(got.body), "agent") {
		t.Errorf("crash: %d %s", got.status, got.body)
	}

	// Streamed: the output as it comes, then the result.
	st := events(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"echo hi there"}`, header: map[string]string{"Accept": "text/event-stream"}}))
	if len(st) != 3 || st[0] != [3]string{"1", "stdout", `{"text":"hi there"}`} || st[1] != [3]string{"2", "stdout", `{"text":"\n"}`} || st[2][0] != "end" || st[2][1] != "result" {
		t.Fatalf("stream %q", st)
	}
	var result map[string]any
	if err := json.Unmarshal([]byte(st[2][2]), &result); err != nil || result["stdout"] != "hi there\n" {
		t.Errorf("result event %s: %v", st[2][2], err)
	}
	// A refusal before anything ran is a JSON error, not a stream.
	if got := env.do(request{method: "POST", path: "/v1/sandboxes/sbx_00000000000000000000000000000999/commands", body: `{"cmd":"ls"}`, header: map[string]string{"Accept": "text/event-stream"}}); got.status != 404 || errCode(t, got) != "not_found" {
		t.Errorf("stream of an unknown sandbox: %d %s", got.status, got.body)
	}
	// A failure before the first output is still an error answer.
	if got := env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"crash"}`, header: map[string]string{"Accept": "text/event-stream"}}); got.status != 500 {
		t.Errorf("stream of a crash: %d %s", got.status, got.body)
	}

	// Background: 201 with the pid; stdin, events, signal.
	r := env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"cat","background":true}`})
	if r.status != http.StatusCreated {
		t.Fatalf("background: %d %s", r.status, r.body)
	}
	cmd := decode(t, r)
	pid := int(cmd["pid"].(float64))
	if cmd["running"] != true || cmd["cmd"] != "cat" || r.header.Get("Location") != fmt.Sprintf("%s/commands/%d/events", b, pid) {
		t.Errorf("started %v %v", cmd, r.header.Get("Location"))
	}
	p := fmt.Sprintf("%s/commands/%d", b, pid)
	if got := decode(t, env.do(request{method: "POST", path: p + "/stdin", body: `{"data":"one\n"}`})); got["ok"] != true {
		t.Errorf("stdin %v", got)
	}
	env.do(request{method: "POST", path: p + "/stdin", body: `{"data":"two\n","eof":true}`})
	all := events(t, env.do(request{path: p + "/events"}))
	want := [][3]string{{"1", "stdout", `{"text":"one\n"}`}, {"2", "stdout", `{"text":"two\n"}`}, {"3", "exit", `{"exit_code":0}`}}
	if diff := cmp.Diff(want, all); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	resumed := events(t, env.do(request{path: p + "/events", header: map[string]string{"Last-Event-ID": "1"}}))
	if diff := cmp.Diff(want[1:], resumed); diff != "" {
		t.Errorf("events after 1 (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ path, body, code string }{
		{p + "/stdin", `{"data":"late"}`, "process_finished"},
		{p + "/signal", `{"signal":"TERM"}`, "process_finished"},
		{p + "/stdin", `{}`, "invalid_request"},
		{p + "/signal", `{"signal":"BOOM"}`, "invalid_request"},
		{p + "/signal", `{}`, "invalid_request"},
		{b + "/commands/999/signal", `{"signal":"TERM"}`, "not_found"},
	} {
		if got := env.do(request{method: "POST", path: tc.path, body: tc.body}); errCode(t, got) != tc.code {
			t.Errorf("%s %s: %d %s, want %s", tc.path, tc.body, got.status, got.body, tc.code)
		}
	}
	// A signal by its full name ends a running command.
	sleeper := decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"argv":["sleep","100"],"background":true}`}))
	sp := fmt.Sprintf("%s/commands/%d", b, int(sleeper["pid"].(float64)))
	if got := env.do(request{method: "POST", path: sp + "/signal", body: `{"signal":"sigkill"}`}); got.status != 200 {
		t.Errorf("signal: %d %s", got.status, got.body)
	}
	list := decode(t, env.do(request{path: b + "/commands"}))["commands"].([]any)
	if len(list) != 2 || list[1].(map[string]any)["exit_code"].(float64) != 137 || list[1].(map[string]any)["argv"].([]any)[0] != "sleep" {
		t.Errorf("commands %v", list)
	}
}

// TestSandboxStreamFailures: a failure after the first output is an
// error event that ends the stream; a quiet command's stream starts with
// the heartbeat, and then a failure is an error event too.
func TestSandboxStreamFailures(t *testing.T) {
	env, _ := newSandboxEnv(t, withOptions(func(o *Options) { o.Heartbeat = 20 * time.Millisecond }))
	id := env.createSandbox(t, `{}`)
	b := "/v1/sandboxes/" + id
	st := events(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"partial"}`, header: map[string]string{"Accept": "text/event-stream"}}))
	if len(st) != 2 || st[0] != [3]string{"1", "stdout", `{"text":"half\n"}`} || st[1][0] != "end" || st[1][1] != "error" ||
		!strings.Contains(st[1][2], `"code":"internal_error"`) || strings.Contains(st[1][2], "agent") {
		t.Errorf("stream of a failure after output: %q", st)
	}
	// Attached to a command that says nothing: heartbeats, then its exit.
	pid := int(decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"cat","background":true}`}))["pid"].(float64))
	p := fmt.Sprintf("%s/commands/%d", b, pid)
	req, _ := http.NewRequest("GET", env.http.URL+p+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+env.key)
	res, err := env.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != ": heartbeat\n" || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("quiet stream starts %q %v", first, err)
	}
	env.do(request{method: "POST", path: p + "/stdin", body: `{"eof":true}`})
	rest, err := io.ReadAll(br)
	if err != nil || !strings.HasSuffix(string(rest), "id: 1\nevent: exit\ndata: {\"exit_code\":0}\n\n") {
		t.Errorf("quiet stream goes on %q %v", rest, err)
	}
}

// TestSandboxEventsLive: an attached stream gets events as they happen
// and ends with the exit.
func TestSandboxEventsLive(t *testing.T) {
	env, _ := newSandboxEnv(t)
	id := env.createSandbox(t, `{}`)
	b := "/v1/sandboxes/" + id
	pid := int(decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"cat","background":true}`}))["pid"].(float64))
	p := fmt.Sprintf("%s/commands/%d", b, pid)
	got := make(chan response, 1)
	go func() { got <- env.do(request{path: p + "/events"}) }()
	env.do(request{method: "POST", path: p + "/stdin", body: `{"data":"live"}`})
	env.do(request{method: "POST", path: p + "/stdin", body: `{"eof":true}`})
	all := events(t, <-got)
	if len(all) != 2 || all[0][2] != `{"text":"live"}` || all[1][1] != "exit" {
		t.Errorf("live events %q", all)
	}
}

func TestSandboxFiles(t *testing.T) {
	env, _ := newSandboxEnv(t)
	id := env.createSandbox(t, `{"files":[{"path":"data/in.csv","content":"a,b\n"}]}`)
	b := "/v1/sandboxes/" + id + "/files"
	octet := ptr("application/octet-stream")
	put := env.do(request{method: "PUT", path: b + "?path=out/r%C3%A9sult.bin", body: "\x00\x01binary", ctype: octet})
	if put.status != 200 {
		t.Fatalf("put: %d %s", put.status, put.body)
	}
	if fi := decode(t, put); fi["path"] != "/home/user/out/résult.bin" || fi["size"].(float64) != 8 || fi["type"] != "file" {
		t.Errorf("put %v", fi)
	}
	raw := env.do(request{path: b + "?path=/home/user/out/r%C3%A9sult.bin"})
	if raw.status != 200 || string(raw.body) != "\x00\x01binary" || raw.header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("get: %d %q %v", raw.status, raw.body, raw.header)
	}
	if cd := raw.header.Get("Content-Disposition"); !strings.HasPrefix(cd, "attachment; filename*=utf-8''r%C3%A9sult.bin") {
		t.Errorf("Content-Disposition %q", cd)
	}
	list := decode(t, env.do(request{path: b + "?path=."}))
	var names []string
	for _, e := range list["entries"].([]any) {
		names = append(names, e.(map[string]any)["name"].(string)+":"+e.(map[string]any)["type"].(string))
	}
	if diff := cmp.Diff([]string{"data:dir", "out:dir"}, names); diff != "" || list["path"] != "/home/user" {
		t.Errorf("listing %v (-want +got):\n%s", list, diff)
	}
	if got := env.do(request{method: "POST", path: b + "/mkdir", body: `{"path":"new/deep"}`}); got.status != 201 || decode(t, got)["type"] != "dir" {
		t.Errorf("mkdir: %d %s", got.status, got.body)
	}
	if got := env.do(request{method: "POST", path: b + "/move", body: `{"from":"data/in.csv","to":"new/deep/in.csv"}`}); got.status != 200 || decode(t, got)["path"] != "/home/user/new/deep/in.csv" {
		t.Errorf("move: %d %s", got.status, got.body)
	}
	if got := env.do(request{path: b + "?path=new/deep/in.csv"}); string(got.body) != "a,b\n" {
		t.Errorf("moved file %q", got.body)
	}
	if got := env.do(request{method: "DELETE", path: b + "?path=new"}); got.status != 200 {
		t.Errorf("delete: %d %s", got.status, got.body)
	}
	if got := env.do(request{path: b + "?path=new/deep/in.csv"}); got.status != 404 || errCode(t, got) != "not_found" {
		t.Errorf("deleted file: %d %s", got.status, got.body)
	}
	// An upload over max_file_mb (1 MB in the fake), with and without a
	// declared length.
	big := strings.Repeat("x", 1<<20+1)
	if got := env.do(request{method: "PUT", path: b + "?path=big", body: big, ctype: octet}); got.status != 413 || errCode(t, got) != "payload_too_large" {
		t.Errorf("big upload: %d %s", got.status, got.body)
	}
	req, _ := http.NewRequestWithContext(context.Background(), "PUT", env.http.URL+b+"?path=big", &chunked{strings.NewReader(big)})
	req.Header.Set("Authorization", "Bearer "+env.key)
	res, err := env.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 413 {
		t.Errorf("chunked big upload: %d", res.StatusCode)
	}
	if got := env.do(request{path: b + "?path=big"}); got.status != 404 {
		t.Errorf("a refused upload left a file: %d", got.status)
	}
}

// chunked hides its length, so the request is sent chunked.
type chunked struct{ r *strings.Reader }

func (c *chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

func TestSandboxUsage(t *testing.T) {
	env, _ := newSandboxEnv(t)
	id := env.createSandbox(t, `{}`)
	env.createSandbox(t, `{}`)
	env.do(request{method: "POST", path: "/v1/sandboxes/" + id + "/pause"})
	u := decode(t, env.do(request{path: "/v1/usage"}))
	if diff := cmp.Diff(map[string]any{"sandbox_seconds": 0.0, "cpu_seconds": 0.0, "network_bytes_in": 0.0, "network_bytes_out": 0.0, "running": 1.0, "paused": 1.0}, u["sandboxes"]); diff != "" {
		t.Errorf("usage.sandboxes (-want +got):\n%s", diff)
	}
	if _, ok := u["today"].(map[string]any)["executions"]; !ok {
		t.Errorf("usage lost its fields: %v", u)
	}
	if _, ok := decode(t, newEnv(t).do(request{path: "/v1/usage"}))["sandboxes"]; ok {
		t.Errorf("usage of a server without sandboxes has them")
	}
}

func TestGoldenSandboxResponses(t *testing.T) {
	env, _ := newSandboxEnv(t)
	created := env.do(request{method: "POST", path: "/v1/sandboxes", body: `{"metadata":{"team":"ml"}}`})
	golden(t, "sandbox_created", created, "Location")
	id := decode(t, created)["id"].(string)
	b := "/v1/sandboxes/" + id
	golden(t, "sandbox_list", env.do(request{path: "/v1/sandboxes?limit=1"}))
	golden(t, "command_result", env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"echo 42"}`}))
	golden(t, "command_started", env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"cat","background":true}`}), "Location")
	golden(t, "file_list", env.do(request{path: b + "/files?path=/home/user"}))
	golden(t, "context_created", env.do(request{method: "POST", path: b + "/contexts", body: `{"language":"javascript"}`}))
	golden(t, "run_code_result", env.do(request{method: "POST", path: b + "/run", body: `{"code":"6 * 7"}`}))
	golden(t, "run_code_error", env.do(request{method: "POST", path: b + "/run", body: `{"code":"raise ZeroDivisionError"}`}))
	golden(t, "sandbox_killed", env.do(request{method: "DELETE", path: b}))
	golden(t, "error_sandbox_not_running", env.do(request{method: "POST", path: b + "/pause"}))
	golden(t, "usage_sandboxes", env.do(request{path: "/v1/usage"}))
	golden(t, "error_sandboxes_off", newEnv(t).do(request{path: "/v1/sandboxes"}))
}

// coverSandboxes gives every documented answer of the sandbox routes, for
// TestOpenAPICoverage; it returns the envs whose answers count.
func coverSandboxes(t *testing.T) []*testEnv {
	plans := config.DefaultPlans()
	plans["slow"] = config.Plan{ExecutionsPerDay: 100, RequestsPerMinute: 1, MaxTimeoutS: 10, MemoryMB: 64}
	env, _ := newSandboxEnv(t, withPlans(plans))
	slow, _ := env.newKey("slow", "slow")
	big := strings.Repeat("x", 1<<20+1)
	big2 := env.createSandbox(t, `{"files":[{"path":"big","content":"`+big+`"}]}`)
	id := env.createSandbox(t, `{"files":[{"path":"a.txt","content":"x"}]}`)
	b := "/v1/sandboxes/" + id
	ended := env.createSandbox(t, `{}`)
	env.do(request{method: "DELETE", path: "/v1/sandboxes/" + ended})
	e := "/v1/sandboxes/" + ended
	missing := "/v1/sandboxes/sbx_00000000000000000000000000000999"
	overBody := strings.Repeat("x", int(env.srv.maxBodyBytes(planPro())))
	overStdin := strings.Repeat("x", 6*env.svc.MaxStdinBytes()+smallBodyBytes)
	octet := ptr("application/octet-stream")
	pid := int(decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"cat","background":true}`}))["pid"].(float64))
	c := fmt.Sprintf("%s/commands/%d", b, pid)
	done := decode(t, env.do(request{method: "POST", path: b + "/commands", body: `{"cmd":"cat","background":true}`}))
	d := fmt.Sprintf("%s/commands/%d", b, int(done["pid"].(float64)))
	env.do(request{method: "POST", path: d + "/stdin", body: `{"eof":true}`})
	cid := decode(t, env.do(request{method: "POST", path: b + "/contexts", body: `{"language":"javascript"}`}))["id"].(string)
	for _, r := range []request{
		{method: "POST", path: "/v1/sandboxes", body: `{"timeout_s":0.5}`},
		{method: "POST", path: "/v1/sandboxes", body: `{}`, header: map[string]string{"Idempotency-Key": "k"}},
		{method: "POST", path: "/v1/sandboxes", body: `{"image":"default"}`, header: map[string]string{"Idempotency-Key": "k"}}, // 409
		{method: "POST", path: "/v1/sandboxes", body: jsonBody(map[string]any{"env": map[string]string{"A": overBody}})},
		{method: "POST", path: "/v1/sandboxes", body: `{}`}, // 429 sandbox_limit: big2, id and k run
		{path: "/v1/sandboxes"}, {path: "/v1/sandboxes?limit=0"},
		{path: b}, {path: missing}, {method: "DELETE", path: missing},
		{method: "POST", path: b + "/timeout", body: `{"timeout_s":600}`}, {method: "POST", path: b + "/timeout", body: `{}`},
		{method: "POST", path: missing + "/timeout", body: `{"timeout_s":60}`}, {method: "POST", path: e + "/timeout", body: `{"timeout_s":60}`},
		{method: "POST", path: missing + "/pause"}, {method: "POST", path: e + "/pause"},
		{method: "POST", path: missing + "/resume"}, {method: "POST", path: e + "/resume"},
		{method: "POST", path: b + "/pause", body: `{"x":1}`}, {method: "POST", path: b + "/resume", body: `{"x":1}`},
		{method: "POST", path: b + "/commands", body: `{"cmd":"echo 1"}`},
		{method: "POST", path: b + "/commands", body: `{"cmd":"echo 1"}`, header: map[string]string{"Accept": "text/event-stream"}},
		{method: "POST", path: b + "/commands", body: `{}`}, {method: "POST", path: missing + "/commands", body: `{"cmd":"ls"}`},
		{method: "POST", path: e + "/commands", body: `{"cmd":"ls"}`},
		{method: "POST", path: b + "/commands", body: jsonBody(map[string]any{"cmd": overBody})},
		{path: b + "/commands"}, {path: missing + "/commands"},
		{method: "POST", path: c + "/stdin", body: `{"data":"x"}`}, {method: "POST", path: c + "/stdin", body: `{}`},
		{method: "POST", path: b + "/commands/999/stdin", body: `{"data":"x"}`}, {method: "POST", path: d + "/stdin", body: `{"data":"x"}`},
		{method: "POST", path: c + "/stdin", body: jsonBody(map[string]any{"data": overStdin})},
		{method: "POST", path: c + "/signal", body: `{}`}, {method: "POST", path: c + "/signal", body: `{"signal":"STOP"}`},
		{method: "POST", path: b + "/pause"}, {method: "POST", path: b + "/resume"}, {method: "POST", path: b + "/commands/999/signal", body: `{"signal":"TERM"}`},
		{method: "POST", path: d + "/signal", body: `{"signal":"TERM"}`},
		{path: d + "/events"}, {path: b + "/commands/999/events"},
		{path: b + "/files?path=."}, {path: b + "/files"}, {path: b + "/files?path=nope"}, {path: e + "/files?path=."},
		{method: "PUT", path: b + "/files?path=big", body: big, ctype: octet},
		{path: b + "/files?path=big"}, // 404; 413 comes from the service below
		{method: "PUT", path: b + "/files?path=f", body: "x", ctype: octet}, {method: "PUT", path: b + "/files", body: "x", ctype: octet},
		{method: "PUT", path: missing + "/files?path=f", body: "x", ctype: octet}, {method: "PUT", path: e + "/files?path=f", body: "x", ctype: octet},
		{method: "DELETE", path: b + "/files?path=f"}, {method: "DELETE", path: b + "/files"}, {method: "DELETE", path: b + "/files?path=f"},
		{method: "DELETE", path: e + "/files?path=f"},
		{method: "POST", path: b + "/files/mkdir", body: `{"path":"d"}`}, {method: "POST", path: b + "/files/mkdir", body: `{}`},
		{method: "POST", path: missing + "/files/mkdir", body: `{"path":"d"}`}, {method: "POST", path: e + "/files/mkdir", body: `{"path":"d"}`},
		{method: "POST", path: b + "/files/move", body: `{"from":"a.txt","to":"b.txt"}`}, {method: "POST", path: b + "/files/move", body: `{}`},
		{method: "POST", path: b + "/files/move", body: `{"from":"gone","to":"b"}`}, {method: "POST", path: e + "/files/move", body: `{"from":"a","to":"b"}`},
		{method: "POST", path: b + "/contexts", body: `{"language":"cobol"}`}, {method: "POST", path: missing + "/contexts", body: `{}`},
		{method: "POST", path: e + "/contexts", body: `{}`}, {path: b + "/contexts"}, {path: missing + "/contexts"}, {path: e + "/contexts"},
		{method: "POST", path: b + "/contexts/" + cid + "/restart"}, {method: "POST", path: b + "/contexts/" + cid + "/restart", body: `{"x":1}`},
		{method: "POST", path: b + "/contexts/ctx_00000000000000000000000000000999/restart"}, {method: "POST", path: e + "/contexts/ctx_00000000000000000000000000000999/restart"},
		{method: "DELETE", path: b + "/contexts/" + cid}, {method: "DELETE", path: b + "/contexts/" + cid}, {method: "DELETE", path: e + "/contexts/" + cid},
		{method: "POST", path: b + "/run", body: `{"code":"x = 1"}`}, {method: "POST", path: b + "/run", body: `{"code":"x"}`, header: map[string]string{"Accept": "text/event-stream"}},
		{method: "POST", path: b + "/run", body: `{"code":"raise ValueError"}`, header: map[string]string{"Accept": "text/event-stream"}},
		{method: "POST", path: b + "/run", body: `{"code":"print(hi)"}`, header: map[string]string{"Accept": "text/event-stream"}},
		{method: "POST", path: b + "/run", body: `{}`}, {method: "POST", path: missing + "/run", body: `{"code":"1"}`},
		{method: "POST", path: e + "/run", body: `{"code":"1"}`}, {method: "POST", path: b + "/run", body: jsonBody(map[string]any{"code": overBody})},
	} {
		env.do(r)
	}
	// A download over max_file_mb: the fake refuses what it holds.
	env.do(request{path: "/v1/sandboxes/" + big2 + "/files?path=big"})
	// A resume over the limit: three running, then a paused one resumed.
	lenv, _ := newSandboxEnv(t)
	p := lenv.createSandbox(t, `{}`)
	lenv.do(request{method: "POST", path: "/v1/sandboxes/" + p + "/pause"})
	lenv.createSandbox(t, `{}`)
	lenv.createSandbox(t, `{}`)
	lenv.createSandbox(t, `{}`)
	lenv.do(request{method: "POST", path: "/v1/sandboxes/" + p + "/resume"})

	all := append(sandboxRequests(id), request{path: "/v1/sandboxes"}, request{method: "POST", path: "/v1/sandboxes", body: `{}`})
	benv, _ := newSandboxEnv(t)
	benv.store.broken.Store(true)
	eenv, _ := newSandboxEnv(t, withOptions(func(o *Options) { o.EdgeSecret = "0123456789abcdef0123" }))
	env.do(request{path: "/v1/sandboxes", key: slow}) // the minute's one request
	for _, r := range all {
		benv.do(r) // 500
		eenv.do(r) // 403
		r.key = slow
		env.do(r) // 429 rate
		r.key = "-"
		env.do(r) // 401
	}
	off := newEnv(t)
	for _, r := range all {
		off.do(r)
	}
	// 503: every route of a sandbox held by a node that does not answer
	// (nothing listens on port 1), and a create refused by a full share.
	fenv, ffake := newSandboxEnv(t)
	held := fenv.createSandbox(t, `{}`)
	ffake.Owners = map[string]string{held: "http://127.0.0.1:1"}
	ffake.Busy = true
	for _, r := range append(sandboxRequests(held), request{method: "POST", path: "/v1/sandboxes", body: `{}`}) {
		fenv.do(r)
	}
	return []*testEnv{env, lenv, benv, eenv, off, fenv}
}

// A download that fails after its first bytes cuts the connection: the
// client sees a broken body, never a short one that looks whole.
func TestFileDownloadCutShort(t *testing.T) {
	env, fake := newSandboxEnv(t)
	id := env.createSandbox(t, `{}`)
	if r := env.do(request{method: "PUT", path: "/v1/sandboxes/" + id + "/files?path=f", body: strings.Repeat("x", 100), ctype: ptr("application/octet-stream")}); r.status/100 != 2 {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	fake.CutReadAfter = 10
	res := env.download(t, id, "f")
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != 200 || err == nil {
		t.Fatalf("status %d, read %q, err %v: want the body broken after its first bytes", res.StatusCode, b, err)
	}
	if string(b) != strings.Repeat("x", 10) {
		t.Errorf("body %q", b)
	}
}

// A call for a sandbox another node holds is proxied there as it came
// (method, path, body, key), once, with the same request id, streaming,
// and without counting it against the rate here; an owner that does not
// answer is a 503 to retry; a call already forwarded is never forwarded
// again.
func TestForwardToOwner(t *testing.T) {
	type seen struct {
		method, path, auth, body, by, rid string
	}
	got := make(chan seen, 4)
	release := make(chan struct{})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), string(b), r.Header.Get(forwardedHeader), r.Header.Get("X-Request-ID")}
		h := w.Header()
		h.Set("X-Request-ID", r.Header.Get("X-Request-ID"))
		// The owner counts the call, as a real node's rateLimit does.
		h.Set("X-RateLimit-Limit", "120")
		h.Set("X-RateLimit-Remaining", "41")
		h.Set("X-RateLimit-Reset", "1700000000")
		if r.Method == "GET" {
			h.Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "one,")
			w.(http.Flusher).Flush()
			<-release
			io.WriteString(w, "two")
			return
		}
		h.Set("Content-Type", "application/json")
		w.WriteHeader(404)
		fmt.Fprintf(w, `{"error":{"code":"not_found","message":"no such file"},"request_id":%q}`, r.Header.Get("X-Request-ID"))
	}))
	defer owner.Close()
	env, fake := newSandboxEnv(t, withOptions(func(o *Options) { o.NodeID = "node-a" }))
	id := env.createSandbox(t, `{}`)
	fake.Owners = map[string]string{id: owner.URL}

	// A body, a query and the /api prefix go through as they came.
	r := env.do(request{method: "POST", path: "/api/v1/sandboxes/" + id + "/files/move?x=1", body: `{"from":"a","to":"b"}`})
	s := <-got
	want := seen{"POST", "/api/v1/sandboxes/" + id + "/files/move?x=1", "Bearer " + env.key, `{"from":"a","to":"b"}`, "node-a", r.header.Get("X-Request-ID")}
	if r.status != 404 || s != want {
		t.Errorf("answer %d; the owner saw %+v, want %+v", r.status, s, want)
	}
	if ids := r.header.Values("X-Request-ID"); len(ids) != 1 {
		t.Errorf("X-Request-ID %v, want one", ids)
	}
	if rl := r.header.Values("X-RateLimit-Remaining"); len(rl) != 1 || rl[0] != "41" {
		t.Errorf("X-RateLimit-Remaining %v, want the owner's alone (a forwarded call is not counted here)", rl)
	}

	// The answer streams: the first bytes arrive before the owner ends.
	res := env.download(t, id, "f")
	defer res.Body.Close()
	first := make([]byte, 4)
	if _, err := io.ReadFull(res.Body, first); err != nil || string(first) != "one," {
		t.Fatalf("first bytes %q, %v: want the owner's first before it ends", first, err)
	}
	close(release)
	if rest, _ := io.ReadAll(res.Body); string(rest) != "two" {
		t.Errorf("rest %q", rest)
	}
	<-got

	// Already forwarded: this node answers it (here, the fake's own
	// sandbox), whatever it thinks of the owner.
	r = env.do(request{path: "/v1/sandboxes/" + id, header: map[string]string{forwardedHeader: "node-b"}})
	if r.status != 200 || len(got) != 0 {
		t.Errorf("a forwarded call was forwarded again: %d, %d calls at the owner", r.status, len(got))
	}

	// The owner is gone.
	owner.Close()
	r = env.do(request{path: "/v1/sandboxes/" + id})
	if r.status != 503 || r.header.Get("Retry-After") != "1" || !strings.Contains(string(r.body), `"unavailable"`) {
		t.Errorf("owner down: %d %v %s", r.status, r.header, r.body)
	}
}

// download GETs a sandbox's file, its answer unread.
func (e *testEnv) download(t *testing.T, id, path string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", e.http.URL+"/v1/sandboxes/"+id+"/files?path="+path, nil)
	req.Header.Set("Authorization", "Bearer "+e.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
