package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeSandboxes is a SandboxBackend keeping its sandboxes in memory. Its
// commands are a tiny language: "write NAME TEXT" writes a file, "cat
// NAME" prints one, "fail" exits 1.
type fakeSandboxes struct {
	mu      sync.Mutex
	next    int
	boxes   map[string]*fakeBox
	calls   []string
	creates []sandboxes.CreateRequest
}

// fakePlan is the plan of fakeSandboxes' caller: its sandboxes may reach
// pypi.org and *.pythonhosted.org.
var fakePlan = config.Plan{Egress: &config.Egress{Allow: []string{"pypi.org", "*.pythonhosted.org"}, MaxBytes: 1 << 20}}

// refusal is the service's error err as the API answers it (only the
// kinds NetworkFor gives).
func refusal(err error) *client.Error {
	var e *execution.Error
	if !errors.As(err, &e) {
		panic(err)
	}
	out := &client.Error{StatusCode: 400, Code: "invalid_request", Message: e.Msg, RequestID: "req_1"}
	if e.Kind == execution.KindForbidden {
		out.StatusCode, out.Code = 403, "forbidden"
	}
	return out
}

type fakeBox struct {
	sb    sandboxes.Sandbox
	files map[string][]byte
	vars  map[string]string // its code context's
	cells int
}

// refuse records a refused connection to each host, as the egress proxy
// refuses one off the list.
func (b *fakeBox) refuse(hosts []string) {
	for _, host := range hosts {
		if b.sb.Network != nil {
			b.sb.Network.Refused++
			b.sb.Network.Attempts = append(b.sb.Network.Attempts, egress.Attempt{Host: host, Port: 443, Kind: "tls", Reason: host + " is not in the allowlist"})
		}
	}
}

// RunCell is a context of one variable store: "NAME = VALUE" sets,
// "plot" shows a figure and a DataFrame, "raise" fails, and anything else
// is the value of that name.
func (f *fakeSandboxes) RunCell(_ context.Context, id string, req sandboxes.RunCodeRequest) (sandboxes.CodeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id, true)
	if err != nil {
		return sandboxes.CodeResult{}, err
	}
	if b.vars == nil {
		b.vars = map[string]string{}
	}
	b.cells++
	res := sandboxes.CodeResult{ContextID: "ctx_" + req.Language, Status: "succeeded", ExecutionCount: b.cells, DurationMS: 2}
	name, value, set := strings.Cut(req.Code, " = ")
	switch {
	case set:
		b.vars[name] = value
	case req.Code == "plot":
		res.Results = []sandboxes.CodeOutput{
			{Main: true, Data: map[string]string{"text/plain": "   a\n0  1", "text/html": "<table><tr><td>1</td></tr></table>"}},
			{Data: map[string]string{"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}},
		}
	case strings.HasPrefix(req.Code, "fetch "):
		b.refuse(strings.Fields(strings.TrimPrefix(req.Code, "fetch ")))
	case req.Code == "raise":
		res.Status = "failed"
		res.Error = &sandboxes.CodeError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"}
	default:
		res.Results = []sandboxes.CodeOutput{{Main: true, Data: map[string]string{"text/plain": b.vars[req.Code]}}}
	}
	return res, nil
}

func newFakeSandboxes() *fakeSandboxes { return &fakeSandboxes{boxes: map[string]*fakeBox{}} }

func (f *fakeSandboxes) RunCode(context.Context, RunRequest) (*client.Execution, error) {
	return nil, &client.Error{StatusCode: 503, Code: client.CodeOverloaded, Message: "not in this fake"}
}

func (f *fakeSandboxes) Usage(context.Context) (*client.Usage, error) {
	return nil, &client.Error{StatusCode: 503, Code: client.CodeOverloaded, Message: "not in this fake"}
}

func (f *fakeSandboxes) box(id string, running bool) (*fakeBox, error) {
	f.calls = append(f.calls, id)
	b, ok := f.boxes[id]
	if !ok {
		return nil, &client.Error{StatusCode: 404, Code: "not_found", Message: "sandbox " + id + " not found", RequestID: "req_1"}
	}
	if running && b.sb.Status == sandboxes.StatusEnded {
		return nil, &client.Error{StatusCode: 409, Code: "sandbox_not_running", Message: "sandbox " + id + " has ended (" + b.sb.Reason + ")", RequestID: "req_1"}
	}
	return b, nil
}

func (f *fakeSandboxes) CreateSandbox(_ context.Context, req sandboxes.CreateRequest) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, req)
	// The service's own check of the network, refused as the API does.
	nw, err := execution.NetworkFor(fakePlan, req.Network)
	if err != nil {
		return sandboxes.Sandbox{}, refusal(err)
	}
	f.next++
	img := req.Image
	if img == "" {
		img = "default"
	}
	onTimeout := req.OnTimeout
	if onTimeout == "" {
		onTimeout = "kill"
	}
	b := &fakeBox{files: map[string][]byte{}, sb: sandboxes.Sandbox{ID: fmt.Sprintf("sbx_%d", f.next), Status: sandboxes.StatusRunning,
		Image: img, CreatedAt: time.Unix(1e9, 0), ExpiresAt: time.Unix(1e9+300, 0), OnTimeout: onTimeout, Metadata: req.Metadata,
		Limits: sandboxes.Limits{Network: nw}}}
	if nw != nil {
		b.sb.Network = &sandboxes.NetworkUsage{}
	}
	for _, file := range req.Files {
		b.files[file.Path] = file.Content
	}
	f.boxes[b.sb.ID] = b
	return b.sb, nil
}

