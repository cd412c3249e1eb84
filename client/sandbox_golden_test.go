package client

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// TestSandboxRequestBodies holds the bodies the SDK sends for sandboxes
// to golden files: what is left out when not set, and how files and
// timeouts are encoded.
func TestSandboxRequestBodies(t *testing.T) {
	create := SandboxParams{Image: "datasci", Timeout: 90*time.Second + time.Millisecond, Env: map[string]string{"A": "1"},
		Metadata: map[string]string{"team": "ml"}, OnTimeout: "pause",
		Files:   []File{{Path: "in.csv", Content: []byte("a,b\n")}, {Path: "blob", Content: []byte{0, 0xff}}},
		Network: &wire.NetworkRequest{Allow: []string{"pypi.org", "*.pythonhosted.org"}}}
	var cs Commands
	fg, err := cs.request("python3 main.py", []CommandOption{WithCwd("/tmp"), WithCommandEnv(map[string]string{"X": "y"}),
		WithCommandStdin("in"), WithCommandTimeout(5 * time.Second)}, false)
	if err != nil {
		t.Fatal(err)
	}
	bg, err := cs.request("", []CommandOption{WithArgv("sleep", "100")}, true)
	if err != nil {
		t.Fatal(err)
	}
	sb := &Sandbox{ID: "sbx_0123456789abcdef0123456789abcdef"}
	cell, err := sb.codeCall("x + 1", []CodeOption{InContext("ctx_0123456789abcdef0123456789abcdef"), WithCodeEnv(map[string]string{"X": "y"}), WithCodeTimeout(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	js, err := sb.codeCall("", []CodeOption{WithCodeLanguage("javascript")})
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "testdata/sandbox_requests.json", map[string]any{
		"create":         create.request(),
		"create_default": SandboxParams{}.request(),
		"create_offline": SandboxParams{Network: &wire.NetworkRequest{}}.request(),
		"command":        json.RawMessage(fg),
		"background":     json.RawMessage(bg),
		"run_code":       json.RawMessage(cell.body),
		"run_code_empty": json.RawMessage(js.body),
	})
}
