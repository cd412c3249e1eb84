package api

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// mcpFakeSandboxes is an MCPSandboxes with one sandbox, sbx_1, of tenant
// acme; it notes the tenant of each call.
type mcpFakeSandboxes struct {
	mu       sync.Mutex
	tenants  []string
	networks []*sandboxes.NetworkRequest // of each create
}

func (f *mcpFakeSandboxes) saw(c execution.Caller, id string) error {
	f.mu.Lock()
	f.tenants = append(f.tenants, c.Key.Tenant)
	f.mu.Unlock()
	if id != "sbx_1" || c.Key.Tenant != "acme" {
		return execution.Errorf(execution.KindNotFound, "sandbox %s not found", id)
	}
	return nil
}

// Create checks the request's network against the caller's plan as the
// service does.
func (f *mcpFakeSandboxes) Create(_ context.Context, c execution.Caller, _ string, r sandboxes.CreateRequest) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	f.networks = append(f.networks, r.Network)
	f.mu.Unlock()
	nw, err := execution.NetworkFor(c.Plan, r.Network)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	return sandboxes.Sandbox{ID: "sbx_1", Status: sandboxes.StatusRunning, Image: r.Image, Limits: sandboxes.Limits{Network: nw}}, f.saw(c, "sbx_1")
}

func (f *mcpFakeSandboxes) record(c execution.Caller, id string, st sandboxes.Status) (sandboxes.Sandbox, error) {
	if err := f.saw(c, id); err != nil {
		return sandboxes.Sandbox{}, err
	}
	return sandboxes.Sandbox{ID: id, Status: st}, nil
}

func (f *mcpFakeSandboxes) Get(_ context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	return f.record(c, id, sandboxes.StatusRunning)
}

func (f *mcpFakeSandboxes) Kill(_ context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	return f.record(c, id, sandboxes.StatusEnded)
}

func (f *mcpFakeSandboxes) Pause(_ context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	return f.record(c, id, sandboxes.StatusPaused)
}

func (f *mcpFakeSandboxes) Resume(_ context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	return f.record(c, id, sandboxes.StatusRunning)
}

func (f *mcpFakeSandboxes) Run(_ context.Context, c execution.Caller, id string, r sandboxes.CommandRequest, _ func(sandboxes.Event)) (sandboxes.CommandResult, error) {
	if err := f.saw(c, id); err != nil {
		return sandboxes.CommandResult{}, err
	}
	return sandboxes.CommandResult{Status: "succeeded", Stdout: "ran " + r.Cmd}, nil
}

func (f *mcpFakeSandboxes) ListDir(_ context.Context, c execution.Caller, id, _ string) ([]sandboxes.FileInfo, error) {
	return nil, f.saw(c, id)
}

func (f *mcpFakeSandboxes) ReadFile(_ context.Context, c execution.Caller, id, _ string, w io.Writer) (int64, error) {
	if err := f.saw(c, id); err != nil {
		return 0, err
	}
	n, err := io.WriteString(w, "file text")
	return int64(n), err
}

func (f *mcpFakeSandboxes) WriteFile(_ context.Context, c execution.Caller, id, path string, r io.Reader) (sandboxes.FileInfo, error) {
	if err := f.saw(c, id); err != nil {
		return sandboxes.FileInfo{}, err
	}
	n, err := io.Copy(io.Discard, r)
	return sandboxes.FileInfo{Path: path, Size: n}, err
}