func (f *fakeSandboxes) RunCommand(_ context.Context, id string, req sandboxes.CommandRequest) (sandboxes.CommandResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id, true)
	if err != nil {
		return sandboxes.CommandResult{}, err
	}
	words := strings.SplitN(req.Cmd, " ", 3)
	res := sandboxes.CommandResult{PID: 7, Status: "succeeded", DurationMS: 3}
	switch {
	case words[0] == "write" && len(words) == 3:
		b.files[words[1]] = []byte(words[2])
	case words[0] == "fetch" && len(words) >= 2:
		// Each host is refused, as the egress proxy refuses one off
		// the list.
		b.refuse(strings.Fields(strings.TrimPrefix(req.Cmd, "fetch ")))
		res.Status, res.ExitCode, res.Stderr = "failed", 1, "fetch: 403 Forbidden\n"
	case words[0] == "cat" && len(words) == 2:
		content, ok := b.files[words[1]]
		if !ok {
			res.Status, res.ExitCode, res.Stderr = "failed", 1, "cat: "+words[1]+": No such file or directory\n"
		}
		res.Stdout = string(content)
	default:
		res.Status, res.ExitCode, res.Stderr = "failed", 127, "sh: "+words[0]+": not found\n"
	}
	return res, nil
}

func (f *fakeSandboxes) ReadFile(_ context.Context, id, path string, w io.Writer) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id, true)
	if err != nil {
		return 0, err
	}
	content, ok := b.files[path]
	if !ok {
		return 0, &client.Error{StatusCode: 404, Code: "not_found", Message: "no file " + path}
	}
	n, err := w.Write(content)
	return int64(n), err
}

func (f *fakeSandboxes) WriteFile(_ context.Context, id, path string, r io.Reader) (sandboxes.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id, true)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	content, err := io.ReadAll(r)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	b.files[path] = content
	return sandboxes.FileInfo{Name: filepath.Base(path), Path: "/home/user/" + path, Type: "file", Size: int64(len(content)), Mode: "0644"}, nil
}

func (f *fakeSandboxes) ListFiles(_ context.Context, id, path string) ([]sandboxes.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id, true)
	if err != nil {
		return nil, err
	}
	var out []sandboxes.FileInfo
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range b.files {
			if !yield(n) {
				return
			}
		}
	}) {
		out = append(out, sandboxes.FileInfo{Name: name, Path: path + "/" + name, Type: "file", Size: int64(len(b.files[name])), Mode: "0644"})
	}
	return out, nil
}

// GetSandbox answers the record as it is now, its attempts a copy.
func (f *fakeSandboxes) GetSandbox(_ context.Context, id string) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return sandboxes.Sandbox{}, &client.Error{StatusCode: 404, Code: "not_found", Message: "sandbox " + id + " not found"}
	}
	sb := b.sb
	if u := sb.Network; u != nil {
		nu := *u
		nu.Attempts = slices.Clone(u.Attempts)
		sb.Network = &nu
	}
	return sb, nil
}

func (f *fakeSandboxes) KillSandbox(_ context.Context, id string) (sandboxes.Sandbox, error) {
	return f.setStatus(id, sandboxes.StatusEnded)
}

func (f *fakeSandboxes) PauseSandbox(_ context.Context, id string) (sandboxes.Sandbox, error) {
	return f.setStatus(id, sandboxes.StatusPaused)
}

func (f *fakeSandboxes) ResumeSandbox(_ context.Context, id string) (sandboxes.Sandbox, error) {
	return f.setStatus(id, sandboxes.StatusRunning)
}

func (f *fakeSandboxes) setStatus(id string, st sandboxes.Status) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(id, st != sandboxes.StatusEnded)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	b.sb.Status = st
	if st == sandboxes.StatusEnded {
		b.sb.Reason = sandboxes.ReasonKilled
	}
	return b.sb, nil
}

