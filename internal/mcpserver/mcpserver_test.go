package mcpserver

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver/mcptest"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// testLanguages are what the golden tools list is rendered with; the
// Python server's test uses the same list.
var testLanguages = []client.Language{
	{Name: "bash", Version: "5.2.15"},
	{Name: "javascript", Version: "22.23.5"},
	{Name: "python", Version: "3.11.2"},
}

// testImages are what the golden tools list shows of images; the Python
// server's test uses the same list (IMAGES in sdk/python/tests/stub.py).
var testImages = []client.Image{
	{Name: "default", Packages: []client.Package{}},
	{Name: "datasci", Packages: []client.Package{
		{Name: "python3-pandas", Version: "1.5.3+dfsg-2", Source: "apt"},
		{Name: "lodash", Version: "4.17.21", Source: "npm"},
	}},
}

// fakeAPI answers like the Vertal Run API for a few known programs and
// records which key each request carried.
type fakeAPI struct {
	mu         sync.Mutex
	edgeSecret string // required in X-Vertal-Edge-Secret when set
	sandboxes  bool   // GET /v1/sandboxes answers (an API with sandboxes that stay)
	keys       map[string]bool
	calls      []string // "METHOD path key"
	runs       []map[string]any
	creates    []map[string]any // POST /v1/sandboxes bodies (with sandboxes)
}

func newFakeAPI(t *testing.T) (*fakeAPI, *httptest.Server) {
	f := &fakeAPI{keys: map[string]bool{"kubo_sk_alice": true, "kubo_sk_bob": true}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

var executions = map[string]string{
	"print(6*7)":          `{"id":"exe_1","status":"succeeded","stdout":"42\n","stderr":"","exit_code":0,"duration_ms":265,"truncated":false,"usage":{"sandbox_seconds":0.265},"request_id":"req_1","image":"datasci","image_version":"20261201T092047Z-19222"}`,
	"raise SystemExit(3)": `{"id":"exe_2","status":"failed","stdout":"","stderr":"Traceback (most recent call last):\nValueError\n","exit_code":3,"duration_ms":30,"truncated":false,"usage":{"sandbox_seconds":0.03},"request_id":"req_2","image":"default","image_version":null}`,
	"while True: pass":    `{"id":"exe_3","status":"timed_out","stdout":"","stderr":"","exit_code":137,"duration_ms":2000,"truncated":false,"usage":{"sandbox_seconds":2},"request_id":"req_3"}`,
	"fetch":               fetchExecution,
}

// fetchExecution is a run with a network: one connection made, one
// refused. The Python server's test has the same (FETCH_EXECUTION).
const fetchExecution = `{"id":"exe_4","status":"failed","stdout":"200\n","stderr":"URLError\n","exit_code":1,"duration_ms":812,"truncated":false,` +
	`"usage":{"sandbox_seconds":0.812,"network_bytes_in":5120,"network_bytes_out":312},"request_id":"req_4",` +
	`"network":{"allow":["pypi.org"],"bytes_in":5120,"bytes_out":312,"connections":1,"refused":1,"attempts":[` +
	`{"host":"pypi.org","port":443,"kind":"tls","allowed":true,"bytes_out":312,"bytes_in":5120},` +
	`{"host":"example.com","port":443,"kind":"tls","allowed":false,"reason":"example.com is not in the allowlist","bytes_out":0,"bytes_in":0}]}}`

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	path := strings.TrimPrefix(r.URL.Path, "/api")
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+path+" "+key)
	ok := f.keys[key]
	secret, sandboxes := f.edgeSecret, f.sandboxes
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if secret != "" && r.Header.Get("X-Vertal-Edge-Secret") != secret {
		w.WriteHeader(403)
		io.WriteString(w, `{"error":{"code":"forbidden","message":"not from the edge"},"request_id":"req_403"}`)
		return
	}
	if !ok {
		w.WriteHeader(401)
		io.WriteString(w, `{"error":{"code":"unauthorized","message":"invalid or revoked API key"},"request_id":"req_401"}`)
		return
	}
	if r.Method+" "+path == "GET /v1/sandboxes" && sandboxes {
		io.WriteString(w, `{"sandboxes":[],"next_cursor":null}`)
		return
	}
	if r.Method+" "+path == "POST /v1/sandboxes" && sandboxes {
		f.createSandbox(w, r)
		return
	}
	switch r.Method + " " + path {
	case "POST /v1/executions":
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.runs = append(f.runs, body)
		f.mu.Unlock()
		if n, ok := body["network"].(map[string]any); ok {
			// The service's own check, against fakePlan.
			req := &execution.NetworkRequest{Allow: []string{}}
			for _, r := range n["allow"].([]any) {
				req.Allow = append(req.Allow, r.(string))
			}
			if _, err := execution.NetworkFor(fakePlan, req); err != nil {
				e := refusal(err)
				w.WriteHeader(e.StatusCode)
				json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": e.Code, "message": e.Message}, "request_id": "req_n"})
				return
			}
		}
		if body["code"] == "quota" {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"code":"quota_exceeded","message":"daily quota of 100 executions reached"},"request_id":"req_q"}`)
			return
		}
		io.WriteString(w, executions[body["code"].(string)])
	case "GET /v1/usage":
		io.WriteString(w, `{"tenant":"acme","plan":"free","today":{"date":"2025-01-02","executions":3,"sandbox_seconds":2.635,"cpu_seconds":1.2},"limits":{"executions_per_day":100,"requests_per_minute":20,"max_timeout_s":10,"memory_mb":256}}`)
	case "GET /v1/languages":
		io.WriteString(w, `{"languages":[{"name":"bash","version":"5.2.15","aliases":["sh"]},{"name":"javascript","version":"22.23.5","aliases":["js"]},{"name":"python","version":"3.11.2","aliases":["py"]}]}`)
	default:
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"not_found","message":"no such route"},"request_id":"req_404"}`)
	}
}

