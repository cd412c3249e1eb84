package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// asyncAPI stands in for the async routes: a submit answers 202 with the
// execution queued; exe_w finishes through its event stream, exe_p has no
// stream and is found final by polling, anything else is unknown.
type asyncAPI struct {
	bodyLog
	rmu    sync.Mutex
	routes []string
}

const waitedExecution = `{"id":"exe_w","status":"failed","stdout":"partial\n","stderr":"Traceback\n","exit_code":3,"duration_ms":20,"truncated":false,"usage":{"sandbox_seconds":0.02},"request_id":"req_w","files":[{"path":"out.txt","size":3,"encoding":"base64","content":"b2sK"}],"files_truncated":false,"reason":null,"webhook":null}`

func (a *asyncAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/api")
	a.rmu.Lock()
	a.routes = append(a.routes, r.Method+" "+path)
	a.rmu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.Method + " " + path {
	case "POST /v1/executions":
		body := a.record(r)
		webhook := "null"
		if u, ok := body["webhook_url"].(string); ok {
			webhook = fmt.Sprintf(`{"url":%q,"state":"pending","attempts":0,"last_status":null,"last_error":null}`, u)
		}
		w.Header().Set("Location", "/api/v1/executions/exe_w")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"id":"exe_w","status":"queued","stdout":"","stderr":"","exit_code":0,"duration_ms":0,"truncated":false,"usage":{"sandbox_seconds":0},"request_id":"req_q","files":[],"files_truncated":false,"reason":null,"webhook":%s}`, webhook)
	case "GET /v1/executions/exe_w/events":
		streamReply(w, waitedExecution)
	case "GET /v1/executions/exe_p":
		io.WriteString(w, `{"id":"exe_p","status":"error","stdout":"","stderr":"","exit_code":0,"duration_ms":0,"truncated":false,"usage":{"sandbox_seconds":0},"request_id":"req_p","files":[],"files_truncated":false,"reason":"the node running it stopped","webhook":null}`)
	default:
		w.WriteHeader(404)
		io.WriteString(w, `{"error":{"code":"not_found","message":"no such execution"},"request_id":"req_404"}`)
	}
}

func TestCmdRunAsync(t *testing.T) {
	api := &asyncAPI{}
	srv, environ := startAPI(t, api)
	environ["KUBO_API_URL"] = srv.URL + "/api"
	for _, tc := range []struct {
		name     string
		args     []string
		want     cliResult
		wantBody map[string]any
	}{
		{
			name: "prints the id", args: []string{"--async", "print(1)", "--webhook", "https://hooks.example.com/v"},
			want:     cliResult{Stdout: "exe_w\n"},
			wantBody: map[string]any{"language": "python", "code": "print(1)", "async": true, "webhook_url": "https://hooks.example.com/v"},
		},
		{
			name: "no webhook", args: []string{"--async", "-l", "bash", "echo hi"},
			want:     cliResult{Stdout: "exe_w\n"},
			wantBody: map[string]any{"language": "bash", "code": "echo hi", "async": true},
		},
		{
			name: "a webhook needs --async", args: []string{"print(1)", "--webhook", "https://hooks.example.com/v"},
			want: cliResult{Stderr: "vertal run: --webhook needs --async: a run waited for has no webhook\n", Exit: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRequest(t, &api.bodyLog, cmdRun, environ, "", tc.args, tc.want, tc.wantBody)
		})
	}

	got := runCLI(t, cmdRun, environ, "", "--async", "--json", "print(1)")
	var queued map[string]any
	if err := json.Unmarshal([]byte(got.Stdout), &queued); err != nil || got.Exit != 0 {
		t.Fatalf("--async --json: %+v (%v)", got, err)
	}
	if queued["id"] != "exe_w" || queued["status"] != "queued" {
		t.Errorf("--async --json printed %v, want the queued execution", queued)
	}
}

func TestCmdWait(t *testing.T) {
	api := &asyncAPI{}
	_, environ := startAPI(t, api)
	out := t.TempDir()

	got := runCLI(t, cmdWait, environ, "", "exe_w", "--out", out)
	want := cliResult{Stdout: "partial\n", Stderr: "Traceback\nvertal wait: wrote " + filepath.Join(out, "out.txt") + " (3 bytes)\n", Exit: 3}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("wait (-want +got):\n%s", diff)
	}
	if b, err := os.ReadFile(filepath.Join(out, "out.txt")); err != nil || string(b) != "ok\n" {
		t.Errorf("out.txt = %q, %v", b, err)
	}

	got = runCLI(t, cmdWait, environ, "", "--json", "--out", t.TempDir(), "exe_w")
	var body map[string]any
	if err := json.Unmarshal([]byte(got.Stdout), &body); err != nil || body["id"] != "exe_w" || body["exit_code"] != 3.0 {
		t.Errorf("wait --json printed %q (%v), want the final execution", got.Stdout, err)
	}
	if got.Exit != 3 {
		t.Errorf("wait --json exit %d, want the program's 3", got.Exit)
	}

	for _, tc := range []struct {
		name string
		args []string
		want cliResult
	}{
		{
			name: "polled when there is no stream, with the reason", args: []string{"exe_p"},
			want: cliResult{Stderr: "vertal wait: the execution ended in error: the node running it stopped (exe_p, request req_p)\n", Exit: 1},
		},
		{
			name: "an unknown id", args: []string{"exe_nope"},
			want: cliResult{Stderr: "vertal wait: not_found: no such execution (HTTP 404, request id req_404)\n", Exit: 125},
		},
		{
			name: "no id", args: []string{"--json"},
			want: cliResult{Stderr: "vertal wait: want exactly one execution ID; see vertal wait -h\n", Exit: 2},
		},
		{
			name: "two ids", args: []string{"exe_a", "exe_b"},
			want: cliResult{Stderr: "vertal wait: want exactly one execution ID; see vertal wait -h\n", Exit: 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRequest(t, &api.bodyLog, cmdWait, environ, "", tc.args, tc.want, nil)
		})
	}
}