func (f *fakeSandboxes) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// sandboxSession is an in-memory MCP session with a server whose every
// call gets backend b.
func sandboxSession(t *testing.T, b Backend) *mcp.ClientSession {
	t.Helper()
	tl := &tools{backendFor: func(context.Context, *mcp.CallToolRequest) (Backend, error) { return b, nil }, log: Options{}.logger()}
	return connect(t, newServer(tl, testLanguages, testImages, "test", true))
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mustOK fails t unless res is a successful result, and returns its text.
func mustOK(t *testing.T, name string, res *mcp.CallToolResult) string {
	t.Helper()
	if res.IsError {
		t.Fatalf("%s: tool error: %s", name, text(res))
	}
	return text(res)
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

var sandboxToolNames = []string{"create_sandbox", "kill_sandbox", "list_files", "pause_sandbox", "read_file", "resume_sandbox", "run_command", "write_file"}

// Over HTTP, a caller whose Backend serves sandboxes gets their tools;
// one whose Backend does not, on the same handler, gets today's two.
func TestSandboxToolsListedOnlyWithSandboxBackend(t *testing.T) {
	_, api := newFakeAPI(t)
	fake := newFakeSandboxes()
	h := HTTPHandler(HTTPOptions{Options: Options{Languages: testLanguages, Images: testImages}, Backend: func(r *http.Request) (Backend, error) {
		key, _ := bearerKey(r.Header.Get("Authorization"))
		if key == "kubo_sk_sandboxes" {
			return fake, nil
		}
		c, err := client.New(api.URL+"/api", key, client.WithMaxRetries(0))
		return ClientBackend(c), err
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()

	plain, err := httpSession(t, srv.URL, "kubo_sk_alice")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"get_usage", "run_code"}, toolNames(t, plain)); diff != "" {
		t.Errorf("tools without sandboxes (-want +got):\n%s", diff)
	}
	if strings.Contains(plain.InitializeResult().Instructions, "create_sandbox") {
		t.Errorf("instructions without sandboxes mention create_sandbox: %s", plain.InitializeResult().Instructions)
	}
	// A sandbox tool called anyway is unknown there.
	if _, err := plain.CallTool(context.Background(), &mcp.CallToolParams{Name: "create_sandbox", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("create_sandbox without sandboxes: %v", err)
	}

	sbx, err := httpSession(t, srv.URL, "kubo_sk_sandboxes")
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(append([]string{"get_usage", "run_code"}, sandboxToolNames...)))
	if diff := cmp.Diff(want, toolNames(t, sbx)); diff != "" {
		t.Errorf("tools with sandboxes (-want +got):\n%s", diff)
	}
	if !strings.Contains(sbx.InitializeResult().Instructions, "create_sandbox") {
		t.Errorf("instructions with sandboxes do not mention create_sandbox")
	}
	created := call(t, sbx, "create_sandbox", map[string]any{})
	if id := mustOK(t, "create_sandbox", created); !strings.Contains(id, "sandbox_id: sbx_1\n") {
		t.Errorf("create_sandbox over HTTP: %s", id)
	}
}

// The stdio server calls the API through the Go SDK and lists no sandbox
// tools (testdata/tools.golden.json holds its list).
func TestStdioListsNoSandboxTools(t *testing.T) {
	_, srv := newFakeAPI(t)
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
	if diff := cmp.Diff([]string{"get_usage", "run_code"}, toolNames(t, cs)); diff != "" {
		t.Errorf("stdio tools (-want +got):\n%s", diff)
	}
}

func TestSandboxToolsGolden(t *testing.T) {
	cs := sandboxSession(t, newFakeSandboxes())
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var tools []*mcp.Tool
	for _, tl := range res.Tools {
		if slices.Contains(sandboxToolNames, tl.Name) {
			tools = append(tools, tl)
		}
	}
	got, err := json.MarshalIndent(tools, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "sandbox_tools.golden.json", got, "")
}

func TestSandboxToolsKeepState(t *testing.T) {
	fake := newFakeSandboxes()
	cs := sandboxSession(t, fake)

	created := call(t, cs, "create_sandbox", map[string]any{"metadata": map[string]any{"task": "t1"},
		"files": []any{map[string]any{"path": "seed.txt", "content": "c2VlZA==", "encoding": "base64"}}})
	out := mustOK(t, "create_sandbox", created)
	for _, want := range []string{"sandbox_id: sbx_1\n", "status: running\n", "image: default\n", "home: /home/user\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("create_sandbox text lacks %q:\n%s", want, out)
		}
	}
	if sc, _ := created.StructuredContent.(map[string]any); sc["id"] != "sbx_1" || sc["status"] != "running" {
		t.Errorf("create_sandbox structured content: %+v", created.StructuredContent)
	}

	// A command's effect is there for the next one.
	mustOK(t, "run_command", call(t, cs, "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "write notes.txt hello there"}))
	res := call(t, cs, "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "cat notes.txt"})
	if out := mustOK(t, "run_command", res); !strings.Contains(out, "status: succeeded\nexit_code: 0\n") || !strings.Contains(out, "--- stdout ---\nhello there\n--- stderr ---\n(empty)\n") {
		t.Errorf("run_command text:\n%s", out)
	}
	if sc, _ := res.StructuredContent.(map[string]any); sc["stdout"] != "hello there" || sc["exit_code"] != float64(0) {
		t.Errorf("run_command structured content: %+v", res.StructuredContent)
	}
	// So are the files given at creation and written with write_file.
	if out := mustOK(t, "read_file", call(t, cs, "read_file", map[string]any{"sandbox_id": "sbx_1", "path": "seed.txt"})); out != "seed" {
		t.Errorf("read_file seed.txt = %q", out)
	}
	if out := mustOK(t, "write_file", call(t, cs, "write_file", map[string]any{"sandbox_id": "sbx_1", "path": "main.py", "content": "print(1)\n"})); !strings.Contains(out, "wrote /home/user/main.py (9 bytes") {
		t.Errorf("write_file text: %s", out)
	}
	if out := mustOK(t, "run_command", call(t, cs, "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "cat main.py"})); !strings.Contains(out, "\nprint(1)\n") {
		t.Errorf("main.py through run_command:\n%s", out)
	}
	ls := call(t, cs, "list_files", map[string]any{"sandbox_id": "sbx_1"})
	if out := mustOK(t, "list_files", ls); !strings.Contains(out, "/home/user: 3 entries\n") || !strings.Contains(out, " main.py\n") {
		t.Errorf("list_files text:\n%s", out)
	}
	if sc, _ := ls.StructuredContent.(map[string]any); len(sc["files"].([]any)) != 3 {
		t.Errorf("list_files structured content: %+v", ls.StructuredContent)
	}

	// A failing command is a tool error that carries its output.
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "cat missing"})
	if !res.IsError || !strings.Contains(text(res), "exit_code: 1\n") || !strings.Contains(text(res), "No such file") {
		t.Errorf("failing command: %v %s", res.IsError, text(res))
	}

	if out := mustOK(t, "pause_sandbox", call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": "sbx_1"})); !strings.Contains(out, "status: paused\n") {
		t.Errorf("pause_sandbox: %s", out)
	}
	if out := mustOK(t, "resume_sandbox", call(t, cs, "resume_sandbox", map[string]any{"sandbox_id": "sbx_1"})); !strings.Contains(out, "status: running\n") {
		t.Errorf("resume_sandbox: %s", out)
	}
	if out := mustOK(t, "kill_sandbox", call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": "sbx_1"})); !strings.Contains(out, "status: ended\nreason: killed\n") {
		t.Errorf("kill_sandbox: %s", out)
	}

	// The service's refusals come back as tool errors with its message.
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "cat notes.txt"},
			"Vertal Run API error sandbox_not_running: sandbox sbx_1 has ended (killed) (HTTP 409, request id req_1). The sandbox has ended (killed, expired or failed) and keeps nothing; call create_sandbox"},
		{"read_file", map[string]any{"sandbox_id": "sbx_9", "path": "a"},
			"Vertal Run API error not_found: sandbox sbx_9 not found (HTTP 404, request id req_1)."},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.HasPrefix(text(res), tc.want) {
			t.Errorf("%s %v: %v %q, want an error starting %q", tc.tool, tc.args, res.IsError, text(res), tc.want)
		}
	}
}

func TestReadFileBinaryAndLong(t *testing.T) {
	fake := newFakeSandboxes()
	cs := sandboxSession(t, fake)
	mustOK(t, "create_sandbox", call(t, cs, "create_sandbox", nil))
	fake.boxes["sbx_1"].files["bin"] = []byte{0xff, 0x00, 0x01}
	// Long text whose cut falls inside a two-byte character.
	fake.boxes["sbx_1"].files["long"] = append(bytes.Repeat([]byte("a"), readFileCap-1), bytes.Repeat([]byte("é"), 10)...)

	res := call(t, cs, "read_file", map[string]any{"sandbox_id": "sbx_1", "path": "bin"})
	if out := mustOK(t, "read_file", res); !strings.HasPrefix(out, "/wAB") || !strings.Contains(out, "base64-encoded") {
		t.Errorf("binary read_file: %q", out)
	}
	if sc, _ := res.StructuredContent.(map[string]any); sc["encoding"] != "base64" || sc["content"] != "/wAB" || sc["size"] != float64(3) {
		t.Errorf("binary structured content: %+v", res.StructuredContent)
	}

	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "sbx_1", "path": "long"})
	mustOK(t, "read_file", res)
	if got := res.Content[0].(*mcp.TextContent).Text; got != strings.Repeat("a", readFileCap-1) {
		t.Errorf("long read_file content: %d bytes", len(got))
	}
	if note := res.Content[1].(*mcp.TextContent).Text; !strings.Contains(note, fmt.Sprintf("the file has %d bytes", readFileCap-1+20)) {
		t.Errorf("long read_file note: %s", note)
	}
	if sc, _ := res.StructuredContent.(map[string]any); sc["encoding"] != "utf8" || sc["truncated"] != true {
		t.Errorf("long structured content: %+v", res.StructuredContent)
	}
}