// createSandbox answers POST /v1/sandboxes with a running sandbox whose
// network is fakePlan's, narrowed by the request's, or the API's refusal.
func (f *fakeAPI) createSandbox(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	f.creates = append(f.creates, body)
	f.mu.Unlock()
	var req *execution.NetworkRequest
	if n, ok := body["network"].(map[string]any); ok {
		req = &execution.NetworkRequest{Allow: []string{}}
		for _, rule := range n["allow"].([]any) {
			req.Allow = append(req.Allow, rule.(string))
		}
	}
	nw, err := execution.NetworkFor(fakePlan, req)
	if err != nil {
		e := refusal(err)
		w.WriteHeader(e.StatusCode)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": e.Code, "message": e.Message}, "request_id": "req_n"})
		return
	}
	sb := wire.Sandbox{ID: "sbx_1", Status: "running", Image: "default", OnTimeout: "kill"}
	if nw != nil {
		sb.Limits.Network = &wire.SandboxNetwork{Allow: nw.Allow, MaxBytes: nw.MaxBytes}
		sb.Network = &wire.NetworkUsage{Attempts: []wire.NetworkAttempt{}}
	}
	w.WriteHeader(201)
	json.NewEncoder(w).Encode(sb)
}

func (f *fakeAPI) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// connect runs server s in memory and returns a connected MCP client.
func connect(t *testing.T, s *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func stdioServer(t *testing.T, baseURL, key string, langs []client.Language) *mcp.Server {
	t.Helper()
	c, err := client.New(baseURL, key, client.WithMaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	return New(context.Background(), c, Options{Version: "test", Languages: langs, Images: testImages})
}

func TestToolsGolden(t *testing.T) {
	_, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
	checkGolden(t, "tools.golden.json", toolsJSON(t, cs), " and update the Python server too")
}

// toolsJSON is the session's tools/list, as the golden files hold it.
func toolsJSON(t *testing.T, cs *mcp.ClientSession) []byte {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(res.Tools, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// checkGolden compares got with testdata/name, which -update rewrites;
// more says what else to do after an intended change.
func checkGolden(t *testing.T, name string, got []byte, more string) {
	t.Helper()
	got = append(got, '\n')
	golden := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("tools/list differs from %s (-want +got); if intended, run go test -update%s:\n%s", golden, more, diff)
	}
}

func TestDescriptionTellsTheLimits(t *testing.T) {
	d := runCodeDescription(testLanguages, nil)
	if p := runCodeDescription(testLanguages, testImages); !strings.Contains(p, "datasci (python3-pandas 1.5.3+dfsg-2, lodash 4.17.21)") || !strings.Contains(p, "default (standard libraries only)") {
		t.Errorf("description does not list the images and their packages:\n%s", p)
	}
	for _, want := range []string{"no network", "cannot be installed", "read-only", "16 MB", "64 KB", "python 3.11.2", "Node.js 22.23.5", "bash 5.2.15", "max_timeout_s", "nothing persists"} {
		if !strings.Contains(d, want) {
			t.Errorf("run_code description lacks %q", want)
		}
	}
}

func TestLanguagesFetchedFromAPI(t *testing.T) {
	f, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL+"/api", "kubo_sk_alice", nil))
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Tools[0].Description + res.Tools[1].Description; !strings.Contains(d, "python 3.11.2") {
		t.Errorf("descriptions do not carry the API's versions:\n%s", d)
	}
	if diff := cmp.Diff([]string{"GET /v1/languages kubo_sk_alice", "GET /v1/sandboxes kubo_sk_alice"}, f.seen()); diff != "" {
		t.Errorf("API calls (-want +got):\n%s", diff)
	}
}

func TestRunCode(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           map[string]any
		wantError      bool
		wantText       []string
		wantStructured map[string]any // nil: no structured content
		wantRun        map[string]any // the body the API got; nil: no call
	}{
		{
			name:     "success",
			args:     map[string]any{"language": "python", "code": "print(6*7)"},
			wantText: []string{"status: succeeded", "exit_code: 0", "image: datasci (build 20261201T092047Z-19222)\nexecution_id: ", "--- stdout ---\n42\n", "--- stderr ---\n(empty)"},
			wantStructured: map[string]any{"id": "exe_1", "status": "succeeded", "stdout": "42\n", "stderr": "", "exit_code": 0.0,
				"duration_ms": 265.0, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.265}, "request_id": "req_1",
				"image": "datasci", "image_version": "20261201T092047Z-19222"},
			wantRun: map[string]any{"language": "python", "code": "print(6*7)"},
		},
		{
			name:      "failed program is a tool error with its output",
			args:      map[string]any{"language": "py", "code": "raise SystemExit(3)", "timeout_s": 5, "stdin": "x"},
			wantError: true,
			wantText:  []string{"status: failed", "exit_code: 3", "image: default\nexecution_id: ", "ValueError"},
			wantStructured: map[string]any{"id": "exe_2", "status": "failed", "stdout": "", "stderr": "Traceback (most recent call last):\nValueError\n",
				"exit_code": 3.0, "duration_ms": 30.0, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.03}, "request_id": "req_2",
				"image": "default", "image_version": nil},
			wantRun: map[string]any{"language": "py", "code": "raise SystemExit(3)", "timeout_s": 5.0, "stdin": "x"},
		},
		{
			name:      "timeout",
			args:      map[string]any{"language": "python", "code": "while True: pass", "timeout_s": 2},
			wantError: true,
			wantText:  []string{"status: timed_out", "killed when timeout_s ran out"},
			wantStructured: map[string]any{"id": "exe_3", "status": "timed_out", "stdout": "", "stderr": "", "exit_code": 137.0,
				"duration_ms": 2000.0, "truncated": false, "usage": map[string]any{"sandbox_seconds": 2.0}, "request_id": "req_3"},
			wantRun: map[string]any{"language": "python", "code": "while True: pass", "timeout_s": 2.0},
		},
		{
			name:      "quota is a clear tool error",
			args:      map[string]any{"language": "python", "code": "quota"},
			wantError: true,
			wantText:  []string{"quota_exceeded", "daily quota of 100 executions reached", "HTTP 429", "req_q", "resets at 00:00 UTC"},
			wantRun:   map[string]any{"language": "python", "code": "quota"},
		},
		{
			name:      "a network narrows the plan's, and the result tells what it reached and was refused",
			args:      map[string]any{"language": "python", "code": "fetch", "network": []any{"pypi.org"}},
			wantError: true,
			wantText: []string{"execution_id: exe_4\nnetwork: allowed pypi.org; connections: 1 made, 1 refused; bytes: 5120 in, 312 out\n" +
				"refused: example.com:443 (tls): example.com is not in the allowlist\n--- stdout ---\n200\n"},
			wantStructured: mustJSON(t, fetchExecution),
			wantRun:        map[string]any{"language": "python", "code": "fetch", "network": map[string]any{"allow": []any{"pypi.org"}}},
		},
		{
			name:     "[] asks for no network",
			args:     map[string]any{"language": "python", "code": "print(6*7)", "network": []any{}},
			wantText: []string{"execution_id: exe_1\n--- stdout ---\n42\n"},
			wantStructured: map[string]any{"id": "exe_1", "status": "succeeded", "stdout": "42\n", "stderr": "", "exit_code": 0.0,
				"duration_ms": 265.0, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.265}, "request_id": "req_1",
				"image": "datasci", "image_version": "20261201T092047Z-19222"},
			wantRun: map[string]any{"language": "python", "code": "print(6*7)", "network": map[string]any{"allow": []any{}}},
		},
		{
			name:      "a host beyond the plan's list is refused, with that list and what to do",
			args:      map[string]any{"language": "python", "code": "fetch", "network": []any{"evil.example"}},
			wantError: true,
			// The service's message is its own; what this server adds is
			// the code, the status and the hint after it.
			wantText: []string{"Vertal Run API error forbidden: network.allow ", "evil.example", "pypi.org", "*.pythonhosted.org",
				"(HTTP 403, request id req_n). The network argument may list only"},
			wantRun: map[string]any{"language": "python", "code": "fetch", "network": map[string]any{"allow": []any{"evil.example"}}},
		},
		{
			name:      "a network is a list of rules",
			args:      map[string]any{"language": "python", "code": "1", "network": "pypi.org"},
			wantError: true,
			wantText:  []string{"invalid arguments", "network"},
		},
		{
			name:      "missing code",
			args:      map[string]any{"language": "python"},
			wantError: true,
			wantText:  []string{"code is required"},
		},
		{
			name:      "unknown argument",
			args:      map[string]any{"language": "python", "code": "1", "memory": 5},
			wantError: true,
			wantText:  []string{`unknown field "memory"`},
		},
		{
			name:      "timeout below one",
			args:      map[string]any{"language": "python", "code": "1", "timeout_s": 0},
			wantError: true,
			wantText:  []string{"timeout_s must be at least 1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: tc.args})
			if err != nil {
				t.Fatalf("protocol error %v; want a tool result", err)
			}
			if res.IsError != tc.wantError {
				t.Errorf("IsError = %v, want %v", res.IsError, tc.wantError)
			}
			text := res.Content[0].(*mcp.TextContent).Text
			for _, w := range tc.wantText {
				if !strings.Contains(text, w) {
					t.Errorf("text lacks %q:\n%s", w, text)
				}
			}
			var structured map[string]any
			if res.StructuredContent != nil {
				b, _ := json.Marshal(res.StructuredContent)
				json.Unmarshal(b, &structured)
			}
			if diff := cmp.Diff(tc.wantStructured, structured); diff != "" {
				t.Errorf("structured content (-want +got):\n%s", diff)
			}
			var wantRuns []map[string]any
			if tc.wantRun != nil {
				wantRuns = []map[string]any{tc.wantRun}
			}
			if diff := cmp.Diff(wantRuns, f.runs); diff != "" {
				t.Errorf("API requests (-want +got):\n%s", diff)
			}
		})
	}
}

