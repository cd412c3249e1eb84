package mcpclient_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// e2bFlows runs one mode of e2b.mjs (E2B's official SDKs, unmodified)
// against the shared server and requires each named check to pass.
func e2bFlows(t *testing.T, mode, key string, want []string) string {
	t.Helper()
	u, _ := url.Parse(e2e.url)
	env := []string{
		"E2B_API_URL=" + e2e.url + "/e2b", "E2B_SANDBOX_URL=" + e2e.url + "/e2b", "E2B_API_KEY=" + key,
		"E2B_OTHER_KEY=" + newKey(t, "pro"), "VERTAL_PORT=" + u.Port(),
		// Nothing may reach E2B's cloud: no telemetry, no other domain.
		"E2B_DOMAIN=invalid.localhost", "E2B_DEBUG=",
	}
	got := run(t, env, "", "node", filepath.Join(e2e.repo, "tests", "mcpclient", "e2b.mjs"), mode)
	if got.exit != 0 {
		t.Fatalf("node e2b.mjs %s: exit %d\nstdout:\n%s\nstderr:\n%s", mode, got.exit, got.stdout, got.stderr)
	}
	for _, name := range want {
		if !regexp.MustCompile(`(?m)^ok ` + regexp.QuoteMeta(name) + `$`).MatchString(got.stdout) {
			t.Errorf("check %q did not pass; stdout:\n%s", name, got.stdout)
		}
	}
	return got.stdout
}

// usageOf reads a tenant's usage through our own API.
func usageOf(t *testing.T, key string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", e2e.url+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestE2BSDK runs E2B's documented flows with the official `e2b` package:
// create, commands (output, exit errors, streaming, background, stdin),
// files (text, 70 kB binary, list, exists, remove, a command's file),
// connect, list, setTimeout, getInfo, pause, no network, kill, a wrong
// key, and the refusals: another tenant's key, a missing or another
// sandbox's access token. The tenant's quota counts each command.
func TestE2BSDK(t *testing.T) {
	server(t)
	key := newKey(t, "pro")
	e2bFlows(t, "sdk", key, []string{
		"create", "run stdout stderr exit", "CommandExitError", "onStdout streams before the end", "run with cwd and envs",
		"background list kill", "stdin", "connect to a running command", "files text", "files binary 70 kB", "files write many",
		"files list exists remove makeDir rename", "watchDir", "file made by a command", "read-only root and no root user",
		"no network inside", "connect list setTimeout getInfo", "getMetrics", "another tenant sees nothing",
		"data plane refuses a missing or foreign token", "pause and connect resumes", "kill", "wrong key",
	})
	today, _ := usageOf(t, key)["today"].(map[string]any)
	// Exactly what ran: two sandboxes and thirteen commands (the one asked
	// as root, and the one after the kill, were refused before starting).
	if n, _ := today["executions"].(float64); n != 15 {
		t.Errorf("usage after the E2B flows counts %v executions, want 15 (two sandboxes, thirteen commands): %v", today["executions"], today)
	}
	if !strings.Contains(e2e.log.String(), `/e2b/process.Process/`) {
		t.Errorf("the access log has no E2B command route")
	}
	if strings.Contains(e2e.log.String(), "e2bat_") {
		t.Errorf("an E2B access token is in the server's log")
	}
}

// TestE2BNetwork runs E2B's network options with the official SDK:
// allowInternetAccess, network.allowOut with denyOut ALL_TRAFFIC, and a
// list wider than the plan's.
func TestE2BNetwork(t *testing.T) {
	server(t)
	e2bFlows(t, "network", newKey(t, "enterprise"), []string{
		"plan network by default", "allowInternetAccess false", "allowOut narrows", "allowOut wider than the plan",
	})
}

// TestE2BCodeInterpreter runs `@e2b/code-interpreter`: state across
// cells, the last value, logs, errors with a traceback, streaming, contexts
// that share nothing, a JavaScript context, and on the datasci image a
// matplotlib chart as PNG and a DataFrame as HTML.
func TestE2BCodeInterpreter(t *testing.T) {
	server(t)
	if _, err := os.Stat(e2etest.DatasciDir()); err != nil {
		t.Fatalf("the code interpreter's template is the datasci image (scripts/setup.sh test builds it): %v", err)
	}
	e2bFlows(t, "interpreter", newKey(t, "pro"), []string{
		"create code interpreter", "state and last value", "stdout logs", "error name value traceback", "streams before the end",
		"separate contexts share nothing", "js context keeps state", "matplotlib chart as PNG", "DataFrame as HTML", "kill code interpreter",
	})
}