// create_sandbox's network reaches the service as the API's "network"
// would (left out or null: the plan's list; []: none; a list: narrowed),
// the record says what the sandbox may reach, and a host beyond the plan
// is refused with the plan's list in the message, as run_code's is.
func TestCreateSandboxNetwork(t *testing.T) {
	for _, tc := range []struct {
		name      string
		network   any // nil: the argument left out
		want      *execution.NetworkRequest
		wantError bool
		wantText  []string
		wantLimit any // structured limits.network; nil: none
		wantNot   string
	}{
		{name: "left out is the plan's list", want: nil,
			wantText:  []string{"network: allowed pypi.org, *.pythonhosted.org (at most 1048576 bytes in all); connections: 0 made, 0 refused; bytes: 0 in, 0 out\n"},
			wantLimit: map[string]any{"allow": []any{"pypi.org", "*.pythonhosted.org"}, "max_bytes": 1048576.0}},
		{name: "null is the plan's list", network: json.RawMessage("null"), want: nil,
			wantText:  []string{"network: allowed pypi.org, *.pythonhosted.org"},
			wantLimit: map[string]any{"allow": []any{"pypi.org", "*.pythonhosted.org"}, "max_bytes": 1048576.0}},
		{name: "[] is none", network: []any{}, want: &execution.NetworkRequest{Allow: []string{}},
			wantText: []string{"network: none\n"}},
		{name: "a list narrows the plan's", network: []any{"pypi.org"}, want: &execution.NetworkRequest{Allow: []string{"pypi.org"}},
			wantText:  []string{"network: allowed pypi.org (at most 1048576 bytes in all)"},
			wantLimit: map[string]any{"allow": []any{"pypi.org"}, "max_bytes": 1048576.0}},
		{name: "a host beyond the plan is refused", network: []any{"pypi.org", "evil.example"},
			want: &execution.NetworkRequest{Allow: []string{"pypi.org", "evil.example"}}, wantError: true,
			wantText: []string{"Vertal Run API error forbidden: ", "evil.example", "pypi.org", "*.pythonhosted.org", "(HTTP 403, request id req_1).", "leave network out for the plan's whole list"}},
		{name: "a malformed rule is refused, without the plan's hint", network: []any{"http://pypi.org/"},
			want: &execution.NetworkRequest{Allow: []string{"http://pypi.org/"}}, wantError: true,
			wantText: []string{"Vertal Run API error invalid_request: network.allow", "(HTTP 400"},
			wantNot:  "egress allowlist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFakeSandboxes()
			args := map[string]any{}
			if tc.network != nil {
				args["network"] = tc.network
			}
			res := call(t, sandboxSession(t, fake), "create_sandbox", args)
			if res.IsError != tc.wantError {
				t.Errorf("IsError = %v, want %v: %s", res.IsError, tc.wantError, text(res))
			}
			for _, w := range tc.wantText {
				if !strings.Contains(text(res), w) {
					t.Errorf("text lacks %q:\n%s", w, text(res))
				}
			}
			if tc.wantNot != "" && strings.Contains(text(res), tc.wantNot) {
				t.Errorf("text has %q:\n%s", tc.wantNot, text(res))
			}
			if len(fake.creates) != 1 {
				t.Fatalf("%d creates reached the backend, want 1", len(fake.creates))
			}
			if diff := cmp.Diff(tc.want, fake.creates[0].Network); diff != "" {
				t.Errorf("CreateRequest.Network (-want +got):\n%s", diff)
			}
			if tc.wantError {
				return
			}
			sc, _ := res.StructuredContent.(map[string]any)
			limits, _ := sc["limits"].(map[string]any)
			if diff := cmp.Diff(tc.wantLimit, limits["network"]); diff != "" {
				t.Errorf("structured limits.network (-want +got):\n%s", diff)
			}
			if usage, ok := sc["network"].(map[string]any); (tc.wantLimit != nil) != ok || ok && usage["attempts"] == nil {
				t.Errorf("structured network = %v, want usage with attempts only with a network", sc["network"])
			}
		})
	}
}