// The network argument reaches the execution service as the API's would:
// left out or null is the plan's allowlist (nil), [] none.
func TestRunCodeNetworkReachesService(t *testing.T) {
	for _, tc := range []struct {
		name    string
		network any // nil: the argument left out
		want    *execution.NetworkRequest
	}{
		{"left out", nil, nil},
		{"null", json.RawMessage("null"), nil},
		{"none", []any{}, &execution.NetworkRequest{Allow: []string{}}},
		{"narrowed", []any{"pypi.org", "*.pythonhosted.org"}, &execution.NetworkRequest{Allow: []string{"pypi.org", "*.pythonhosted.org"}}},
	} {
		run := &fakeRun{}
		args := map[string]any{"language": "python", "code": "1"}
		if tc.network != nil {
			args["network"] = tc.network
		}
		if res := call(t, backendServer(t, run), "run_code", args); res.IsError {
			t.Fatalf("%s: %s", tc.name, text(res))
		}
		if diff := cmp.Diff(tc.want, run.reqs[0].Network); diff != "" {
			t.Errorf("%s: Input.Network (-want +got):\n%s", tc.name, diff)
		}
	}
}

// mustJSON is s decoded as structured content is.
func mustJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The network lines name each refusal once, with how often it came, and
// at most maxNetworkLines of them.
func TestNetworkText(t *testing.T) {
	refused := func(host string) wire.NetworkAttempt {
		return wire.NetworkAttempt{Host: host, Port: 443, Kind: "tls", Reason: host + " is not in the allowlist"}
	}
	many := &wire.ExecutionNetwork{Allow: []string{"pypi.org"}, Refused: 13}
	for i := range 12 {
		many.Attempts = append(many.Attempts, refused(fmt.Sprintf("h%d.example", i)))
	}
	many.Attempts = append(many.Attempts, refused("h0.example"))
	for _, tc := range []struct {
		name string
		n    *wire.ExecutionNetwork
		want string
	}{
		{"none", nil, ""},
		{"nothing refused", &wire.ExecutionNetwork{Allow: []string{"pypi.org", "*.pythonhosted.org"}, Connections: 2, BytesIn: 10, BytesOut: 1,
			Attempts: []wire.NetworkAttempt{{Host: "pypi.org", Port: 443, Kind: "tls", Allowed: true}}},
			"network: allowed pypi.org, *.pythonhosted.org; connections: 2 made, 0 refused; bytes: 10 in, 1 out\n"},
		{"repeated and cut", &wire.ExecutionNetwork{Allow: []string{"pypi.org"}, Connections: 1, Refused: 2, Attempts: []wire.NetworkAttempt{
			refused("example.com"),
			{Host: "pypi.org", Port: 443, Kind: "tls", Allowed: true, Reason: "cut at the byte bound"},
			refused("example.com"),
		}}, "network: allowed pypi.org; connections: 1 made, 2 refused; bytes: 0 in, 0 out\n" +
			"refused: example.com:443 (tls): example.com is not in the allowlist (2 times)\n" +
			"cut: pypi.org:443 (tls): cut at the byte bound\n"},
		{"more than fit", many, "network: allowed pypi.org; connections: 0 made, 13 refused; bytes: 0 in, 0 out\n" +
			"refused: h0.example:443 (tls): h0.example is not in the allowlist (2 times)\n" +
			"refused: h1.example:443 (tls): h1.example is not in the allowlist\n" +
			"refused: h2.example:443 (tls): h2.example is not in the allowlist\n" +
			"refused: h3.example:443 (tls): h3.example is not in the allowlist\n" +
			"refused: h4.example:443 (tls): h4.example is not in the allowlist\n" +
			"refused: h5.example:443 (tls): h5.example is not in the allowlist\n" +
			"refused: h6.example:443 (tls): h6.example is not in the allowlist\n" +
			"refused: h7.example:443 (tls): h7.example is not in the allowlist\n" +
			"refused: h8.example:443 (tls): h8.example is not in the allowlist\n" +
			"refused: h9.example:443 (tls): h9.example is not in the allowlist\n" +
			"(2 more refused or cut connections in the structured content)\n"},
	} {
		if diff := cmp.Diff(tc.want, networkText(tc.n)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestGetUsage(t *testing.T) {
	_, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "get_usage", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("get_usage: %v %+v", err, res)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	for _, w := range []string{"plan: free", "3 executions", `"max_timeout_s":10`} {
		if !strings.Contains(text, w) {
			t.Errorf("text lacks %q:\n%s", w, text)
		}
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !strings.Contains(string(b), `"memory_mb":256`) {
		t.Errorf("structured usage %s lost a limit", b)
	}
}

func TestUnauthorizedIsToolError(t *testing.T) {
	_, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_revoked", testLanguages))
	for _, name := range []string{"run_code", "get_usage"} {
		args := map[string]any{"language": "python", "code": "print(6*7)"}
		if name == "get_usage" {
			args = map[string]any{}
		}
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: protocol error %v", name, err)
		}
		text := res.Content[0].(*mcp.TextContent).Text
		if !res.IsError || !strings.Contains(text, "unauthorized") || !strings.Contains(text, "revoked") {
			t.Errorf("%s: got IsError=%v %q, want an unauthorized tool error", name, res.IsError, text)
		}
	}
}

func TestUnreachableAPIIsToolError(t *testing.T) {
	cs := connect(t, stdioServer(t, "http://127.0.0.1:1", "kubo_sk_alice", testLanguages))
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(text, "KUBO_API_URL") {
		t.Errorf("got IsError=%v %q", res.IsError, text)
	}
}

func TestServeStdio(t *testing.T) {
	_, srv := newFakeAPI(t)
	c, err := client.New(srv.URL, "kubo_sk_alice")
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- ServeStdio(context.Background(), c, inR, outW, Options{Languages: testLanguages})
		outW.Close()
	}()

	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(context.Background(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print(6*7)"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "42") {
		t.Fatalf("run_code over stdio: %v %+v", err, res)
	}
	cs.Close()
	if err := <-done; err != nil {
		t.Errorf("ServeStdio returned %v after the client left, want nil", err)
	}
}

// bearer adds an Authorization header (and any extra) to every request.
type bearer struct {
	key   string
	extra map[string]string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	for k, v := range b.extra {
		r.Header.Set(k, v)
	}
	return b.base.RoundTrip(r)
}

func httpSession(t *testing.T, endpoint, key string) (*mcp.ClientSession, error) {
	return httpSessionWith(t, endpoint, key, nil)
}

func httpSessionWith(t *testing.T, endpoint, key string, extra map[string]string) (*mcp.ClientSession, error) {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer{key, extra, http.DefaultTransport}}, MaxRetries: -1}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func TestHTTPHandler(t *testing.T) {
	for _, withBackend := range []bool{false, true} {
		name := "loopback"
		if withBackend {
			name = "backend"
		}
		t.Run(name, func(t *testing.T) {
			f, api := newFakeAPI(t)
			opts := HTTPOptions{APIURL: api.URL + "/api"}
			if withBackend {
				// As the API server does: a Backend per request, for the
				// caller its key check found (here, the key itself).
				opts = HTTPOptions{Options: Options{Languages: testLanguages}, Backend: func(r *http.Request) (Backend, error) {
					key, _ := bearerKey(r.Header.Get("Authorization"))
					c, err := client.New(api.URL+"/api", key, client.WithMaxRetries(0))
					return ClientBackend(c), err
				}}
			}
			mcpSrv := httptest.NewServer(HTTPHandler(opts))
			defer mcpSrv.Close()

			for _, key := range []string{"kubo_sk_alice", "kubo_sk_bob"} {
				cs, err := httpSession(t, mcpSrv.URL, key)
				if err != nil {
					t.Fatalf("%s: connect: %v", key, err)
				}
				tools, err := cs.ListTools(context.Background(), nil)
				if err != nil || len(tools.Tools) != 2 {
					t.Fatalf("%s: tools/list: %v %v", key, err, tools)
				}
				if !strings.Contains(tools.Tools[0].Description+tools.Tools[1].Description, "python 3.11.2") {
					t.Errorf("HTTP tools lack the API's language versions")
				}
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print(6*7)"}})
				if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "\n42\n") {
					t.Fatalf("%s: run_code: %v %+v", key, err, res)
				}
			}
			// Each caller's own key reached the API; keys were checked once
			// each (then trusted for VerifyTTL).
			var runs, usage []string
			for _, c := range f.seen() {
				switch {
				case strings.HasPrefix(c, "POST /v1/executions"):
					runs = append(runs, c)
				case strings.HasPrefix(c, "GET /v1/usage"):
					usage = append(usage, c)
				}
			}
			if diff := cmp.Diff([]string{"POST /v1/executions kubo_sk_alice", "POST /v1/executions kubo_sk_bob"}, runs); diff != "" {
				t.Errorf("executions (-want +got):\n%s", diff)
			}
			wantUsage := []string{"GET /v1/usage kubo_sk_alice", "GET /v1/usage kubo_sk_bob"}
			if withBackend {
				wantUsage = nil // the API checked the key before the request got here
			}
			if diff := cmp.Diff(wantUsage, usage); diff != "" {
				t.Errorf("key checks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHTTPHandlerRefusesBadKeys(t *testing.T) {
	_, api := newFakeAPI(t)
	h := HTTPHandler(HTTPOptions{APIURL: api.URL})
	for _, tc := range []struct {
		name, auth string
		wantMsg    string
	}{
		{"no header", "", "missing API key"},
		{"not bearer", "Basic a2V5", "missing API key"},
		{"revoked key", "Bearer kubo_sk_revoked", "invalid or revoked API key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("POST", "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 401 || rec.Header().Get("WWW-Authenticate") == "" {
				t.Errorf("status %d, WWW-Authenticate %q; want 401 with a challenge", rec.Code, rec.Header().Get("WWW-Authenticate"))
			}
			var body struct {
				Error     struct{ Code, Message string }
				RequestID string `json:"request_id"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if body.Error.Code != "unauthorized" || !strings.Contains(body.Error.Message, tc.wantMsg) ||
				body.RequestID == "" || rec.Header().Get("X-Request-ID") != body.RequestID {
				t.Errorf("body %s, X-Request-ID %q: want the API error shape", rec.Body, rec.Header().Get("X-Request-ID"))
			}
		})
	}
}

func TestHTTPHandlerVerifyHook(t *testing.T) {
	f, api := newFakeAPI(t)
	var checked []string
	h := HTTPHandler(HTTPOptions{APIURL: api.URL, Options: Options{Languages: testLanguages}, Verify: func(_ context.Context, key string) error {
		checked = append(checked, key)
		if key != "kubo_sk_alice" {
			return &client.Error{StatusCode: 401, Code: client.CodeUnauthorized, Message: "nope"}
		}
		return nil
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	if _, err := httpSession(t, srv.URL, "kubo_sk_bob"); err == nil {
		t.Errorf("connect with a refused key succeeded")
	}
	cs, err := httpSession(t, srv.URL, "kubo_sk_alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range f.seen() {
		if strings.HasPrefix(c, "GET /v1/usage") {
			t.Errorf("hook given, yet the key was checked against the API: %s", c)
		}
	}
	if len(checked) < 2 {
		t.Errorf("hook saw %v, want every request checked", checked)
	}
}

func TestHTTPHandlerForwardsEdgeSecret(t *testing.T) {
	f, api := newFakeAPI(t)
	f.edgeSecret = "s3cret"
	srv := httptest.NewServer(HTTPHandler(HTTPOptions{APIURL: api.URL, Options: Options{Languages: testLanguages}}))
	defer srv.Close()
	cs, err := httpSessionWith(t, srv.URL, "kubo_sk_alice", map[string]string{"X-Vertal-Edge-Secret": "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python", "code": "print(6*7)"}})
	if err != nil || res.IsError {
		t.Fatalf("run_code behind an edge secret: %v %+v", err, res)
	}
	if _, err := httpSession(t, srv.URL, "kubo_sk_bob"); err == nil {
		t.Errorf("without the edge secret the key check should fail (the API answers 403)")
	}
}

// TestHTTPHandlerLogsQuietly: each stateless request makes an SDK session,
// whose connect and disconnect lines must not reach an INFO log.
func TestHTTPHandlerLogsQuietly(t *testing.T) {
	for _, tc := range []struct {
		level     slog.Level
		wantLines bool
	}{
		{slog.LevelInfo, false},
		{slog.LevelDebug, true},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			var buf e2etest.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			_, api := newFakeAPI(t)
			h := HTTPHandler(HTTPOptions{Options: Options{Logger: log, Languages: testLanguages}, APIURL: api.URL})
			srv := httptest.NewServer(h)
			defer srv.Close()
			cs, err := httpSession(t, srv.URL, "kubo_sk_alice")
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, err := cs.ListTools(context.Background(), nil); err != nil {
					t.Fatal(err)
				}
			}
			out := buf.String()
			if got := strings.Contains(out, "session connected"); got != tc.wantLines {
				t.Errorf("session lines logged = %v, want %v; log:\n%s", got, tc.wantLines, out)
			}
			if tc.level == slog.LevelInfo && strings.Contains(out, "level=INFO") {
				t.Errorf("INFO lines for tools/list:\n%s", out)
			}
		})
	}
}

// TestHTTPHandlerOnlyPOST: the stateless endpoint has no GET stream and no
// session to DELETE; other methods get a 405 in the API's error shape.
func TestHTTPHandlerOnlyPOST(t *testing.T) {
	_, api := newFakeAPI(t)
	h := HTTPHandler(HTTPOptions{APIURL: api.URL})
	for _, method := range []string{"GET", "DELETE", "PUT"} {
		t.Run(method, func(t *testing.T) {
			req := httptest.NewRequest(method, "/mcp", nil)
			req.Header.Set("Authorization", "Bearer kubo_sk_alice")
			req.Header.Set("Accept", "text/event-stream")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var body struct {
				Error     struct{ Code, Message string }
				RequestID string `json:"request_id"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if rec.Code != 405 || rec.Header().Get("Allow") != "POST" || rec.Header().Get("Content-Type") != "application/json" ||
				body.Error.Code != "method_not_allowed" || body.RequestID != rec.Header().Get("X-Request-ID") || body.RequestID == "" {
				t.Errorf("%d Allow %q: %s", rec.Code, rec.Header().Get("Allow"), rec.Body)
			}
		})
	}
}

// TestCapabilities pins what the server advertises: tools only, the same
// as sdk/python's server (its test_mcp asserts the same object).
func TestCapabilities(t *testing.T) {
	_, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
	got, err := json.Marshal(cs.InitializeResult().Capabilities)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"tools":{}}`; string(got) != want {
		t.Errorf("capabilities = %s, want %s", got, want)
	}
}

// TestStdioAndHTTPAgree: the stdio server (vertal mcp) and the HTTP one
// (/mcp) answer initialize alike (protocol version, capabilities, server
// info, instructions) and list the same tools.
func TestStdioAndHTTPAgree(t *testing.T) {
	ctx := context.Background()
	_, api := newFakeAPI(t)
	opts := Options{Version: "test", Languages: testLanguages, Images: testImages}
	c, err := client.New(api.URL, "kubo_sk_alice", client.WithMaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() {
		_ = ServeStdio(ctx, c, inR, outW, opts)
		outW.Close()
	}()
	stdio, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdio.Close() })

	// The API server hands its languages over in configuration order;
	// vertal mcp reads them from /v1/languages, sorted by name.
	httpOpts := opts
	httpOpts.Languages = []client.Language{testLanguages[2], testLanguages[1], testLanguages[0]}
	mcpSrv := httptest.NewServer(HTTPHandler(HTTPOptions{Options: httpOpts, Backend: func(*http.Request) (Backend, error) { return ClientBackend(c), nil }}))
	t.Cleanup(mcpSrv.Close)
	remote, err := httpSession(t, mcpSrv.URL, "kubo_sk_alice")
	if err != nil {
		t.Fatal(err)
	}

	mcptest.Agree(t, stdio, remote)
	if init := stdio.InitializeResult(); init.Capabilities.Tools == nil {
		t.Errorf("stdio initialize: %+v, want the tools capability", init)
	}
}
