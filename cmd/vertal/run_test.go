package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// runAPI stands in for the Vertal Run API: it answers executions from a
// table keyed by code and records the request bodies.
type runAPI struct {
	bodyLog
	hmu     sync.Mutex
	auth    []string
	accepts []string
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
	"returns":          {200, `{"id":"exe_5","status":"succeeded","stdout":"","stderr":"","exit_code":0,"duration_ms":9,"truncated":false,"usage":{"sandbox_seconds":0.009},"request_id":"req_5","files":[{"path":"chart.png","size":4,"encoding":"base64","content":"iVBORw=="},{"path":"out/deep/r.txt","size":3,"encoding":"base64","content":"b2sK"}],"files_truncated":true}`},
	"hostile":          {200, `{"id":"exe_6","status":"succeeded","stdout":"","stderr":"","exit_code":0,"duration_ms":9,"truncated":false,"usage":{"sandbox_seconds":0.009},"request_id":"req_6","files":[{"path":"../escape.txt","size":1,"encoding":"base64","content":"eA=="},{"path":"/abs.txt","size":1,"encoding":"base64","content":"eA=="},{"path":"link/x.txt","size":1,"encoding":"base64","content":"eA=="},{"path":"final","size":1,"encoding":"base64","content":"eA=="},{"path":"ok.txt","size":1,"encoding":"base64","content":"eA=="}],"files_truncated":false}`},
	"broken":           {200, ""},
	"fetch":            {200, fetchExecution},
	"quota":            {429, `{"error":{"code":"quota_exceeded","message":"daily quota of 100 executions reached"},"request_id":"req_q"}`},
}

// fetchExecution is a run with a network: one connection made, one
// refused.
const fetchExecution = `{"id":"exe_7","status":"failed","stdout":"200\n","stderr":"URLError\n","exit_code":1,"duration_ms":812,"truncated":false,` +
	`"usage":{"sandbox_seconds":0.812,"network_bytes_in":5120,"network_bytes_out":312},"request_id":"req_7",` +
	`"network":{"allow":["pypi.org"],"bytes_in":5120,"bytes_out":312,"connections":1,"refused":1,"attempts":[` +
	`{"host":"pypi.org","port":443,"kind":"tls","allowed":true,"bytes_out":312,"bytes_in":5120},` +
	`{"host":"example.com","port":443,"kind":"tls","allowed":false,"reason":"example.com is not in the allowlist","bytes_out":0,"bytes_in":0}]}}`