// Over the Go SDK (vertal mcp), create_sandbox sends its network as the
// API's "network" and reads the sandbox's back from the record; the
// API's refusal comes back with what to do.
func TestStdioCreateSandboxNetwork(t *testing.T) {
	for _, tc := range []struct {
		name      string
		network   any // nil: the argument left out
		wantBody  any // the request's "network"; nil: left out
		wantError bool
		wantText  string
		wantLimit any // structured limits.network
	}{
		{name: "left out", wantText: "network: allowed pypi.org, *.pythonhosted.org (at most 1048576 bytes in all); connections: 0 made",
			wantLimit: map[string]any{"allow": []any{"pypi.org", "*.pythonhosted.org"}, "max_bytes": 1048576.0}},
		{name: "none", network: []any{}, wantBody: map[string]any{"allow": []any{}}, wantText: "network: none\n"},
		{name: "narrowed", network: []any{"*.pythonhosted.org"}, wantBody: map[string]any{"allow": []any{"*.pythonhosted.org"}},
			wantText: "network: allowed *.pythonhosted.org (", wantLimit: map[string]any{"allow": []any{"*.pythonhosted.org"}, "max_bytes": 1048576.0}},
		{name: "beyond the plan", network: []any{"evil.example"}, wantBody: map[string]any{"allow": []any{"evil.example"}}, wantError: true,
			wantText: `(HTTP 403, request id req_n). The network argument may list only`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, srv := newFakeAPI(t)
			f.sandboxes = true
			args := map[string]any{}
			if tc.network != nil {
				args["network"] = tc.network
			}
			res := call(t, connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages)), "create_sandbox", args)
			if res.IsError != tc.wantError || !strings.Contains(text(res), tc.wantText) {
				t.Errorf("IsError %v, text:\n%s\nwant IsError %v and %q", res.IsError, text(res), tc.wantError, tc.wantText)
			}
			if len(f.creates) != 1 {
				t.Fatalf("%d creates reached the API, want 1", len(f.creates))
			}
			if diff := cmp.Diff(tc.wantBody, f.creates[0]["network"]); diff != "" {
				t.Errorf("the request's network (-want +got):\n%s", diff)
			}
			if !tc.wantError {
				sc, _ := res.StructuredContent.(map[string]any)
				limits, _ := sc["limits"].(map[string]any)
				if diff := cmp.Diff(tc.wantLimit, limits["network"]); diff != "" {
					t.Errorf("structured limits.network (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// A server built with the sandbox tools whose caller's Backend does not
// serve sandboxes refuses them as a tool error.
func TestSandboxToolWithoutSandboxBackend(t *testing.T) {
	_, api := newFakeAPI(t)
	c, err := client.New(api.URL+"/api", "kubo_sk_alice", client.WithMaxRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	cs := sandboxSession(t, ClientBackend(c))
	res := call(t, cs, "create_sandbox", nil)
	if !res.IsError || !strings.Contains(text(res), "does not offer sandboxes") {
		t.Errorf("create_sandbox: %v %s", res.IsError, text(res))
	}
}

// Bad arguments are refused with a clear tool error before the backend is
// called.
func TestSandboxToolArguments(t *testing.T) {
	fake := newFakeSandboxes()
	cs := sandboxSession(t, fake)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"cmd": "ls"}, "argument sandbox_id is required"},
		{"run_command", map[string]any{"sandbox_id": "sbx_1"}, "argument cmd is required"},
		{"run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "ls", "timeout_s": 0}, "argument timeout_s must be at least 1"},
		{"run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "ls", "shell": "zsh"}, `unknown field "shell"`},
		{"run_command", map[string]any{"sandbox_id": 7, "cmd": "ls"}, "invalid arguments"},
		{"read_file", map[string]any{"sandbox_id": "sbx_1"}, "argument path is required"},
		{"write_file", map[string]any{"sandbox_id": "sbx_1", "path": "a"}, "argument content is required"},
		{"write_file", map[string]any{"sandbox_id": "sbx_1", "path": "a", "content": "!!", "encoding": "base64"}, "argument content is not valid base64"},
		{"write_file", map[string]any{"sandbox_id": "sbx_1", "path": "a", "content": "x", "encoding": "latin1"}, "must be utf8 or base64"},
		{"list_files", map[string]any{}, "argument sandbox_id is required"},
		{"kill_sandbox", nil, "argument sandbox_id is required"},
		{"create_sandbox", map[string]any{"timeout_s": 0}, "argument timeout_s must be at least 1"},
		{"create_sandbox", map[string]any{"on_timeout": "sleep"}, "argument on_timeout must be kill or pause"},
		{"create_sandbox", map[string]any{"files": []any{map[string]any{"content": "x"}}}, "argument files[0].path is required"},
		{"create_sandbox", map[string]any{"network": "pypi.org"}, "invalid arguments"},
		{"create_sandbox", map[string]any{"network": []any{7}}, "invalid arguments"},
	} {
		res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%s %v: %v %q, want an error with %q", tc.tool, tc.args, res.IsError, text(res), tc.want)
		}
	}
	if seen := fake.seen(); len(seen) != 0 || len(fake.boxes) != 0 {
		t.Errorf("the backend was called: %v, %d sandboxes", seen, len(fake.boxes))
	}
	// An empty file is content "".
	mustOK(t, "create_sandbox", call(t, cs, "create_sandbox", nil))
	mustOK(t, "write_file", call(t, cs, "write_file", map[string]any{"sandbox_id": "sbx_1", "path": "empty", "content": ""}))
}

// TestRunCodeCells: run_code with a sandbox_id runs cells that keep state;
// a DataFrame comes back as HTML beside its text, a figure as an image, an
// exception as a tool error with its traceback.
func TestRunCodeCells(t *testing.T) {
	fake := newFakeSandboxes()
	cs := sandboxSession(t, fake)
	mustOK(t, "create_sandbox", call(t, cs, "create_sandbox", nil))
	cell := func(code string, extra ...any) *mcp.CallToolResult {
		args := map[string]any{"sandbox_id": "sbx_1", "language": "python", "code": code}
		for i := 0; i < len(extra); i += 2 {
			args[extra[i].(string)] = extra[i+1]
		}
		return call(t, cs, "run_code", args)
	}
	mustOK(t, "run_code", cell("x = 41"))
	res := cell("x")
	out := mustOK(t, "run_code", res)
	if !strings.Contains(out, "context_id: ctx_python\nexecution_count: 2\n") || !strings.Contains(out, "--- result ---\n41\n") {
		t.Errorf("cell text:\n%s", out)
	}
	if sc, _ := res.StructuredContent.(map[string]any); sc["context_id"] != "ctx_python" || sc["exit_code"] != float64(0) || sc["sandbox_id"] != "sbx_1" {
		t.Errorf("cell structured content: %+v", res.StructuredContent)
	}
	res = cell("plot")
	mustOK(t, "run_code", res)
	var image *mcp.ImageContent
	var html *mcp.EmbeddedResource
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.ImageContent:
			image = c
		case *mcp.EmbeddedResource:
			html = c
		}
	}
	if image == nil || image.MIMEType != "image/png" || string(image.Data[:4]) != "\x89PNG" {
		t.Errorf("figure content: %+v", image)
	}
	if html == nil || html.Resource.MIMEType != "text/html" || !strings.Contains(html.Resource.Text, "<table>") || !strings.HasPrefix(html.Resource.URI, "vertal://sandboxes/sbx_1/contexts/ctx_python/results/") {
		t.Errorf("html content: %+v", html)
	}
	if sc, _ := res.StructuredContent.(map[string]any); strings.Contains(fmt.Sprint(sc["results"]), "iVBOR") {
		t.Errorf("structured results carry the image: %v", sc["results"])
	}
	res = cell("raise")
	if !res.IsError || !strings.Contains(text(res), "--- error: ZeroDivisionError ---\nTraceback") {
		t.Errorf("raise: %v %s", res.IsError, text(res))
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"sandbox_id": "sbx_1", "language": "python", "code": "1", "files": []any{map[string]any{"path": "a", "content": "b"}}}, "do not apply"},
		{map[string]any{"sandbox_id": "sbx_1", "language": "python", "code": "1", "network": []any{}}, "do not apply"},
		{map[string]any{"context_id": "ctx_1", "language": "python", "code": "1"}, "needs sandbox_id"},
		{map[string]any{"sandbox_id": "sbx_9", "language": "python", "code": "1"}, "not found"},
	} {
		if res := call(t, cs, "run_code", tc.args); !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("%v: %v %s", tc.args, res.IsError, text(res))
		}
	}
	// Without sandboxes there is nothing to run a cell in.
	plain := connect(t, newServer(&tools{backendFor: func(context.Context, *mcp.CallToolRequest) (Backend, error) { return noSandboxes{}, nil }, log: Options{}.logger()}, testLanguages, testImages, "test", false))
	if res := call(t, plain, "run_code", map[string]any{"sandbox_id": "sbx_1", "language": "python", "code": "1"}); !res.IsError || !strings.Contains(text(res), "does not offer sandboxes") {
		t.Errorf("cell without sandboxes: %s", text(res))
	}
}

