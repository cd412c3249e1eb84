package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// runAPI stands in for the Vertal Run API: it answers executions from a
// table keyed by code and records the request bodies.
type runAPI struct {
	mu     sync.Mutex
	bodies []map[string]any
	auth   []string
}

var runReplies = map[string]struct {
	status int
	body   string
}{
	"print(6 * 7)":     {200, `{"id":"exe_1","status":"succeeded","stdout":"42\n","stderr":"","exit_code":0,"duration_ms":265,"truncated":false,"usage":{"sandbox_seconds":0.265},"request_id":"req_1"}`},
	"console.log(6*7)": {200, `{"id":"exe_2","status":"succeeded","stdout":"42\n","stderr":"","exit_code":0,"duration_ms":80,"truncated":false,"usage":{"sandbox_seconds":0.08},"request_id":"req_2"}`},
	"fail":             {200, `{"id":"exe_3","status":"failed","stdout":"partial\n","stderr":"Traceback\n","exit_code":3,"duration_ms":20,"truncated":true,"usage":{"sandbox_seconds":0.02},"request_id":"req_3"}`},
	"sleep":            {200, `{"id":"exe_4","status":"timed_out","stdout":"","stderr":"","exit_code":137,"duration_ms":5000,"truncated":false,"usage":{"sandbox_seconds":5},"request_id":"req_4"}`},
	"x":                {400, `{"error":{"code":"invalid_timeout","message":"timeout_s must be between 1 and 60"},"request_id":"req_bad"}`},
	"quota":            {429, `{"error":{"code":"quota_exceeded","message":"daily quota of 100 executions reached"},"request_id":"req_q"}`},
}