func (a *runAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	a.hmu.Lock()
	a.auth = append(a.auth, r.Header.Get("Authorization"))
	a.accepts = append(a.accepts, r.Header.Get("Accept"))
	a.hmu.Unlock()
	switch strings.TrimPrefix(r.URL.Path, "/api") {
	case "/v1/executions":
		body := a.record(r)
		code, _ := body["code"].(string)
		rep, ok := runReplies[strings.TrimSpace(code)]
		if !ok { // echo the code so tests can see what was sent
			out, _ := json.Marshal(map[string]any{"id": "exe_e", "status": "succeeded", "stdout": code, "stderr": "", "exit_code": 0,
				"duration_ms": 1, "truncated": false, "usage": map[string]any{"sandbox_seconds": 0.001}, "request_id": "req_e"})
			rep.status, rep.body = 200, string(out)
		}
		if r.Header.Get("Accept") == "text/event-stream" && rep.status == 200 {
			streamReply(w, rep.body)
			return
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

// streamReply sends an execution as the API streams it: started, its
// stdout and stderr, then the result. An empty execution stands for a
// platform failure after the start: an error event.
func streamReply(w http.ResponseWriter, execution string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Request-ID", "req_sse")
	event := func(id, name string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", id, name, b)
		w.(http.Flusher).Flush()
	}
	if execution == "" {
		event("0-0", "started", map[string]string{"id": "exe_b", "language": "python"})
		event("end", "error", map[string]any{"error": map[string]string{"code": "internal", "message": "the sandbox failed"}})
		return
	}
	var ex struct {
		ID, Stdout, Stderr string
	}
	json.Unmarshal([]byte(execution), &ex)
	event("0-0", "started", map[string]string{"id": ex.ID, "language": "python"})
	io.WriteString(w, ": heartbeat\n\n")
	if ex.Stdout != "" {
		event(fmt.Sprintf("%d-0", len(ex.Stdout)), "stdout", map[string]string{"text": ex.Stdout})
	}
	if ex.Stderr != "" {
		event(fmt.Sprintf("%d-%d", len(ex.Stdout), len(ex.Stderr)), "stderr", map[string]string{"text": ex.Stderr})
	}
	event("end", "result", json.RawMessage(execution))
}

func TestCmdRun(t *testing.T) {
	api := &runAPI{}
	srv, _ := startAPI(t, api)
	environ := map[string]string{"KUBO_API_URL": srv.URL + "/api", "KUBO_API_KEY": "kubo_sk_env"}

	dir := t.TempDir()
	script := filepath.Join(dir, "hello.sh")
	if err := os.WriteFile(script, []byte("echo from-file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tsFile := filepath.Join(dir, "t.ts")
	if err := os.WriteFile(tsFile, []byte("console.log(1)\n"), 0o644); err != nil {
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
			name: "a file name that names no file is not code", args: []string{"plott.py"},
			want: cliResult{Stderr: "vertal run: plott.py: no such file (to run text as code, pass the code itself or - for standard input)\n", Exit: 2},
		},
		{
			name: "an unknown extension is not code", args: []string{"t.ts"},
			want: cliResult{Stderr: "vertal run: t.ts: no such file, and \".ts\" is no language's extension\n", Exit: 2},
		},
		{
			name: "a file with an unknown extension needs --language", args: []string{tsFile},
			want: cliResult{Stderr: "vertal run: " + tsFile + ": the extension \".ts\" is no language's; name one with --language\n", Exit: 2},
		},
		{
			name: "a file with an unknown extension and --language", args: []string{tsFile, "-l", "javascript"},
			want:     cliResult{Stdout: "console.log(1)\n"},
			wantBody: map[string]any{"language": "javascript", "code": "console.log(1)\n"},
		},
		{
			name: "stdin used twice", args: []string{"-", "--stdin", "-"},
			want: cliResult{Stderr: "vertal run: the code and --stdin cannot both come from standard input\n", Exit: 2},
		},
		{
			name: "--allow narrows the plan's allowlist", args: []string{"print(6 * 7)", "--allow", "pypi.org", "--allow", "*.pythonhosted.org"},
			want:     cliResult{Stdout: "42\n"},
			wantBody: map[string]any{"language": "python", "code": "print(6 * 7)", "network": map[string]any{"allow": []any{"pypi.org", "*.pythonhosted.org"}}},
		},
		{
			name: "--no-network asks for none", args: []string{"--no-network", "print(6 * 7)"},
			want:     cliResult{Stdout: "42\n"},
			wantBody: map[string]any{"language": "python", "code": "print(6 * 7)", "network": map[string]any{"allow": []any{}}},
		},
		{
			name: "--async carries the network", args: []string{"--async", "--allow", "pypi.org", "print(6 * 7)"},
			want:     cliResult{Stdout: "exe_1\n"},
			wantBody: map[string]any{"language": "python", "code": "print(6 * 7)", "async": true, "network": map[string]any{"allow": []any{"pypi.org"}}},
		},
		{
			name: "--allow and --no-network", args: []string{"--allow", "pypi.org", "--no-network", "print(1)"},
			want: cliResult{Stderr: "vertal run: --allow and --no-network cannot go together\n", Exit: 2},
		},
		{
			name: "an empty --allow", args: []string{"--allow=", "print(1)"},
			want: cliResult{Stderr: "invalid value \"\" for flag -allow: want a host name, *.suffix or an address range (--no-network for none)\nvertal run: see vertal run -h for the flags\n", Exit: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			en := environ
			if tc.environ != nil {
				en = tc.environ
			}
			checkRequest(t, &api.bodyLog, cmdRun, en, tc.stdin, tc.args, tc.want, tc.wantBody)
		})
	}
}

func TestCmdRunJSONAndFlagsOverrideEnv(t *testing.T) {
	api := &runAPI{}
	srv, _ := startAPI(t, api)
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

// A run with a network prints nothing more than its program's output;
// with --json the network record and its usage bytes are there as the
// API gave them.
func TestCmdRunNetworkRecord(t *testing.T) {
	_, environ := startAPI(t, &runAPI{})
	for _, args := range [][]string{{"fetch"}, {"fetch", "--no-stream"}} {
		got := runCLI(t, cmdRun, environ, "", args...)
		if diff := cmp.Diff(cliResult{Stdout: "200\n", Stderr: "URLError\n", Exit: 1}, got); diff != "" {
			t.Errorf("%v (-want +got):\n%s", args, diff)
		}
	}
	got := runCLI(t, cmdRun, environ, "", "fetch", "--json", "--allow", "pypi.org")
	if got.Exit != 1 || got.Stderr != "" {
		t.Fatalf("exit %d, stderr %q", got.Exit, got.Stderr)
	}
	var printed, sent struct {
		Network json.RawMessage `json:"network"`
		Usage   json.RawMessage `json:"usage"`
	}
	if err := json.Unmarshal([]byte(got.Stdout), &printed); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, got.Stdout)
	}
	json.Unmarshal([]byte(fetchExecution), &sent)
	for _, f := range []struct {
		name      string
		got, want json.RawMessage
	}{{"network", printed.Network, sent.Network}, {"usage", printed.Usage, sent.Usage}} {
		var g, w any
		json.Unmarshal(f.got, &g)
		json.Unmarshal(f.want, &w)
		if diff := cmp.Diff(w, g); diff != "" {
			t.Errorf("--json %s (-want +got):\n%s", f.name, diff)
		}
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
	srv, environ := startAPI(t, &runAPI{})

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

func TestCmdRunStreamsUnlessAskedNot(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		wantAccept string
	}{
		{[]string{"print(6 * 7)"}, "text/event-stream"},
		{[]string{"--no-stream", "print(6 * 7)"}, "application/json"},
		{[]string{"print(6 * 7)", "--json"}, "application/json"},
	} {
		api := &runAPI{}
		_, environ := startAPI(t, api)
		got := runCLI(t, cmdRun, environ, "", tc.args...)
		if got.Exit != 0 || got.Stderr != "" || !strings.Contains(got.Stdout, "42") {
			t.Errorf("%v: %+v", tc.args, got)
		}
		if diff := cmp.Diff([]string{tc.wantAccept}, api.accepts); diff != "" {
			t.Errorf("%v: Accept (-want +got):\n%s", tc.args, diff)
		}
	}
}

func TestCmdRunFilesEnvArgs(t *testing.T) {
	api := &runAPI{}
	_, environ := startAPI(t, api)
	environ["TOKEN"] = "from-here"
	dir := t.TempDir()
	csv := filepath.Join(dir, "data.csv")
	bin := filepath.Join(dir, "blob.bin")
	colon := filepath.Join(dir, "a:b.txt")
	for name, content := range map[string]string{csv: "a,b\n1,2\n", bin: "\x00\xff", colon: "c"} {
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := runCLI(t, cmdRun, environ, "", "import sys", "--file", csv, "--file", bin+":in/blob.bin", "--file", colon,
		"--env", "MODE=fast", "--env", "EQ=a=b", "--env", "TOKEN", "--arg", "--n", "--return", "*.png", "--return", "out/**", "--", "x y", "-z")
	if got.Exit != 0 {
		t.Fatalf("%+v", got)
	}
	want := []map[string]any{{
		"language": "python", "code": "import sys",
		"files": []any{
			map[string]any{"path": "data.csv", "content": "a,b\n1,2\n", "encoding": "utf8"},
			map[string]any{"path": "in/blob.bin", "content": "AP8=", "encoding": "base64"},
			map[string]any{"path": "a:b.txt", "content": "c", "encoding": "utf8"},
		},
		"env":          map[string]any{"MODE": "fast", "EQ": "a=b", "TOKEN": "from-here"},
		"args":         []any{"--n", "x y", "-z"},
		"return_files": []any{"*.png", "out/**"},
	}}
	if diff := cmp.Diff(want, api.take()); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}

	// `vertal run -- CODE ARGS` takes the code from after the --.
	if got := runCLI(t, cmdRun, environ, "", "-l", "bash", "--", "echo", "a"); got.Exit != 0 {
		t.Fatalf("%+v", got)
	}
	if diff := cmp.Diff([]map[string]any{{"language": "bash", "code": "echo", "args": []any{"a"}}}, api.take()); diff != "" {
		t.Errorf("-- CODE ARGS (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--file", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"--file", dir}, "is not a regular file"},
		{[]string{"--env", "UNSET_HERE"}, "UNSET_HERE is not set here"},
		{[]string{"--env", "=v"}, "want NAME=VALUE"},
	} {
		got := runCLI(t, cmdRun, environ, "", append(tc.args, "print(1)")...)
		if got.Exit != 2 || !strings.Contains(got.Stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, got.Exit, got.Stderr, tc.want)
		}
		// The error and a one-line hint, not the whole usage after it.
		if n := strings.Count(got.Stderr, "\n"); n > 2 || strings.Contains(got.Stderr, "usage:") {
			t.Errorf("%v: %d lines on stderr, want the error and a hint:\n%s", tc.args, n, got.Stderr)
		}
	}
}

func TestCmdRunWritesReturnedFiles(t *testing.T) {
	_, environ := startAPI(t, &runAPI{})
	for _, stream := range []string{"", "--no-stream"} {
		t.Run("stream="+stream, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "results")
			args := []string{"returns", "--return", "*", "--out", out}
			if stream != "" {
				args = append(args, stream)
			}
			got := runCLI(t, cmdRun, environ, "", args...)
			want := cliResult{Stderr: "vertal run: returned files truncated at the plan's limit (count or size)\n" +
				"vertal run: wrote " + filepath.Join(out, "chart.png") + " (4 bytes)\n" +
				"vertal run: wrote " + filepath.Join(out, "out", "deep", "r.txt") + " (3 bytes)\n"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			for path, content := range map[string]string{"chart.png": "\x89PNG", "out/deep/r.txt": "ok\n"} {
				if b, err := os.ReadFile(filepath.Join(out, path)); err != nil || string(b) != content {
					t.Errorf("%s = %q, %v; want %q", path, b, err, content)
				}
			}
		})
	}
}

// Returned paths are the server's: none of them may write outside --out
// or through a symlink there.
func TestCmdRunRefusesHostileReturnedPaths(t *testing.T) {
	api := &runAPI{}
	_, environ := startAPI(t, api)
	base := t.TempDir()
	out, elsewhere := filepath.Join(base, "out"), filepath.Join(base, "elsewhere")
	for _, d := range []string{out, elsewhere} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(elsewhere, filepath.Join(out, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(elsewhere, "target"), filepath.Join(out, "final")); err != nil {
		t.Fatal(err)
	}
	got := runCLI(t, cmdRun, environ, "", "hostile", "--return", "*", "--out", out)
	for _, want := range []string{
		`not writing returned file "../escape.txt"`, `not writing returned file "/abs.txt"`,
		`not writing returned file "link/x.txt": link is a symlink`, `not writing returned file "final": final exists and is not a regular file`,
		"wrote " + filepath.Join(out, "ok.txt") + " (1 bytes)", "vertal run: 4 of 5 returned files were not written\n",
	} {
		if !strings.Contains(got.Stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, got.Stderr)
		}
	}
	if got.Exit != 1 {
		t.Errorf("exit %d, want 1", got.Exit)
	}
	var found []string
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(base, p)
			found = append(found, rel)
		}
		return nil
	})
	if diff := cmp.Diff([]string{"out/final", "out/link", "out/ok.txt"}, found); diff != "" {
		t.Errorf("files under the test directory (-want +got):\n%s", diff)
	}
}