type noSandboxes struct{}

func (noSandboxes) RunCode(context.Context, RunRequest) (*client.Execution, error) { return nil, nil }
func (noSandboxes) Usage(context.Context) (*client.Usage, error)                   { return nil, nil }

// With an API that has sandboxes, the stdio server lists every tool, and
// run_code takes sandbox_id and context_id. The Python stdio server
// (sdk/python/vertal2kubo/mcp.py) renders the same list from the same
// languages and images; its test reads this golden file.
func TestStdioToolsWithSandboxesGolden(t *testing.T) {
	f, srv := newFakeAPI(t)
	f.sandboxes = true
	cs := connect(t, stdioServer(t, srv.URL, "kubo_sk_alice", testLanguages))
	checkGolden(t, "stdio_sandbox_tools.golden.json", toolsJSON(t, cs), " and update the Python server too")
	init := cs.InitializeResult()
	if !strings.Contains(init.Instructions, "create_sandbox") {
		t.Errorf("instructions of a stdio server with sandboxes: %q", init.Instructions)
	}
}

// The Python stdio server ships the sandbox tools' definitions as package
// data; they must be this server's, byte for byte in meaning.
func TestPythonSandboxToolsMatch(t *testing.T) {
	var golden, python any
	for path, dst := range map[string]*any{
		filepath.Join("testdata", "sandbox_tools.golden.json"):                          &golden,
		filepath.Join("..", "..", "sdk", "python", "vertal2kubo", "sandbox_tools.json"): &python,
	} {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	if diff := cmp.Diff(golden, python); diff != "" {
		t.Errorf("sdk/python/vertal2kubo/sandbox_tools.json differs from testdata/sandbox_tools.golden.json; copy it (-golden +python):\n%s", diff)
	}
}

// Argument names match exactly, as the schemas' additionalProperties:
// false says (encoding/json alone would take NETWORK for network), and a
// value of the wrong type is refused in the argument's words, not Go's.
func TestArgumentNamesAndTypes(t *testing.T) {
	fake := newFakeSandboxes()
	cs := sandboxSession(t, fake)
	run := func(extra map[string]any) map[string]any {
		args := map[string]any{"language": "python", "code": "1"}
		maps.Copy(args, extra)
		return args
	}
	cmd := func(extra map[string]any) map[string]any {
		args := map[string]any{"sandbox_id": "sbx_1", "cmd": "ls"}
		maps.Copy(args, extra)
		return args
	}
	for _, tc := range []struct {
		name string
		tool string
		args map[string]any
		want string // the whole text
	}{
		{"an argument in capitals", "create_sandbox", map[string]any{"NETWORK": []any{"allowed.test"}}, `invalid arguments: json: unknown field "NETWORK"`},
		{"a second spelling of network", "create_sandbox", map[string]any{"network": []any{}, "Network": nil}, `invalid arguments: json: unknown field "Network"`},
		{"run_code's network in capitals", "run_code", run(map[string]any{"Network": []any{"allowed.test"}}), `invalid arguments: json: unknown field "Network"`},
		{"run_command's cmd in capitals", "run_command", map[string]any{"sandbox_id": "sbx_1", "CMD": "ls"}, `invalid arguments: json: unknown field "CMD"`},
		{"kill_sandbox's id in capitals", "kill_sandbox", map[string]any{"Sandbox_ID": "sbx_1"}, `invalid arguments: json: unknown field "Sandbox_ID"`},
		{"a file's path in capitals", "create_sandbox", map[string]any{"files": []any{map[string]any{"PATH": "a", "content": "x"}}}, `invalid arguments: json: unknown field "PATH"`},
		{"env a number", "create_sandbox", map[string]any{"env": 5}, "invalid arguments: env must be an object of strings"},
		{"env a number in run_command", "run_command", cmd(map[string]any{"env": 5}), "invalid arguments: env must be an object of strings"},
		{"an env value a number", "run_code", run(map[string]any{"env": map[string]any{"A": 1}}), `invalid arguments: env["A"] must be a string`},
		{"an env value null", "create_sandbox", map[string]any{"env": map[string]any{"A": nil}}, `invalid arguments: env["A"] must be a string`},
		{"timeout_s a string", "create_sandbox", map[string]any{"timeout_s": "60"}, "invalid arguments: timeout_s must be an integer"},
		{"run_code's timeout_s a string", "run_code", run(map[string]any{"timeout_s": "60"}), "invalid arguments: timeout_s must be a number"},
		{"sandbox_id a number", "run_command", map[string]any{"sandbox_id": 7, "cmd": "ls"}, "invalid arguments: sandbox_id must be a string"},
		{"files an object", "create_sandbox", map[string]any{"files": map[string]any{}}, "invalid arguments: files must be an array of objects"},
		{"a file a string", "run_code", run(map[string]any{"files": []any{"a"}}), "invalid arguments: files[0] must be an object"},
		{"a file's content a number", "create_sandbox", map[string]any{"files": []any{map[string]any{"path": "a", "content": 1}}}, "invalid arguments: files[0].content must be a string"},
		{"args with null", "run_code", run(map[string]any{"args": []any{"a", nil}}), "invalid arguments: args[1] must be a string"},
		{"network a string", "create_sandbox", map[string]any{"network": "pypi.org"},
			`invalid arguments: network must be a list of rules (strings such as "pypi.org"), [] for no network, or left out for the plan's whole list`},
		{"network with null", "create_sandbox", map[string]any{"network": []any{"allowed.test", nil}}, "invalid arguments: network[1] must be a string"},
		{"run_code's network with a number", "run_code", run(map[string]any{"network": []any{7}}), "invalid arguments: network[0] must be a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, cs, tc.tool, tc.args)
			if !res.IsError || text(res) != tc.want {
				t.Errorf("%s %v: IsError %v, text %q; want an error saying %q", tc.tool, tc.args, res.IsError, text(res), tc.want)
			}
		})
	}
	if seen := fake.seen(); len(seen) != 0 || len(fake.boxes) != 0 {
		t.Errorf("the backend was called: %v, %d sandboxes", seen, len(fake.boxes))
	}
}

