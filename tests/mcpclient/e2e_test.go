// Package mcpclient_test checks every client of Vertal Run against a real
// server: `vertal serve --dev` with the real sandbox engine (oci driver) on
// a loopback port and a temporary data directory. It drives `vertal run`
// and `vertal usage`, the Go SDK, the Python SDK's live tests, and both MCP
// servers (Go and Python, stdio) plus the Streamable HTTP endpoint through
// the official TypeScript MCP client (check.mjs) and the MCP Inspector CLI.
//
// Gated by VERTAL_E2E=1 (root, an OCI runtime and the sandbox rootfs); it
// also needs node with `npm ci` done here, and /usr/bin/python3 >= 3.10.
package mcpclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// e2e is the server shared by the tests of this package.
var e2e struct {
	once    sync.Once
	err     error
	repo    string // repository root
	bin     string // built vertal binary
	dataDir string
	url     string // http://127.0.0.1:PORT (no /api)
	devKey  string // printed by --dev on first start, if found
	cmd     *exec.Cmd
	exited  chan error // receives cmd.Wait's result
	log     *e2etest.Buffer
	keyN    int
	keyMu   sync.Mutex
}

var keyPattern = regexp.MustCompile(`kubo_sk_[A-Za-z0-9_-]{16,}`)

func TestMain(m *testing.M) {
	code := m.Run()
	if e2e.cmd != nil {
		e2e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e2e.exited:
		case <-time.After(15 * time.Second):
			e2e.cmd.Process.Kill()
			<-e2e.exited
		}
	}
	if e2e.dataDir != "" {
		os.RemoveAll(filepath.Dir(e2e.dataDir))
	}
	os.Exit(code)
}

// server starts the shared server once, or skips when VERTAL_E2E is unset
// (tests and benchmarks alike).
func server(t testing.TB) {
	t.Helper()
	e2etest.Require(t, "root, an OCI runtime and the sandbox rootfs")
	e2e.once.Do(func() { e2e.err = startServer() })
	if e2e.err != nil {
		t.Fatalf("starting vertal serve: %v\n--- server output ---\n%s", e2e.err, e2e.log)
	}
}