func (a *runAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	a.mu.Lock()
	a.auth = append(a.auth, r.Header.Get("Authorization"))
	a.mu.Unlock()
	switch strings.TrimPrefix(r.URL.Path, "/api") {
	case "/v1/executions":
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		a.mu.Lock()
		a.bodies = append(a.bodies, body)
		a.mu.Unlock()
		code, _ := body["code"].(string)
		rep, ok := runReplies[strings.TrimSpace(code)]
		if !ok { // echo the code so tests can see what was sent
			out, _ := json.Marshal(map[string]any{"id": "exe_e", "status": "succeeded", "stdout": code, "stderr": "", "exit_code": 0,
				"duration_ms": 1, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.001}, "request_id": "req_e"})
			rep.status, rep.body = 200, string(out)
		}
		w.WriteHeader(rep.status)
		io.WriteString(w, rep.body)
	case "/v1/usage":
		io.WriteString(w, `{"tenant":"acme","plan":"pro","today":{"executions":3,"sandbox_seconds":2.635},"limits":{"executions_per_day":10000,"requests_per_minute":120,"max_timeout_s":60}}`)
	default:
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"not_found","message":"no such route"},"request_id":"req_404"}`)
	}
}

type cliResult struct {
	Stdout, Stderr string
	Exit           int
}

func runCLI(t *testing.T, cmd func(context.Context, *env, []string) error, environ map[string]string, stdin string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return environ[k] }}
	err := cmd(context.Background(), e, args)
	res := cliResult{Stdout: out.String(), Stderr: errOut.String()}
	var code exitCode
	switch {
	case err == nil:
	case errors.As(err, &code):
		res.Exit = int(code)
	default:
		t.Fatalf("unexpected error: %v", err)
	}
	return res
}

func TestCmdRun(t *testing.T) {
	api := &runAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	environ := map[string]string{"KUBO_API_URL": srv.URL + "/api", "KUBO_API_KEY": "kubo_sk_env"}

	dir := t.TempDir()
	script := filepath.Join(dir, "hello.sh")
	if err := os.WriteFile(script, []byte("echo from-file\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name     string
		args     []string
		stdin    string
		environ  map[string]string
		want     cliResult
		wantBody map[string]any // nil: no request expected
	}{
		{
			name: "code argument", args: []string{"print(6 * 7)"},
			want:     cliResult{Stdout: "42\n"},
			wantBody: map[string]any{"language": "python", "code": "print(6 * 7)"},
		},
		{
			name: "flags after the code as documented", args: []string{"console.log(6*7)", "--language", "javascript", "--timeout", "5"},
			want:     cliResult{Stdout: "42\n"},
			wantBody: map[string]any{"language": "javascript", "code": "console.log(6*7)", "timeout_s": 5.0},
		},
		{
			name: "program failure mirrors exit code and streams", args: []string{"fail"},
			want:     cliResult{Stdout: "partial\n", Stderr: "Traceback\nvertal run: output truncated at the per-stream limit (64 KB)\n", Exit: 3},
			wantBody: map[string]any{"language": "python", "code": "fail"},
		},
		{
			name: "timeout", args: []string{"-l", "bash", "sleep"},
			want:     cliResult{Stderr: "vertal run: timed out (5s, exe_4)\n", Exit: 137},
			wantBody: map[string]any{"language": "bash", "code": "sleep"},
		},
		{
			name: "file infers language", args: []string{script},
			want:     cliResult{Stdout: "echo from-file\n"},
			wantBody: map[string]any{"language": "bash", "code": "echo from-file\n"},
		},
		{
			name: "code from stdin", args: []string{"-", "--language", "bash"}, stdin: "echo piped",
			want:     cliResult{Stdout: "echo piped"},
			wantBody: map[string]any{"language": "bash", "code": "echo piped"},
		},
		{
			name: "stdin text", args: []string{"--stdin", "abc", "import sys; print(sys.stdin.read())"},
			want:     cliResult{Stdout: "import sys; print(sys.stdin.read())"},
			wantBody: map[string]any{"language": "python", "code": "import sys; print(sys.stdin.read())", "stdin": "abc"},
		},
		{
			name: "stdin from standard input", args: []string{"input()", "--stdin", "-"}, stdin: "line\n",
			want:     cliResult{Stdout: "input()"},
			wantBody: map[string]any{"language": "python", "code": "input()", "stdin": "line\n"},
		},
		{
			name: "api error prints code, message and request id", args: []string{"x", "--timeout", "999"},
			want:     cliResult{Stderr: "vertal run: invalid_timeout: timeout_s must be between 1 and 60 (HTTP 400, request id req_bad)\n", Exit: 125},
			wantBody: map[string]any{"language": "python", "code": "x", "timeout_s": 999.0},
		},
		{
			name: "quota error", args: []string{"quota"},
			want:     cliResult{Stderr: "vertal run: quota_exceeded: daily quota of 100 executions reached (HTTP 429, request id req_q)\n", Exit: 125},
			wantBody: map[string]any{"language": "python", "code": "quota"},
		},
		{
			name: "no key", args: []string{"print(1)"}, environ: map[string]string{"KUBO_API_URL": srv.URL},
			want: cliResult{Stderr: "vertal run: no API key: pass --key or set KUBO_API_KEY\n", Exit: 2},
		},
		{
			name: "no code", args: []string{"--json"},
			want: cliResult{Stderr: "vertal run: want exactly one CODE, FILE or -; see vertal run -h\n", Exit: 2},
		},
		{
			name: "stdin used twice", args: []string{"-", "--stdin", "-"},
			want: cliResult{Stderr: "vertal run: the code and --stdin cannot both come from standard input\n", Exit: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api.mu.Lock()
			api.bodies = nil
			api.mu.Unlock()
			en := environ
			if tc.environ != nil {
				en = tc.environ
			}
			got := runCLI(t, cmdRun, en, tc.stdin, tc.args...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			api.mu.Lock()
			bodies := api.bodies
			api.mu.Unlock()
			var want []map[string]any
			if tc.wantBody != nil {
				want = []map[string]any{tc.wantBody}
			}
			if diff := cmp.Diff(want, bodies); diff != "" {
				t.Errorf("request bodies (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCmdRunJSONAndFlagsOverrideEnv(t *testing.T) {
	api := &runAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	environ := map[string]string{"KUBO_API_URL": "http://127.0.0.1:1", "KUBO_API_KEY": "kubo_sk_env"}
	got := runCLI(t, cmdRun, environ, "", "--url", srv.URL, "--key", "kubo_sk_flag", "--json", "print(6 * 7)")
	if got.Exit != 0 || got.Stderr != "" {
		t.Fatalf("exit %d, stderr %q", got.Exit, got.Stderr)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(got.Stdout), &body); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, got.Stdout)
	}
	if body["id"] != "exe_1" || body["request_id"] != "req_1" || body["stdout"] != "42\n" {
		t.Errorf("--json printed %v, want the whole response", body)
	}
	if diff := cmp.Diff([]string{"Bearer kubo_sk_flag"}, api.auth); diff != "" {
		t.Errorf("Authorization (-want +got):\n%s", diff)
	}
}

func TestCmdRunUnreachable(t *testing.T) {
	environ := map[string]string{"KUBO_API_URL": "http://127.0.0.1:1", "KUBO_API_KEY": "kubo_sk_env"}
	got := runCLI(t, cmdRun, environ, "", "print(1)")
	if got.Exit != 125 || !strings.Contains(got.Stderr, "cannot reach http://127.0.0.1:1") {
		t.Errorf("got %+v, want exit 125 and a cannot-reach message", got)
	}
}

func TestCmdUsage(t *testing.T) {
	srv := httptest.NewServer(&runAPI{})
	defer srv.Close()
	environ := map[string]string{"KUBO_API_URL": srv.URL, "KUBO_API_KEY": "kubo_sk_env"}

	got := runCLI(t, cmdUsage, environ, "")
	want := cliResult{Stdout: `tenant  acme
plan    pro
today   3 executions, 2.635 sandbox seconds (UTC day)
limits
  executions_per_day   10000
  max_timeout_s        60
  requests_per_minute  120
`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}

	got = runCLI(t, cmdUsage, environ, "", "--json")
	var body map[string]any
	if err := json.Unmarshal([]byte(got.Stdout), &body); err != nil || body["tenant"] != "acme" {
		t.Errorf("usage --json = %q (%v)", got.Stdout, err)
	}

	got = runCLI(t, cmdUsage, map[string]string{"KUBO_API_URL": srv.URL, "KUBO_API_KEY": "k"}, "", "--url", srv.URL+"/nope")
	if got.Exit != 125 || !strings.Contains(got.Stderr, "not_found") || !strings.Contains(got.Stderr, "req_404") {
		t.Errorf("usage error = %+v", got)
	}
}

func TestCmdMCPNeedsKey(t *testing.T) {
	got := runCLI(t, cmdMCP, map[string]string{"KUBO_API_URL": "http://127.0.0.1:1"}, "")
	want := cliResult{Stderr: "vertal mcp: no API key: pass --key or set KUBO_API_KEY\n", Exit: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