// notifyWriter collects writes and reports each one.
type notifyWriter struct {
	mu     sync.Mutex
	b      strings.Builder
	writes chan string
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.b.Write(p)
	w.mu.Unlock()
	w.writes <- string(p)
	return len(p), nil
}

// The output of a run reaches the terminal while the program still runs:
// the server holds the result back until the first chunk was written.
func TestCmdRunWritesOutputAsItArrives(t *testing.T) {
	release := make(chan struct{})
	_, environ := startAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: 0-0\nevent: started\ndata: {\"id\":\"exe_l\",\"language\":\"python\"}\n\n")
		io.WriteString(w, "id: 6-0\nevent: stdout\ndata: {\"text\":\"first\\n\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "id: 6-4\nevent: stderr\ndata: {\"text\":\"err\\n\"}\n\n")
		io.WriteString(w, "id: end\nevent: result\ndata: {\"id\":\"exe_l\",\"status\":\"failed\",\"stdout\":\"first\\n\",\"stderr\":\"err\\n\",\"exit_code\":7,\"duration_ms\":3,\"truncated\":false,\"usage\":{\"sandbox_seconds\":0.003},\"request_id\":\"req_l\",\"files\":[],\"files_truncated\":false}\n\n")
	}))
	stdout := &notifyWriter{writes: make(chan string, 10)}
	var stderr bytes.Buffer
	e := &env{Stdin: strings.NewReader(""), Stdout: stdout, Stderr: &stderr,
		Getenv: func(k string) string { return environ[k] }}
	done := make(chan error, 1)
	go func() { done <- cmdRun(context.Background(), e, []string{"print('first')"}) }()
	select {
	case got := <-stdout.writes:
		if got != "first\n" {
			t.Errorf("first write %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no output while the run was still going")
	}
	close(release)
	err := <-done
	if code, ok := err.(exitCode); !ok || code != 7 {
		t.Errorf("err = %v, want exit status 7", err)
	}
	if stdout.b.String() != "first\n" || stderr.String() != "err\n" {
		t.Errorf("stdout %q stderr %q: the result's output must not be printed again", stdout.b.String(), stderr.String())
	}
}