// TestMCPSandboxTools: with the sandboxes service, /mcp lists the sandbox
// tools and calls the service as the caller the key check found; its
// refusals come back as tool errors through the error table. Without it,
// the tools are not listed.
func TestMCPSandboxTools(t *testing.T) {
	hdr := map[string]string{"Accept": "application/json, text/event-stream"}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	opts := mcpserver.Options{Languages: []client.Language{{Name: "python"}}}

	plain := newEnv(t, withMCP(opts))
	if r := plain.do(request{method: "POST", path: "/mcp", body: list, header: hdr}); r.status != 200 || strings.Contains(string(r.body), "create_sandbox") {
		t.Errorf("tools/list without sandboxes: %d %s", r.status, r.body)
	}

	fake := &mcpFakeSandboxes{}
	env := newEnv(t, withMCP(opts), func(c *envConfig) { c.mcpSandboxes = fake })
	if r := env.do(request{method: "POST", path: "/mcp", body: list, header: hdr}); r.status != 200 || !strings.Contains(string(r.body), `"name":"run_command"`) {
		t.Errorf("tools/list with sandboxes: %d %s", r.status, r.body)
	}
	for _, tc := range []struct{ msg, want string }{
		{`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_sandbox","arguments":{"image":"default"}}}`, `sandbox_id: sbx_1\n`},
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run_command","arguments":{"sandbox_id":"sbx_1","cmd":"ls"}}}`, `ran ls`},
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"read_file","arguments":{"sandbox_id":"sbx_1","path":"a.txt"}}}`, `"content":"file text"`},
		{`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"write_file","arguments":{"sandbox_id":"sbx_1","path":"a.txt","content":"abc"}}}`, `wrote a.txt (3 bytes`},
		{`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"kill_sandbox","arguments":{"sandbox_id":"sbx_1"}}}`, `status: ended`},
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_command","arguments":{"sandbox_id":"sbx_2","cmd":"ls"}}}`,
			`"text":"Vertal Run API error not_found: sandbox sbx_2 not found (HTTP 404, request id req_`},
	} {
		r := env.do(request{method: "POST", path: "/mcp", body: tc.msg, header: hdr})
		if r.status != 200 || !strings.Contains(string(r.body), tc.want) {
			t.Errorf("%s: %d %s, want %s", tc.msg, r.status, r.body, tc.want)
		}
	}
	if r := env.do(request{method: "POST", path: "/mcp", body: `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"list_files","arguments":{"sandbox_id":"sbx_2"}}}`, header: hdr}); !strings.Contains(string(r.body), `"isError":true`) {
		t.Errorf("list_files of an unknown sandbox is no tool error: %s", r.body)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	// 7 tool calls, and each run_command's read of its sandbox's record
	// (for the connections refused while it ran).
	if len(fake.tenants) != 9 {
		t.Errorf("service calls: %v, want 9", fake.tenants)
	}
	for _, tenant := range fake.tenants {
		if tenant != "acme" {
			t.Errorf("a tool called the service as tenant %q, want acme", tenant)
		}
	}
}

func (f *mcpFakeSandboxes) RunCode(_ context.Context, c execution.Caller, id string, r sandboxes.RunCodeRequest, _ func(sandboxes.CodeEvent)) (sandboxes.CodeResult, error) {
	if err := f.saw(c, id); err != nil {
		return sandboxes.CodeResult{}, err
	}
	return sandboxes.CodeResult{ContextID: "ctx_1", Status: "succeeded", Results: []sandboxes.CodeOutput{{Main: true, Data: map[string]string{"text/plain": r.Code}}}}, nil
}

// TestMCPCreateSandboxNetwork: /mcp's create_sandbox hands its network to
// the service as POST /v1/sandboxes does, and the service's refusal of a
// host beyond the caller's plan comes back through the error table with
// the plan's list and what to do.
func TestMCPCreateSandboxNetwork(t *testing.T) {
	hdr := map[string]string{"Accept": "application/json, text/event-stream"}
	plan := config.DefaultPlans()["pro"]
	plan.Egress = &config.Egress{Allow: []string{"pypi.org", "*.pythonhosted.org"}}
	fake := &mcpFakeSandboxes{}
	env := newEnv(t, withPlans(map[string]config.Plan{"pro": plan}), withMCP(mcpserver.Options{Languages: []client.Language{{Name: "python"}}}),
		func(c *envConfig) { c.mcpSandboxes = fake })
	for _, tc := range []struct {
		network string // the argument's JSON; "" leaves it out
		want    *sandboxes.NetworkRequest
		text    string
	}{
		{"", nil, `network: allowed pypi.org, *.pythonhosted.org (at most 104857600 bytes in all)\n`},
		{`[]`, &sandboxes.NetworkRequest{Allow: []string{}}, `network: none\n`},
		{`["pypi.org"]`, &sandboxes.NetworkRequest{Allow: []string{"pypi.org"}}, `network: allowed pypi.org (`},
		{`["evil.example"]`, &sandboxes.NetworkRequest{Allow: []string{"evil.example"}},
			`Vertal Run API error forbidden: network.allow names what your plan does not allow (\"evil.example\"); your plan allows pypi.org, *.pythonhosted.org (HTTP 403, request id req_`},
	} {
		args := `{}`
		if tc.network != "" {
			args = `{"network":` + tc.network + `}`
		}
		fake.mu.Lock()
		fake.networks = nil
		fake.mu.Unlock()
		msg := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_sandbox","arguments":` + args + `}}`
		r := env.do(request{method: "POST", path: "/mcp", body: msg, header: hdr})
		if r.status != 200 || !strings.Contains(string(r.body), tc.text) {
			t.Errorf("network %s: %d %s, want %s", tc.network, r.status, r.body, tc.text)
		}
		fake.mu.Lock()
		if diff := cmp.Diff([]*sandboxes.NetworkRequest{tc.want}, fake.networks); diff != "" {
			t.Errorf("network %s: the service's CreateRequest.Network (-want +got):\n%s", tc.network, diff)
		}
		fake.mu.Unlock()
	}
}