// After run_command, and run_code with a sandbox_id, in a sandbox with a
// network, the result names the connections refused while it ran (the
// newest five), not those refused before.
func TestRefusedWhileItRan(t *testing.T) {
	fake := newFakeSandboxes()
	cs := sandboxSession(t, fake)
	mustOK(t, "create_sandbox", call(t, cs, "create_sandbox", map[string]any{"network": []any{"pypi.org"}})) // sbx_1
	mustOK(t, "create_sandbox", call(t, cs, "create_sandbox", map[string]any{"network": []any{}}))           // sbx_2, no network
	mustOK(t, "create_sandbox", call(t, cs, "create_sandbox", map[string]any{"network": []any{"pypi.org"}})) // sbx_3
	refused := func(hosts ...string) string {
		var b strings.Builder
		for _, h := range hosts {
			fmt.Fprintf(&b, "refused: %s:443 (tls): %s is not in the allowlist\n", h, h)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name string
		tool string
		args map[string]any
		want string // "" : no network line
	}{
		{"one refused", "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "fetch a.test"},
			"sandbox_id: sbx_1\nnetwork: 1 connection(s) refused while it ran\n" + refused("a.test") + "--- stdout ---"},
		{"only this command's", "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "fetch b.test c.test"},
			"network: 2 connection(s) refused while it ran\n" + refused("b.test", "c.test") + "--- stdout ---"},
		{"the newest five of seven", "run_command", map[string]any{"sandbox_id": "sbx_1", "cmd": "fetch 1.test 2.test 3.test 4.test 5.test 6.test 7.test"},
			"network: 7 connection(s) refused while it ran; the newest 5:\n" + refused("3.test", "4.test", "5.test", "6.test", "7.test") + "--- stdout ---"},
		{"none refused", "run_command", map[string]any{"sandbox_id": "sbx_3", "cmd": "cat nothing"}, ""},
		{"no network", "run_command", map[string]any{"sandbox_id": "sbx_2", "cmd": "fetch a.test"}, ""},
		{"a cell", "run_code", map[string]any{"sandbox_id": "sbx_3", "language": "python", "code": "x"}, ""},
		{"a cell that fetched", "run_code", map[string]any{"sandbox_id": "sbx_3", "language": "python", "code": "fetch d.test"},
			"duration_ms: 2\nnetwork: 1 connection(s) refused while it ran\n" + refused("d.test") + "--- stdout ---"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := text(call(t, cs, tc.tool, tc.args))
			if tc.want == "" && strings.Contains(got, "network:") || !strings.Contains(got, tc.want) {
				t.Errorf("text:\n%s\nwant it to hold %q", got, tc.want)
			}
		})
	}
}