func TestCmdRunErrorEvent(t *testing.T) {
	_, environ := startAPI(t, &runAPI{})
	got := runCLI(t, cmdRun, environ, "", "broken")
	want := cliResult{Stderr: "vertal run: internal: the sandbox failed (request id req_sse)\n", Exit: 125}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestCmdRunJSONWritesNoFiles: with --json and no --out the returned
// files stay in the printed document; nothing lands in the current
// directory. With --out they are written there as well.
func TestCmdRunJSONWritesNoFiles(t *testing.T) {
	_, environ := startAPI(t, &runAPI{})
	cwd := t.TempDir()
	t.Chdir(cwd)
	got := runCLI(t, cmdRun, environ, "", "returns", "--return", "*", "--json")
	if !strings.Contains(got.Stdout, "chart.png") {
		t.Errorf("--json document lacks the returned file:\n%s", got.Stdout)
	}
	if ents, err := os.ReadDir(cwd); err != nil || len(ents) != 0 {
		t.Errorf("--json wrote into the current directory: %v %v\nstderr: %s", ents, err, got.Stderr)
	}
	out := filepath.Join(t.TempDir(), "results")
	got = runCLI(t, cmdRun, environ, "", "returns", "--return", "*", "--json", "--out", out)
	if b, err := os.ReadFile(filepath.Join(out, "chart.png")); err != nil || string(b) != "\x89PNG" {
		t.Errorf("--json --out: chart.png = %q, %v\nstderr: %s", b, err, got.Stderr)
	}
}
