package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver/mcptest"
)

// TestMCPStdioAnswersBeforeExit runs the real binary with a stdin that
// closes right after the last request, as `echo '<request>' | vertal mcp`
// does, and checks that every request is answered before it exits. The
// API's answer to the tool call is held back until stdin has closed, so
// the end of input always comes first.
func TestMCPStdioAnswersBeforeExit(t *testing.T) {
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}`
	for _, tc := range []struct {
		name  string
		lines []string
		want  map[float64]string // response id -> a text its result contains
	}{
		{name: "initialize alone", lines: []string{initialize}, want: map[float64]string{1: `"name":"vertal-run"`}},
		{name: "tool call in flight at the end of input", lines: []string{initialize,
			`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_usage","arguments":{}}}`},
			want: map[float64]string{1: `"name":"vertal-run"`, 2: `tenant: acme`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdinClosed := make(chan struct{})
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				switch r.URL.Path {
				case "/v1/usage":
					select {
					case <-stdinClosed:
					case <-r.Context().Done():
						return
					}
					io.WriteString(w, `{"tenant":"acme","plan":"free","today":{"date":"2026-12-01","executions":3,"sandbox_seconds":2.5},"limits":{"executions_per_day":100,"max_timeout_s":10}}`)
				case "/v1/languages":
					io.WriteString(w, `{"languages":[{"name":"python","version":"3.11.2"}]}`)
				default:
					w.WriteHeader(http.StatusNotFound)
					io.WriteString(w, `{"error":{"code":"not_found","message":"no such route"},"request_id":"req_1"}`)
				}
			}))
			defer api.Close()

			// The bound only keeps a hung binary from hanging the suite.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, vertalBinary(t), "mcp")
			cmd.Env = []string{"KUBO_API_URL=" + api.URL, "KUBO_API_KEY=kubo_sk_test0123456789abcdef"}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			io.WriteString(stdin, strings.Join(tc.lines, "\n")+"\n")
			stdin.Close()
			close(stdinClosed)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("vertal mcp: %v\nstderr: %s", err, stderr.String())
			}

			got := map[float64]string{}
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				var msg struct {
					ID     float64         `json:"id"`
					Result json.RawMessage `json:"result"`
				}
				if json.Unmarshal([]byte(line), &msg) != nil || msg.Result == nil {
					continue
				}
				for id, text := range tc.want {
					if id == msg.ID && strings.Contains(string(msg.Result), text) {
						got[id] = text
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answers (-want +got):\n%s\nstdout: %s\nstderr: %s", diff, stdout.String(), stderr.String())
			}
		})
	}
}

// TestMCPServersAgreeE2E: `vertal mcp` (stdio, calling the API) and the
// server's own /mcp answer initialize alike (protocol version,
// capabilities, server info, instructions) and list the same tools, the
// sandbox tools too; through vertal mcp an agent's calls share a sandbox.
func TestMCPServersAgreeE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil, "--dev")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mc := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)

	cmd := exec.Command(vertalBinary(t), "mcp")
	cmd.Env = []string{"KUBO_API_URL=" + p.url, "KUBO_API_KEY=" + p.devKey}
	stdio, err := mc.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("vertal mcp: %v", err)
	}
	defer stdio.Close()
	remote, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.url + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{p.devKey}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("/mcp: %v", err)
	}
	defer remote.Close()

	if init := stdio.InitializeResult(); init.ServerInfo == nil || init.ServerInfo.Version != version {
		t.Errorf("vertal mcp initialize: %+v, want server info with version %s", init, version)
	}
	// Both offer the sandbox tools of a server that has sandboxes.
	mcptest.Agree(t, stdio, remote)

	// An agent's successive calls through vertal mcp share one sandbox.
	tool := func(name string, args map[string]any) (string, map[string]any) {
		t.Helper()
		res, err := stdio.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var text strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		if res.IsError {
			t.Fatalf("%s: tool error %s", name, text.String())
		}
		structured, _ := res.StructuredContent.(map[string]any)
		return text.String(), structured
	}
	_, sb := tool("create_sandbox", map[string]any{"timeout_s": 120})
	id, _ := sb["id"].(string)
	if !strings.HasPrefix(id, "sbx_") || sb["status"] != "running" {
		t.Fatalf("create_sandbox: %v", sb)
	}
	tool("run_command", map[string]any{"sandbox_id": id, "cmd": "echo kept > state.txt"})
	tool("write_file", map[string]any{"sandbox_id": id, "path": "note.txt", "content": "from the agent"})
	if _, out := tool("run_command", map[string]any{"sandbox_id": id, "cmd": "cat state.txt note.txt"}); out["stdout"] != "kept\nfrom the agent" {
		t.Errorf("state across calls: %v", out)
	}
	if text, _ := tool("read_file", map[string]any{"sandbox_id": id, "path": "state.txt"}); !strings.Contains(text, "kept") {
		t.Errorf("read_file: %q", text)
	}
	if _, ended := tool("kill_sandbox", map[string]any{"sandbox_id": id}); ended["status"] != "ended" {
		t.Errorf("kill_sandbox: %v", ended)
	}
}