func startServer() error {
	_, file, _, _ := runtime.Caller(0)
	e2e.repo = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	tmp, err := os.MkdirTemp("", "vertal-clients-e2e-")
	if err != nil {
		return err
	}
	e2e.dataDir = filepath.Join(tmp, "data")
	e2e.bin = filepath.Join(tmp, "vertal")
	build := exec.Command("go", "build", "-o", e2e.bin, "./cmd/vertal")
	build.Dir = e2e.repo
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	// The agent of sandboxes that stay, next to vertal, where serve looks
	// for it (the SDKs' live tests use sandboxes).
	agent := exec.Command("go", "build", "-o", filepath.Join(tmp, "vertal-agent"), "./cmd/vertal-agent")
	agent.Dir, agent.Env = e2e.repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := agent.CombinedOutput(); err != nil {
		return fmt.Errorf("go build vertal-agent: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	e2e.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	e2e.log = &e2etest.Buffer{}
	// The enterprise plan's sandboxes may reach allowed.test and its
	// subdomains (e2b_test.go's TestE2BNetwork); the fake internet of
	// cmd/vertal's TestEgressE2E is where traffic is tested.
	args := []string{"serve", "--dev", "--driver", "oci", "--host", "127.0.0.1",
		"--port", fmt.Sprint(port), "--data-dir", e2e.dataDir, "--egress", "enterprise:allowed.test,enterprise:*.allowed.test"}
	// The image with the data stack, where setup built it: the E2B code
	// interpreter's template maps to it (e2b_test.go).
	if _, err := os.Stat(e2etest.DatasciDir()); err == nil {
		args = append(args, "--image", "datasci="+e2etest.DatasciDir())
	}
	e2e.cmd = exec.Command(e2e.bin, args...)
	e2e.cmd.Stdout, e2e.cmd.Stderr = e2e.log, e2e.log
	if err := e2e.cmd.Start(); err != nil {
		return err
	}
	e2e.exited = make(chan error, 1)
	go func() { e2e.exited <- e2e.cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-e2e.exited:
			e2e.cmd = nil
			return fmt.Errorf("server exited: %v", err)
		default:
		}
		resp, err := http.Get(e2e.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				e2e.devKey = keyPattern.FindString(e2e.log.String())
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("no healthy /health within 90 s")
}

// newKey creates a key for a fresh tenant, so tests do not share quotas
// or lose keys to another test's rotation.
func newKey(t testing.TB, plan string) string {
	t.Helper()
	e2e.keyMu.Lock()
	e2e.keyN++
	tenant := fmt.Sprintf("e2e-%s-%d", strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-")), e2e.keyN)
	e2e.keyMu.Unlock()
	if len(tenant) > 60 {
		tenant = tenant[:60]
	}
	out, err := exec.Command(e2e.bin, "create-key", "--plan", plan, "--data-dir", e2e.dataDir, tenant).CombinedOutput()
	if err != nil {
		t.Fatalf("vertal create-key: %v\n%s", err, out)
	}
	key := keyPattern.FindString(string(out))
	if key == "" {
		t.Fatalf("vertal create-key printed no key:\n%s", out)
	}
	return key
}

type cmdResult struct {
	stdout, stderr string
	exit           int
}

// run runs a command with extra environment and stdin.
func run(t testing.TB, env []string, stdin string, name string, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := cmdResult{stdout: out.String(), stderr: errOut.String()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.exit = exitErr.ExitCode()
	default:
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return res
}

func TestCLI(t *testing.T) {
	server(t)
	key := newKey(t, "free")
	env := []string{"KUBO_API_URL=" + e2e.url + "/api", "KUBO_API_KEY=" + key}
	script := filepath.Join(t.TempDir(), "hello.js")
	if err := os.WriteFile(script, []byte("console.log('from ' + 'file')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		stdin  string
		env    []string
		want   cmdResult
		stderr *regexp.Regexp // instead of want.stderr when set
	}{
		{name: "documented hello", args: []string{"run", "print('hello')"}, want: cmdResult{stdout: "hello\n"}},
		{name: "documented javascript", args: []string{"run", "console.log(6*7)", "--language", "javascript", "--timeout", "5"}, want: cmdResult{stdout: "42\n"}},
		{name: "bash from stdin, streams and exit code mirrored", args: []string{"run", "-", "-l", "bash"}, stdin: "echo out; echo err >&2; exit 3",
			want: cmdResult{stdout: "out\n", stderr: "err\n", exit: 3}},
		{name: "file with inferred language", args: []string{"run", script}, want: cmdResult{stdout: "from file\n"}},
		{name: "program stdin", args: []string{"run", "import sys; print(sys.stdin.read()[::-1])", "--stdin", "abc"}, want: cmdResult{stdout: "cba\n"}},
		{name: "flags instead of environment", args: []string{"run", "--url", e2e.url, "--key", key, "print(1)"}, env: []string{"KUBO_API_KEY=", "KUBO_API_URL="},
			want: cmdResult{stdout: "1\n"}},
		{name: "timeout", args: []string{"run", "--timeout", "1", "while True: pass"}, want: cmdResult{exit: -1},
			stderr: regexp.MustCompile(`timed out`)},
		{name: "api error", args: []string{"run", "x", "--timeout", "999"}, want: cmdResult{exit: 125},
			stderr: regexp.MustCompile(`^vertal run: invalid_timeout: .+ \(HTTP 400, request id req_[0-9a-f]{32}\)\n$`)},
		{name: "bad key", args: []string{"usage", "--key", "kubo_sk_notakeynotakeynotakey"}, want: cmdResult{exit: 125},
			stderr: regexp.MustCompile(`^vertal usage: unauthorized: .+request id req_[0-9a-f]{32}\)\n$`)},
		{name: "usage", args: []string{"usage"}, want: cmdResult{stdout: "-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, append(append([]string{}, env...), tc.env...), tc.stdin, e2e.bin, tc.args...)
			switch {
			case tc.want.exit == -1: // any non-zero
				if got.exit == 0 {
					t.Errorf("exit 0, want non-zero; stderr %q", got.stderr)
				}
			case got.exit != tc.want.exit:
				t.Errorf("exit %d, want %d; stderr %q", got.exit, tc.want.exit, got.stderr)
			}
			if tc.want.stdout == "-" {
				if !strings.Contains(got.stdout, "plan    free") || !strings.Contains(got.stdout, "max_timeout_s") {
					t.Errorf("usage printed %q", got.stdout)
				}
			} else if got.stdout != tc.want.stdout {
				t.Errorf("stdout %q, want %q", got.stdout, tc.want.stdout)
			}
			if tc.stderr != nil {
				if !tc.stderr.MatchString(got.stderr) {
					t.Errorf("stderr %q does not match %s", got.stderr, tc.stderr)
				}
			} else if got.stderr != tc.want.stderr {
				t.Errorf("stderr %q, want %q", got.stderr, tc.want.stderr)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		got := run(t, env, "", e2e.bin, "run", "--json", "print(6 * 7)")
		var ex map[string]any
		if err := json.Unmarshal([]byte(got.stdout), &ex); err != nil || got.exit != 0 {
			t.Fatalf("exit %d, stdout %q: %v", got.exit, got.stdout, err)
		}
		if ex["stdout"] != "42\n" || !regexp.MustCompile(`^exe_[0-9a-f]{32}$`).MatchString(fmt.Sprint(ex["id"])) {
			t.Errorf("--json printed %v", ex)
		}
	})
}

func TestGoSDK(t *testing.T) {
	server(t)
	ctx := context.Background()
	key := newKey(t, "pro")
	for _, base := range []string{e2e.url, e2e.url + "/api"} {
		c, err := client.New(base, key)
		if err != nil {
			t.Fatal(err)
		}
		ex, err := c.Run(ctx, "print(6 * 7)")
		if err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		if ex.Status != client.StatusSucceeded || ex.Stdout != "42\n" || ex.ExitCode != 0 || ex.Usage.SandboxSeconds < 0 { // rounded to the ms: a warm run can be 0
			t.Errorf("%s: Run = %+v", base, ex)
		}
	}

	c, err := client.New(e2e.url+"/api", key)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := c.Run(ctx, "process.stdin.on('data', d => { console.error(String(d).trim()); process.exit(4) })",
		client.WithLanguage("javascript"), client.WithStdin("to stderr"), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Status != client.StatusFailed || ex.ExitCode != 4 || ex.Stderr != "to stderr\n" {
		t.Errorf("failing javascript = %+v", ex)
	}
	got, err := c.Get(ctx, ex.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != ex.ID || got.Language != "javascript" || got.CreatedAt == 0 {
		t.Errorf("Get = %+v", got)
	}

	langs, err := c.Languages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]string{}
	for _, l := range langs {
		versions[l.Name] = l.Version
	}
	for _, name := range []string{"python", "javascript", "bash"} {
		if versions[name] == "" {
			t.Errorf("language %s has no version: %+v", name, langs)
		}
	}

	// The same idempotency key returns the first result and uses no quota.
	before, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idem := fmt.Sprintf("go-e2e-%d", time.Now().UnixNano())
	first, err := c.Run(ctx, "import random; print(random.random())", client.WithIdempotencyKey(idem))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Run(ctx, "import random; print(random.random())", client.WithIdempotencyKey(idem))
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID || again.Stdout != first.Stdout || !again.IdempotentReplay {
		t.Errorf("replay = %+v, first = %+v", again, first)
	}
	after, err := c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Today.Executions != before.Today.Executions+1 {
		t.Errorf("executions went %d -> %d, want +1", before.Today.Executions, after.Today.Executions)
	}
	if _, err := c.Run(ctx, "print('other')", client.WithIdempotencyKey(idem)); !errors.Is(err, client.ErrIdempotencyConflict) {
		t.Errorf("same key, other code: err = %v, want idempotency_conflict", err)
	}

	var apiErr *client.Error
	if _, err := c.Run(ctx, "x", client.WithTimeout(999*time.Second)); !errors.As(err, &apiErr) ||
		apiErr.StatusCode != 400 || apiErr.Code != client.CodeInvalidTimeout || !strings.HasPrefix(apiErr.RequestID, "req_") {
		t.Errorf("timeout 999: err = %#v", err)
	}

	// Rotation switches the client to the new key and revokes the old one.
	kr, err := c.RotateKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if kr.APIKey == key || kr.Plan != "pro" {
		t.Errorf("rotation = %+v", kr)
	}
	if _, err := c.Usage(ctx); err != nil {
		t.Errorf("after rotation, the client's new key fails: %v", err)
	}
	old, _ := client.New(e2e.url, key)
	if _, err := old.Usage(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("old key after rotation: err = %v, want unauthorized", err)
	}
}

// checkMCP runs check.mjs (the TypeScript MCP client) and returns its
// summary line.
func checkMCP(t *testing.T, env []string, args ...string) map[string]any {
	t.Helper()
	dir := filepath.Join(e2e.repo, "tests", "mcpclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript MCP SDK is not installed: run npm ci in %s", dir)
	}
	got := run(t, env, "", "node", append([]string{filepath.Join(dir, "check.mjs")}, args...)...)
	if got.exit != 0 {
		t.Fatalf("check.mjs %v: exit %d\nstdout: %s\nstderr: %s", args, got.exit, got.stdout, got.stderr)
	}
	var summary map[string]any
	if err := json.Unmarshal([]byte(got.stdout), &summary); err != nil || summary["ok"] != true || summary["stdout"] != "42\n" {
		t.Fatalf("check.mjs %v printed %q (%v)", args, got.stdout, err)
	}
	return summary
}

func TestMCPStdio(t *testing.T) {
	server(t)
	// MCPCHECK_FILES: a CSV in, a PNG (image content) and a CSV (embedded
	// resource) out, through the API and each server's SDK. Each server
	// gets its own tenant: the sandbox tools alone send about 20 requests,
	// the free plan's rate for a minute, and one server's use must not
	// throttle the other's.
	env := func(key string) []string {
		return []string{"KUBO_API_URL=" + e2e.url + "/api", "KUBO_API_KEY=" + key,
			"PYTHONPATH=" + filepath.Join(e2e.repo, "sdk", "python"), "MCPCHECK_FILES=1"}
	}
	executions := func(t *testing.T, key string, want int64, what string) {
		t.Helper()
		c, _ := client.New(e2e.url, key)
		u, err := c.Usage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if u.Today.Executions != want {
			t.Errorf("the key shows %d executions, want %d (%s)", u.Today.Executions, want, what)
		}
	}
	t.Run("vertal mcp", func(t *testing.T) {
		// The API has sandboxes: vertal mcp offers their tools, and the
		// TypeScript client keeps state across them.
		key := newKey(t, "pro")
		if s := checkMCP(t, append(env(key), "MCPCHECK_SANDBOXES=1"), "stdio", e2e.bin, "mcp"); s["sandbox"] == nil {
			t.Errorf("vertal mcp: the sandbox tools were not exercised: %v", s)
		}
		// 3 runs, create_sandbox, the one run_command that ran and its
		// three cells, metered through the API.
		executions(t, key, 8, "3 runs and the sandbox tools, metered through the API")
	})
	t.Run("python -m vertal2kubo.mcp", func(t *testing.T) {
		// The Python server has the same sandbox tools, on the Python SDK.
		key := newKey(t, "pro")
		if s := checkMCP(t, append(env(key), "MCPCHECK_SANDBOXES=1"), "stdio", "/usr/bin/python3", "-m", "vertal2kubo.mcp"); s["sandbox"] == nil {
			t.Errorf("python -m vertal2kubo.mcp: the sandbox tools were not exercised: %v", s)
		}
		executions(t, key, 8, "3 runs and the sandbox tools, metered through the API")
	})
}

func TestMCPHTTP(t *testing.T) {
	server(t)
	// pro: each MCP message counts once against the key's rate, and two
	// sessions come close to the free plan's 20 requests per minute.
	key := newKey(t, "pro")
	for _, path := range []string{"/mcp", "/api/mcp"} {
		t.Run(path, func(t *testing.T) {
			// files: a CSV in, a PNG (image content) and a CSV (embedded
			// resource) out, through the server's execution service.
			checkMCP(t, nil, "http", e2e.url+path, key, "files")
		})
	}
	t.Run("no key", func(t *testing.T) {
		req, _ := http.NewRequest("POST", e2e.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 401 || !strings.Contains(string(body), `"unauthorized"`) {
			t.Errorf("no key: %d %s", resp.StatusCode, body)
		}
	})
	c, _ := client.New(e2e.url, key)
	u, err := c.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 3 run_code calls per path, and the sandbox tools' create_sandbox, one
	// run_command that ran (the one in the killed sandbox is refused) and
	// three cells of run_code with the sandbox_id: 16 also says the
	// TypeScript client went through the sandbox tools.
	if u.Today.Executions != 16 {
		t.Errorf("the caller's key shows %d executions, want 16 (its own key reached the API, and the sandbox tools ran)", u.Today.Executions)
	}
}

// TestMCPSandboxNetwork: create_sandbox's network through each MCP server
// (vertal mcp and the Python server over the API, /mcp over the service),
// for a key whose plan may reach allowed.test and *.allowed.test: a
// narrower list is the sandbox's, a wider one a forbidden tool error that
// names the plan's list, and on stdio a fetch beyond the sandbox's list is
// named in run_command's answer. Traffic itself is TestEgressE2E's
// (cmd/vertal).
func TestMCPSandboxNetwork(t *testing.T) {
	server(t)
	key := newKey(t, "enterprise")
	env := []string{"KUBO_API_URL=" + e2e.url + "/api", "KUBO_API_KEY=" + key,
		"PYTHONPATH=" + filepath.Join(e2e.repo, "sdk", "python"), "MCPCHECK_SANDBOXES=1", "MCPCHECK_NETWORK=1"}
	for name, args := range map[string][]string{
		"vertal mcp":                {"stdio", e2e.bin, "mcp"},
		"python -m vertal2kubo.mcp": {"stdio", "/usr/bin/python3", "-m", "vertal2kubo.mcp"},
		"/mcp":                      {"http", e2e.url + "/mcp", key},
	} {
		t.Run(name, func(t *testing.T) {
			if s := checkMCP(t, env, args...); s["network"] == nil {
				t.Errorf("%s: create_sandbox's network was not exercised: %v", name, s)
			}
		})
	}
}

// TestPythonSDKLive runs sdk/python's unit and live tests against the
// server, with a key of their own (they rotate it).
func TestPythonSDKLive(t *testing.T) {
	server(t)
	key := newKey(t, "pro")
	cmd := exec.Command("/usr/bin/python3", "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
	cmd.Dir = filepath.Join(e2e.repo, "sdk", "python")
	cmd.Env = append(os.Environ(), "VERTAL_TEST_URL="+e2e.url+"/api", "VERTAL_TEST_KEY="+key)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python tests failed: %v\n%s", err, out)
	}
	if s := string(out); strings.Contains(s, "skipped") || !strings.Contains(s, "test_9_docs_snippet_runs_as_written") {
		t.Errorf("python tests skipped something or did not run the docs snippet:\n%s", s)
	}
}

// TestGoSDKFilesAndStream: files, env and args in, returned files out byte
// for byte, live events while the run goes on, and Attach with resume.
func TestGoSDKFilesAndStream(t *testing.T) {
	server(t)
	ctx := context.Background()
	c, err := client.New(e2e.url+"/api", newKey(t, "pro"))
	if err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 256)
	for i := range blob {
		blob[i] = byte(i)
	}
	ex, err := c.Run(ctx, "import os, sys\nprint(os.environ['GREETING'], sys.argv[1:], open('in/data.csv').read().count('\\n'))\n"+
		"os.makedirs('out', exist_ok=True)\nopen('out/copy.bin', 'wb').write(open('blob.bin', 'rb').read())",
		client.WithFiles(client.File{Path: "in/data.csv", Content: []byte("a,b\n1,2\n")}, client.File{Path: "blob.bin", Content: blob}),
		client.WithEnv(map[string]string{"GREETING": "hi"}), client.WithArgs("x", "y z"), client.WithReturnFiles("out/**"))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Status != client.StatusSucceeded || ex.Stdout != "hi ['x', 'y z'] 2\n" || ex.FilesTruncated ||
		len(ex.Files) != 1 || ex.Files[0].Path != "out/copy.bin" || !bytes.Equal(ex.Files[0].Content, blob) || ex.Files[0].Size != 256 {
		t.Errorf("files run = %+v", ex)
	}

	var apiErr *client.Error
	_, err = c.Run(ctx, "print(1)", client.WithFiles(client.File{Path: "../x", Content: []byte("a")}))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != client.CodeInvalidRequest || !strings.Contains(apiErr.Message, "files[0].path") {
		t.Errorf("../x: err = %v", err)
	}

	code := "import sys, time\nprint('marker', flush=True)\ntime.sleep(1)\nprint('err', file=sys.stderr)\nprint('done')"
	var evs []client.Event
	runningAtMarker := ""
	for ev, err := range c.Stream(ctx, code) {
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		if ev.Type == client.EventStdout && strings.Contains(ev.Text, "marker") && runningAtMarker == "" {
			got, err := c.Get(ctx, ev.ExecutionID)
			if err != nil {
				t.Fatal(err)
			}
			runningAtMarker = string(got.Status)
		}
	}
	if len(evs) < 3 || evs[0].Type != client.EventStarted || evs[0].ID != "0-0" || evs[len(evs)-1].Type != client.EventResult || evs[len(evs)-1].ID != "end" {
		t.Fatalf("events %+v", evs)
	}
	if runningAtMarker != "running" {
		t.Errorf("GET at the marker said %q, want running", runningAtMarker)
	}
	res := evs[len(evs)-1].Execution
	if res.Status != client.StatusSucceeded || res.Stdout != "marker\ndone\n" || res.Stderr != "err\n" {
		t.Errorf("result %+v", res)
	}
	joined := func(evs []client.Event, typ client.EventType) string {
		var b strings.Builder
		for _, ev := range evs {
			if ev.Type == typ {
				b.WriteString(ev.Text)
			}
		}
		return b.String()
	}
	if joined(evs, client.EventStdout) != "marker\ndone\n" || joined(evs, client.EventStderr) != "err\n" {
		t.Errorf("streamed output %+v", evs)
	}

	// Resume after the first stdout event ("7-0"): only the rest comes.
	var resumed []client.Event
	for ev, err := range c.Attach(ctx, evs[0].ExecutionID, evs[1].ID) {
		if err != nil {
			t.Fatal(err)
		}
		resumed = append(resumed, ev)
	}
	if evs[1].ID != "7-0" || joined(resumed, client.EventStdout) != "done\n" || joined(resumed, client.EventStderr) != "err\n" ||
		resumed[len(resumed)-1].Type != client.EventResult {
		t.Errorf("resumed after %s: %+v", evs[1].ID, resumed)
	}
	for ev, err := range c.Attach(ctx, evs[0].ExecutionID, "end") {
		t.Errorf("after end: %+v %v", ev, err)
	}
}

// TestCLIFilesAndStream: `vertal run` with files, env, args and returned
// files written under --out, streaming and not.
func TestCLIFilesAndStream(t *testing.T) {
	server(t)
	env := []string{"KUBO_API_URL=" + e2e.url + "/api", "KUBO_API_KEY=" + newKey(t, "pro")}
	dir := t.TempDir()
	csv := filepath.Join(dir, "data.csv")
	if err := os.WriteFile(csv, []byte("n\n1\n2\n39\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := "import os, sys\ntotal = sum(int(x) for x in open('in/data.csv').read().split()[1:])\n" +
		"os.makedirs('out/deep', exist_ok=True)\nopen('out/deep/sum.txt', 'w').write(str(total))\nprint(os.environ['MODE'], sys.argv[1:])"
	for _, stream := range []string{"", "--no-stream"} {
		out := filepath.Join(dir, "results"+stream)
		args := []string{"run", code, "--file", csv + ":in/data.csv", "--env", "MODE=fast", "--arg", "a", "--return", "out/**", "--out", out}
		if stream != "" {
			args = append(args, stream)
		}
		got := run(t, env, "", e2e.bin, append(args, "--", "b c")...)
		if got.exit != 0 || got.stdout != "fast ['a', 'b c']\n" || !strings.Contains(got.stderr, "wrote "+filepath.Join(out, "out", "deep", "sum.txt")+" (2 bytes)") {
			t.Errorf("%s: %+v", stream, got)
		}
		if b, err := os.ReadFile(filepath.Join(out, "out", "deep", "sum.txt")); err != nil || string(b) != "42" {
			t.Errorf("%s: sum.txt = %q, %v", stream, b, err)
		}
	}
	// Streaming keeps stdout and stderr apart and the exit code.
	got := run(t, env, "", e2e.bin, "run", "-l", "bash", "echo out; sleep 1; echo err >&2; exit 5")
	if got.exit != 5 || got.stdout != "out\n" || got.stderr != "err\n" {
		t.Errorf("streamed bash: %+v", got)
	}
}

// TestMCPInspector runs the MCP Inspector CLI (pinned in package.json)
// against the HTTP endpoint. Without a key the Inspector takes the 401 as
// the start of an OAuth flow; what it prints must still tell the user to
// pass an API key. MCP_AUTO_OPEN_ENABLED=true is the Inspector's "a user is
// present" switch: without it and without a TTY it stops before discovery
// with a message of its own. With the key as --header it lists the tools.
func TestMCPInspector(t *testing.T) {
	server(t)
	dir := filepath.Join(e2e.repo, "tests", "mcpclient")
	bin := filepath.Join(dir, "node_modules", ".bin", "mcp-inspector")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("MCP Inspector is not installed: run npm ci in %s", dir)
	}
	home := t.TempDir()
	env := []string{"HOME=" + home, "MCP_CATALOG_PATH=" + filepath.Join(home, "mcp.json"),
		"MCP_INSPECTOR_SECRET_STORE=memory", "MCP_AUTO_OPEN_ENABLED=true"}
	key := newKey(t, "pro")
	for _, path := range []string{"/mcp", "/api/mcp"} {
		t.Run(path+" no key", func(t *testing.T) {
			got := run(t, env, "", bin, "--cli", e2e.url+path, "--method", "tools/list")
			out := got.stdout + got.stderr
			if got.exit == 0 || !strings.Contains(out, "this server takes API keys, not OAuth") ||
				!strings.Contains(out, "Authorization: Bearer kubo_sk_") {
				t.Errorf("inspector without a key: exit %d, want an error naming the API key\nstdout: %s\nstderr: %s", got.exit, got.stdout, got.stderr)
			}
		})
		t.Run(path+" key", func(t *testing.T) {
			got := run(t, env, "", bin, "--cli", e2e.url+path, "--method", "tools/list",
				"--header", "Authorization: Bearer "+key)
			if got.exit != 0 || !strings.Contains(got.stdout, `"run_code"`) {
				t.Errorf("inspector with the key: exit %d\nstdout: %s\nstderr: %s", got.exit, got.stdout, got.stderr)
			}
		})
	}
}
