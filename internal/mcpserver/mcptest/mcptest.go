// Package mcptest holds checks that tests of more than one package run
// against MCP servers.
package mcptest

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Agree fails t unless the servers behind sessions a and b answered
// initialize alike (protocol version, capabilities, server info,
// instructions) and list the same tools. Both must be a Vertal Run server:
// server info named vertal-run, and at least one tool.
func Agree(t testing.TB, a, b *mcp.ClientSession) {
	t.Helper()
	ha, hb := handshake(t, a), handshake(t, b)
	if ha.Initialize.ServerInfo == nil || ha.Initialize.ServerInfo.Name != "vertal-run" || len(ha.Tools) == 0 {
		t.Fatalf("not a Vertal Run server: %+v, %d tools", ha.Initialize, len(ha.Tools))
	}
	if diff := cmp.Diff(ha, hb); diff != "" {
		t.Errorf("initialize and tools/list (-first +second):\n%s", diff)
	}
}

// AgreeExcept is Agree for a second server that offers the tools named
// in extra besides the first one's (the HTTP server's sandbox tools, which
// the stdio server does not have yet): b must list them, and agrees with a
// on everything else.
func AgreeExcept(t testing.TB, a, b *mcp.ClientSession, extra ...string) {
	t.Helper()
	ha, hb := handshake(t, a), handshake(t, b)
	if ha.Initialize.ServerInfo == nil || ha.Initialize.ServerInfo.Name != "vertal-run" || len(ha.Tools) == 0 {
		t.Fatalf("not a Vertal Run server: %+v, %d tools", ha.Initialize, len(ha.Tools))
	}
	want := map[string]bool{}
	for _, n := range extra {
		want[n] = true
	}
	kept := hb.Tools[:0:0]
	for _, tool := range hb.Tools {
		if want[tool.Name] {
			delete(want, tool.Name)
			continue
		}
		kept = append(kept, tool)
	}
	if len(want) != 0 {
		t.Errorf("the second server lacks the tools %v", want)
	}
	hb.Tools = kept
	// Its instructions say what the extra tools are for, after the first's.
	if hb.Initialize != nil && ha.Initialize != nil && strings.HasPrefix(hb.Initialize.Instructions, ha.Initialize.Instructions) {
		init := *hb.Initialize
		init.Instructions = ha.Initialize.Instructions
		hb.Initialize = &init
	}
	if diff := cmp.Diff(ha, hb); diff != "" {
		t.Errorf("initialize and tools/list (-first +second):\n%s", diff)
	}
}

type handshakeResult struct {
	Initialize *mcp.InitializeResult
	Tools      []*mcp.Tool
}

func handshake(t testing.TB, cs *mcp.ClientSession) handshakeResult {
	t.Helper()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	return handshakeResult{cs.InitializeResult(), tools.Tools}
}
