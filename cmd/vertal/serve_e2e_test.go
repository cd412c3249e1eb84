package main

// End-to-end tests of `vertal serve`: the real binary, built here, with the
// oci driver on the real root filesystem, SQLite (and PostgreSQL for two
// nodes), spoken to over real HTTP, partly with curl as the docs show.
// They need root, an OCI runtime and the rootfs: VERTAL_E2E=1 says the
// host has them (CI always sets it).

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres/pgtest"
)

func needE2E(t *testing.T) { e2etest.Require(t, "root, an OCI runtime and the sandbox rootfs") }

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// vertalBinary builds the command once per test run, always to the same
// path so that runs do not pile binaries up in the temporary directory.
func vertalBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), "vertal-e2e-bin")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "vertal")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		// The agent of sandboxes that stay, next to vertal, where serve
		// looks for it.
		agent := exec.Command("go", "build", "-o", filepath.Join(dir, agentBinary), "../vertal-agent")
		agent.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := agent.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build vertal-agent: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// imageDir is where the rootfs lives (VERTAL_ROOTFS names the rootfs itself).
func imageDir() string {
	if r := os.Getenv("VERTAL_ROOTFS"); r != "" {
		return filepath.Dir(r)
	}
	return "/var/lib/vertal/images/default"
}

type serverProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	url     string // http://127.0.0.1:PORT
	devKey  string // printed on the first --dev start
	dataDir string
	stdout  *e2etest.Buffer
	stderr  *e2etest.Buffer
	exited  chan error
}

var (
	listenLine = regexp.MustCompile(`listening on (http://\S+)`)
	devKeyLine = regexp.MustCompile(`(?m)^  (kubo_sk_[0-9A-Za-z]{43})$`)
)

// startServer runs `vertal serve --port 0` with extra args and environment
// and waits until it prints its address (and, with --dev, its key).
func startServer(t *testing.T, dataDir string, env []string, args ...string) *serverProc {
	t.Helper()
	return startServerWith(t, exec.Command, dataDir, env, args...)
}

// startServerWith is startServer with the command built by command (for
// one that runs in a network namespace of its own, fakenet.Net.Command).
func startServerWith(t *testing.T, command func(string, ...string) *exec.Cmd, dataDir string, env []string, args ...string) *serverProc {
	t.Helper()
	full := append([]string{"serve", "--port", "0", "--data-dir", dataDir, "--image-dir", imageDir(), "--max-concurrent", "4", "--queue-timeout", "60s"}, args...)
	cmd := command(vertalBinary(t), full...)
	cmd.Env = append(os.Environ(), env...)
	p := &serverProc{t: t, cmd: cmd, dataDir: dataDir, stdout: &e2etest.Buffer{}, stderr: &e2etest.Buffer{}, exited: make(chan error, 1)}
	pr, pw := io.Pipe()
	cmd.Stdout = io.MultiWriter(p.stdout, pw)
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { err := cmd.Wait(); pw.Close(); p.exited <- err }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("server stdout:\n%s\nserver stderr (last 4000 bytes):\n%s", p.stdout, tail(p.stderr.String(), 4000))
		}
	})
	dev := false
	for _, a := range args {
		dev = dev || a == "--dev"
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := listenLine.FindStringSubmatch(sc.Text()); m != nil {
				p.url = m[1]
				if !dev {
					close(ready)
				}
			}
			if m := devKeyLine.FindStringSubmatch(sc.Text()); m != nil {
				p.devKey = m[1]
			}
			if dev && p.url != "" && (p.devKey != "" || strings.Contains(sc.Text(), "already has a key")) {
				close(ready)
				dev = false
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case <-ready:
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("vertal serve exited early: %v\nstdout: %s\nstderr: %s", err, p.stdout, p.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("vertal serve did not start in 60s\nstdout: %s\nstderr: %s", p.stdout, p.stderr)
	}
	return p
}

// stop sends SIGTERM and expects a clean exit.
func (p *serverProc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			p.t.Errorf("vertal serve exited with %v after SIGTERM", err)
		}
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		p.t.Errorf("vertal serve did not stop within 90s of SIGTERM")
	}
}

// vertal runs an operator command against the same store as the server.
func (p *serverProc) vertal(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(vertalBinary(t), args...)
	cmd.Env = append(append(os.Environ(), "VERTAL_DATA_DIR="+p.dataDir), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

type httpResult struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func call(t *testing.T, method, u, key string, body any, header map[string]string) httpResult {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	r, err := send(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// send does req and reads the whole answer, its body decoded when it is
// JSON; the error is the transport's.
func send(req *http.Request) (httpResult, error) {
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpResult{}, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := httpResult{status: res.StatusCode, header: res.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &r.body)
	return r, nil
}

// postStream POSTs body as JSON to u with key, asking for an event
// stream; the caller reads and closes the response.
func postStream(t *testing.T, u, key string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", u, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// sseEvents yields each event of the stream r as it arrives: its type and
// its data, decoded as a JSON object.
func sseEvents(r io.Reader) iter.Seq2[string, map[string]any] {
	return func(yield func(string, map[string]any) bool) {
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		typ := ""
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				typ = v
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			var ev map[string]any
			_ = json.Unmarshal([]byte(data), &ev)
			if !yield(typ, ev) {
				return
			}
		}
	}
}

func (r httpResult) code() string {
	if e, ok := r.body["error"].(map[string]any); ok {
		return fmt.Sprint(e["code"])
	}
	return ""
}

// curl runs the curl binary like the docs do and returns status and body.
func curl(t *testing.T, args ...string) (int, map[string]any, string) {
	t.Helper()
	out, err := exec.Command("curl", append([]string{"-sS", "-w", "\n%{http_code}"}, args...)...).Output()
	if err != nil {
		t.Fatalf("curl %v: %v", args, err)
	}
	s := string(out)
	i := strings.LastIndexByte(s, '\n')
	var status int
	fmt.Sscan(s[i+1:], &status)
	var body map[string]any
	_ = json.Unmarshal([]byte(s[:i]), &body)
	return status, body, s[:i]
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// TestServeE2E runs the documented flow against one server on SQLite.
func TestServeE2E(t *testing.T) {
	needE2E(t)
	dataDir := t.TempDir()
	p := startServer(t, dataDir, nil, "--dev", "--metrics-addr", "127.0.0.1:0")
	if p.devKey == "" {
		t.Fatalf("no dev key printed:\n%s", p.stdout)
	}
	base, key := p.url+"/api", p.devKey

	t.Run("Cancel", func(t *testing.T) { checkCancel(t, p, p, key, sqliteRunning(p)) })
	t.Run("Core", func(t *testing.T) { checkCore(t, p, key) })

	t.Run("DocumentedCurlQuickstart", func(t *testing.T) {
		status, body, raw := curl(t, "-X", "POST", base+"/v1/executions",
			"-H", "Authorization: Bearer "+key,
			"-H", "Content-Type: application/json",
			"-d", `{"language": "python", "code": "print(6 * 7)"}`)
		if status != 200 || body["status"] != "succeeded" || body["stdout"] != "42\n" || body["stderr"] != "" || body["exit_code"] != 0.0 || body["truncated"] != false {
			t.Fatalf("%d %s", status, raw)
		}
		want := []string{"created_at", "duration_ms", "exit_code", "files", "files_truncated", "finished_at", "id", "image", "image_version", "language", "reason", "request_id", "started_at", "status", "stderr", "stdout", "truncated", "usage", "webhook"}
		if diff := cmp.Diff(want, keys(body)); diff != "" {
			t.Errorf("fields (-want +got):\n%s", diff)
		}
		// No image named: the default one, at the build GET /v1/images shows.
		if got, want := []any{body["image"], body["image_version"]}, []any{"default", imageVersion(t, base, key, "default")}; !cmp.Equal(want, got) {
			t.Errorf("image, image_version = %v, want %v", got, want)
		}
		// Rounded to the millisecond: a warm print(6 * 7) can take less.
		if u := body["usage"].(map[string]any); u["sandbox_seconds"] == nil || u["sandbox_seconds"].(float64) < 0 {
			t.Errorf("usage %v", u)
		}
		if !regexp.MustCompile(`^exe_[0-9a-f]{32}$`).MatchString(body["id"].(string)) || !regexp.MustCompile(`^req_[0-9a-f]{32}$`).MatchString(body["request_id"].(string)) {
			t.Errorf("ids %v %v", body["id"], body["request_id"])
		}
	})

	t.Run("CurlStreamAndAttach", func(t *testing.T) {
		out, err := exec.Command("curl", "-sS", "-N", "-D", "-", base+"/v1/executions",
			"-H", "Authorization: Bearer "+key, "-H", "Accept: text/event-stream", "-H", "Content-Type: application/json",
			"-d", `{"language": "bash", "code": "echo one; echo two >&2; echo three", "files": [{"path": "a.txt", "content": "aGk=", "encoding": "base64"}], "return_files": ["*.txt"]}`).Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		head, stream, _ := strings.Cut(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n\n")
		if !strings.HasPrefix(head, "HTTP/1.1 200") || !strings.Contains(strings.ToLower(head), "content-type: text/event-stream") ||
			!strings.Contains(strings.ToLower(head), "cache-control: no-store") || !strings.Contains(strings.ToLower(head), "x-request-id: req_") {
			t.Fatalf("headers:\n%s", head)
		}
		var types, ids []string
		var result map[string]any
		for _, block := range strings.Split(strings.TrimSpace(stream), "\n\n") {
			var id, typ, data string
			for _, l := range strings.Split(block, "\n") {
				if v, ok := strings.CutPrefix(l, "id: "); ok {
					id = v
				} else if v, ok := strings.CutPrefix(l, "event: "); ok {
					typ = v
				} else if v, ok := strings.CutPrefix(l, "data: "); ok {
					data = v
				}
			}
			if typ == "" {
				continue // a heartbeat comment
			}
			types, ids = append(types, typ), append(ids, id)
			if typ == "result" {
				_ = json.Unmarshal([]byte(data), &result)
			}
		}
		if len(types) < 3 || types[0] != "started" || ids[0] != "0-0" || types[len(types)-1] != "result" || ids[len(ids)-1] != "end" {
			t.Fatalf("events %v ids %v\n%s", types, ids, stream)
		}
		if ids[len(ids)-2] != "10-4" || result["stdout"] != "one\nthree\n" || result["stderr"] != "two\n" || result["files_truncated"] != false {
			t.Errorf("ids %v result %v", ids, result)
		}
		files, _ := result["files"].([]any)
		if len(files) != 1 || files[0].(map[string]any)["path"] != "a.txt" || files[0].(map[string]any)["content"] != "aGk=" || files[0].(map[string]any)["encoding"] != "base64" {
			t.Errorf("returned files %v", result["files"])
		}
		// The stored stream, resumed after the end, is empty; an unknown id is 404.
		status, _, raw := curl(t, base+"/v1/executions/"+result["id"].(string)+"/events", "-H", "Authorization: Bearer "+key, "-H", "Last-Event-ID: end")
		if status != 200 || strings.Contains(raw, "event:") {
			t.Errorf("attach after end: %d %q", status, raw)
		}
		if status, body, raw := curl(t, base+"/v1/executions/exe_00000000000000000000000000000000/events", "-H", "Authorization: Bearer "+key); status != 404 || body["error"].(map[string]any)["code"] != "not_found" {
			t.Errorf("attach unknown: %d %s", status, raw)
		}
	})

	t.Run("DocumentedCurlIdempotency", func(t *testing.T) {
		args := []string{base + "/v1/executions",
			"-H", "Authorization: Bearer " + key,
			"-H", "Idempotency-Key: order-1234",
			"-H", "Content-Type: application/json",
			"-d", `{"language": "python", "code": "print(6 * 7)"}`}
		s1, first, _ := curl(t, args...)
		s2, second, raw := curl(t, args...)
		if s1 != 200 || s2 != 200 || second["idempotent_replay"] != true || second["id"] != first["id"] || second["stdout"] != "42\n" {
			t.Fatalf("replay: %d %d %s", s1, s2, raw)
		}
		args[len(args)-1] = `{"language": "python", "code": "print(6 * 8)"}`
		if s, body, raw := curl(t, args...); s != 409 || body["error"].(map[string]any)["code"] != "idempotency_conflict" {
			t.Errorf("conflict: %d %s", s, raw)
		}
	})

	t.Run("DocumentedCurlGetUsageHealthOpenAPI", func(t *testing.T) {
		_, run, _ := curl(t, "-X", "POST", base+"/v1/executions", "-H", "Authorization: Bearer "+key, "-H", "Content-Type: application/json",
			"-d", `{"language": "javascript", "code": "console.log(6*7)"}`)
		s, got, raw := curl(t, base+"/v1/executions/"+run["id"].(string), "-H", "Authorization: Bearer "+key)
		if s != 200 || got["language"] != "javascript" || got["stdout"] != "42\n" || got["created_at"].(float64) < 1.7e9 {
			t.Errorf("get: %d %s", s, raw)
		}
		s, usage, raw := curl(t, base+"/v1/usage", "-H", "Authorization: Bearer "+key)
		limits, _ := usage["limits"].(map[string]any)
		if s != 200 || usage["tenant"] != "local" || usage["plan"] != "pro" || limits["executions_per_day"] != 10000.0 ||
			limits["requests_per_minute"] != 120.0 || limits["max_timeout_s"] != 60.0 || usage["today"].(map[string]any)["executions"].(float64) < 3 {
			t.Errorf("usage: %d %s", s, raw)
		}
		for _, u := range []string{p.url + "/health", base + "/health"} {
			if s, h, raw := curl(t, u); s != 200 || h["status"] != "ok" || h["version"] == "" {
				t.Errorf("%s: %d %s", u, s, raw)
			}
		}
		if s, doc, _ := curl(t, base+"/v1/openapi.json"); s != 200 || doc["openapi"] != "3.1.0" {
			t.Errorf("openapi: %d", s)
		}
		if s, langs, raw := curl(t, base+"/v1/languages", "-H", "Authorization: Bearer "+key); s != 200 || !strings.Contains(raw, `"name":"python","version":"3.`) {
			t.Errorf("languages: %d %s %v", s, raw, langs)
		}
	})

	t.Run("Outcomes", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			body   map[string]any
			status string
			exit   float64
			stdout string
		}{
			{"python fails", map[string]any{"language": "py", "code": "import sys\nprint('x')\nsys.exit(3)"}, "failed", 3, "x\n"},
			{"bash", map[string]any{"language": "bash", "code": "echo $((6*7))"}, "succeeded", 0, "42\n"},
			{"node", map[string]any{"language": "node", "code": "console.log(6*7)"}, "succeeded", 0, "42\n"},
			{"stdin", map[string]any{"language": "python", "code": "import sys\nprint(sys.stdin.read().upper(), end='')", "stdin": "hello\n"}, "succeeded", 0, "HELLO\n"},
			{"timeout", map[string]any{"language": "python", "code": "while True: pass", "timeout_s": 1}, "timed_out", -1, ""},
			{"memory", map[string]any{"language": "python", "code": "x = bytearray(2 << 30)\nprint('allocated')"}, "memory_exceeded", -1, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := call(t, "POST", base+"/v1/executions", key, tc.body, nil)
				if r.status != 200 || r.body["status"] != tc.status || (tc.exit >= 0 && r.body["exit_code"] != tc.exit) || (tc.stdout != "" && r.body["stdout"] != tc.stdout) {
					t.Errorf("%d %s", r.status, r.raw)
				}
			})
		}
		r := call(t, "POST", base+"/v1/executions", key, map[string]any{"language": "python", "code": "print('x' * 200000)"}, nil)
		if r.status != 200 || r.body["truncated"] != true || len(r.body["stdout"].(string)) != 64<<10 {
			t.Errorf("truncated: %d %v %d", r.status, r.body["truncated"], len(fmt.Sprint(r.body["stdout"])))
		}
	})

	t.Run("Errors", func(t *testing.T) {
		for _, tc := range []struct {
			method, path, key, body, ctype string
			status                         int
			code                           string
		}{
			{"GET", "/v1/usage", "", "", "", 401, "unauthorized"},
			{"GET", "/v1/usage", "kubo_sk_" + strings.Repeat("A", 43), "", "", 401, "unauthorized"},
			{"POST", "/v1/executions", key, `{"language":"python","code":"x","timeout_s":999}`, "application/json", 400, "invalid_timeout"},
			{"POST", "/v1/executions", key, `{"language":"ruby","code":"x"}`, "application/json", 400, "unsupported_language"},
			{"POST", "/v1/executions", key, `{"language":"python","code":"x"`, "application/json", 400, "invalid_json"},
			{"POST", "/v1/executions", key, `{"language":"python","code":"x"}`, "text/plain", 400, "invalid_content_type"},
			{"POST", "/v1/executions", key, `{"language":"python","code":"` + strings.Repeat("x", 600<<10) + `"}`, "application/json", 413, "payload_too_large"},
			{"GET", "/v1/executions/exe_00000000000000000000000000000000", key, "", "", 404, "not_found"},
			{"GET", "/v1/nothing", key, "", "", 404, "not_found"},
			{"DELETE", "/v1/executions", key, "", "", 405, "method_not_allowed"},
		} {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			var e struct {
				Error     map[string]string `json:"error"`
				RequestID string            `json:"request_id"`
			}
			_ = json.Unmarshal(raw, &e)
			if res.StatusCode != tc.status || e.Error["code"] != tc.code || e.RequestID != res.Header.Get("X-Request-ID") || e.Error["message"] == "" {
				t.Errorf("%s %s: %d %s", tc.method, tc.path, res.StatusCode, tail(string(raw), 300))
			}
		}
	})

	t.Run("KeysFromTheCLIAndRotation", func(t *testing.T) {
		out, _, err := p.vertal(t, nil, "create-key", "acme", "--plan", "free")
		newKey := strings.TrimSpace(out)
		if err != nil || !strings.HasPrefix(newKey, "kubo_sk_") {
			t.Fatalf("create-key: %v %q", err, out)
		}
		r := call(t, "GET", base+"/v1/usage", newKey, nil, nil)
		if r.status != 200 || r.body["tenant"] != "acme" || r.body["plan"] != "free" {
			t.Fatalf("new key on the running server: %d %s", r.status, r.raw)
		}
		rot := call(t, "POST", base+"/v1/keys/rotate", newKey, nil, nil)
		if rot.status != 200 || rot.body["plan"] != "free" {
			t.Fatalf("rotate: %d %s", rot.status, rot.raw)
		}
		if r := call(t, "GET", base+"/v1/usage", newKey, nil, nil); r.status != 401 {
			t.Errorf("rotated-out key: %d", r.status)
		}
		rotated := rot.body["api_key"].(string)
		if _, _, err := p.vertal(t, nil, "revoke-key", rot.body["key_id"].(string)); err != nil {
			t.Fatal(err)
		}
		if r := call(t, "GET", base+"/v1/usage", rotated, nil, nil); r.status != 401 || r.code() != "unauthorized" {
			t.Errorf("revoked key: %d %s", r.status, r.raw)
		}
		list, _, _ := p.vertal(t, nil, "list-keys")
		if strings.Contains(list, "kubo_sk_") || !strings.Contains(list, "acme") {
			t.Errorf("list-keys:\n%s", list)
		}
	})

	t.Run("Metrics", func(t *testing.T) {
		var addr string
		for _, l := range strings.Split(p.stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "metrics listening" {
				addr = m["addr"].(string)
			}
		}
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		for _, want := range []string{`vertal_executions_total{language="python",status="succeeded"}`, "vertal_sandboxes_in_use 0", "vertal_queue_depth 0",
			`vertal_http_request_duration_seconds_bucket{route="/v1/executions",le="+Inf"}`,
			"vertal_connections_open ", "go_goroutines ", "process_open_fds ", "process_max_fds "} {
			if !strings.Contains(string(b), want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})

	t.Run("PlaygroundMounted", func(t *testing.T) {
		res, err := http.Get(p.url + "/")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
			t.Errorf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
	})

	// Last: the log holds no key, no code.
	t.Run("LogsHoldNoKeys", func(t *testing.T) {
		logs := p.stderr.String()
		if strings.Contains(logs, "kubo_sk_") || strings.Contains(logs, "print(6 * 7)") || strings.Contains(logs, "bytearray") {
			t.Errorf("server log leaks a key or code")
		}
		if !strings.Contains(logs, `"tenant":"local"`) {
			t.Errorf("access log lacks tenants")
		}
	})

	// A restart keeps keys and does not print the dev key again.
	p.stop()
	p2 := startServer(t, dataDir, nil, "--dev")
	if p2.devKey != "" || !strings.Contains(p2.stdout.String(), "already has a key") {
		t.Errorf("second dev start printed:\n%s", p2.stdout)
	}
	if r := call(t, "GET", p2.url+"/api/v1/usage", key, nil, nil); r.status != 200 {
		t.Errorf("key after restart: %d", r.status)
	}
}

// TestServeEdgeSecretE2E: with VERTAL_EDGE_SECRET set, only /health is
// reachable without the header.
func TestServeEdgeSecretE2E(t *testing.T) {
	needE2E(t)
	const secret = "e2e-edge-secret-0123456789"
	p := startServer(t, t.TempDir(), []string{"VERTAL_EDGE_SECRET=" + secret}, "--dev")
	if r := call(t, "GET", p.url+"/health", "", nil, nil); r.status != 200 {
		t.Errorf("health: %d", r.status)
	}
	if r := call(t, "GET", p.url+"/api/v1/usage", p.devKey, nil, nil); r.status != 403 || r.code() != "forbidden" {
		t.Errorf("without secret: %d %s", r.status, r.raw)
	}
	r := call(t, "POST", p.url+"/api/v1/executions", p.devKey, map[string]any{"language": "bash", "code": "echo 42"}, map[string]string{"X-Vertal-Edge-Secret": secret})
	if r.status != 200 || r.body["stdout"] != "42\n" {
		t.Errorf("with secret: %d %s", r.status, r.raw)
	}
	if strings.Contains(p.stderr.String(), secret) || strings.Contains(p.stdout.String(), secret) {
		t.Errorf("the edge secret was printed")
	}
}

// newDatabase makes an empty PostgreSQL database for one test.
func newDatabase(t *testing.T) string {
	t.Helper()
	if os.Getenv(pgtest.EnvVar) == "" {
		t.Skip("VERTAL_TEST_DATABASE_URL is not set (CI sets it; scripts/postgres.sh prints one)")
	}
	return pgtest.NewDatabase(t)
}

// TestTwoNodesOnPostgres: two servers on one database share keys, the
// daily quota (a burst split across both never exceeds it), idempotency
// keys and revocation.
func TestTwoNodesOnPostgres(t *testing.T) {
	needE2E(t)
	dbURL := newDatabase(t)
	cfgFile := filepath.Join(t.TempDir(), "vertal.json")
	if err := os.WriteFile(cfgFile, []byte(`{"plans": {"burst": {"executions_per_day": 20, "requests_per_minute": 1000, "max_timeout_s": 10, "memory_mb": 128, "max_concurrent": 16}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"VERTAL_DATABASE_URL=" + dbURL, "VERTAL_CONFIG=" + cfgFile}
	a := startServer(t, t.TempDir(), env, "--dev")
	b := startServer(t, t.TempDir(), env)
	nodes := []*serverProc{a, b}

	// Shared keys: the dev key made on node A works on B.
	if r := call(t, "GET", b.url+"/api/v1/usage", a.devKey, nil, nil); r.status != 200 || r.body["tenant"] != "local" {
		t.Fatalf("dev key on node B: %d %s", r.status, r.raw)
	}
	if strings.Contains(a.stdout.String(), "vertal:vertal@") || strings.Contains(a.stderr.String(), dbURL) {
		t.Errorf("the database URL (with its password) was printed")
	}

	t.Run("QuotaBurstAcrossNodes", func(t *testing.T) {
		out, _, err := a.vertal(t, env, "create-key", "bursty", "--plan", "burst")
		if err != nil {
			t.Fatal(err)
		}
		key := strings.TrimSpace(out)
		const n = 30
		statuses := make([]int, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := call(t, "POST", nodes[i%2].url+"/api/v1/executions", key, map[string]any{"language": "bash", "code": "echo 42"}, nil)
				statuses[i] = r.status
			}()
		}
		wg.Wait()
		count := map[int]int{}
		for _, s := range statuses {
			count[s]++
		}
		if diff := cmp.Diff(map[int]int{200: 20, 429: 10}, count); diff != "" {
			t.Errorf("statuses (-want +got):\n%s", diff)
		}
		for _, nd := range nodes {
			if r := call(t, "GET", nd.url+"/api/v1/usage", key, nil, nil); r.body["today"].(map[string]any)["executions"] != 20.0 {
				t.Errorf("usage on %s: %s", nd.url, r.raw)
			}
		}
	})

	t.Run("IdempotencyAcrossNodes", func(t *testing.T) {
		body := map[string]any{"language": "python", "code": "import time\ntime.sleep(0.5)\nprint('once')"}
		hdr := map[string]string{"Idempotency-Key": "two-nodes-1"}
		before := call(t, "GET", a.url+"/api/v1/usage", a.devKey, nil, nil).body["today"].(map[string]any)["executions"].(float64)
		results := make([]httpResult, 6)
		var wg sync.WaitGroup
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = call(t, "POST", nodes[i%2].url+"/api/v1/executions", a.devKey, body, hdr)
			}()
		}
		wg.Wait()
		ids := map[any]bool{}
		for _, r := range results {
			if r.status != 200 || r.body["stdout"] != "once\n" {
				t.Errorf("%d %s", r.status, r.raw)
			}
			ids[r.body["id"]] = true
		}
		after := call(t, "GET", b.url+"/api/v1/usage", a.devKey, nil, nil).body["today"].(map[string]any)["executions"].(float64)
		if len(ids) != 1 || after-before != 1 {
			t.Errorf("ids %v, executions counted %v (want one run)", ids, after-before)
		}
		// A later replay on either node.
		if r := call(t, "POST", b.url+"/api/v1/executions", a.devKey, body, hdr); r.body["idempotent_replay"] != true || !ids[r.body["id"]] {
			t.Errorf("replay on B: %s", r.raw)
		}
	})

	// A run on A canceled through B: B records the cancel, A polls for it.
	t.Run("CancelAcrossNodes", func(t *testing.T) {
		checkCancel(t, a, b, a.devKey, func() (string, error) {
			conn, err := pgx.Connect(t.Context(), dbURL)
			if err != nil {
				return "", err
			}
			defer conn.Close(context.Background())
			var id string
			err = conn.QueryRow(t.Context(), `SELECT id FROM executions WHERE status = 'running'`).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				return "", nil
			}
			return id, err
		})
	})

	t.Run("RevocationAcrossNodes", func(t *testing.T) {
		out, _, err := a.vertal(t, env, "create-key", "leaver", "--plan", "pro")
		if err != nil {
			t.Fatal(err)
		}
		key := strings.TrimSpace(out)
		if r := call(t, "GET", b.url+"/api/v1/usage", key, nil, nil); r.status != 200 {
			t.Fatalf("before: %d", r.status)
		}
		rot := call(t, "POST", a.url+"/api/v1/keys/rotate", key, nil, nil)
		if rot.status != 200 {
			t.Fatalf("rotate on A: %d %s", rot.status, rot.raw)
		}
		if r := call(t, "GET", b.url+"/api/v1/usage", key, nil, nil); r.status != 401 {
			t.Errorf("rotated-out key on B: %d", r.status)
		}
		newKey := rot.body["api_key"].(string)
		if r := call(t, "GET", b.url+"/api/v1/usage", newKey, nil, nil); r.status != 200 {
			t.Errorf("new key on B: %d", r.status)
		}
		if _, _, err := b.vertal(t, env, "revoke-key", rot.body["key_id"].(string)); err != nil {
			t.Fatal(err)
		}
		for _, nd := range nodes {
			if r := call(t, "GET", nd.url+"/api/v1/usage", newKey, nil, nil); r.status != 401 {
				t.Errorf("revoked key on %s: %d", nd.url, r.status)
			}
		}
	})
}

// TestServeDockerE2E: the same server on the docker driver, with runc and
// with gVisor.
func TestServeDockerE2E(t *testing.T) {
	needE2E(t)
	img := os.Getenv("VERTAL_DOCKER_IMAGE")
	if img == "" {
		img = "vertal/default:latest"
	}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			p := startServer(t, t.TempDir(), nil, "--dev", "--driver", "docker", "--runtime", rt, "--docker-image", img)
			r := call(t, "POST", p.url+"/api/v1/executions", p.devKey, map[string]any{"language": "python", "code": "print(6 * 7)"}, nil)
			if r.status != 200 || r.body["stdout"] != "42\n" || r.body["status"] != "succeeded" {
				t.Errorf("%d %s", r.status, r.raw)
			}
			t.Run("Cancel", func(t *testing.T) { checkCancel(t, p, p, p.devKey, sqliteRunning(p)) })
			t.Run("Core", func(t *testing.T) { checkCore(t, p, p.devKey) })
			if !strings.Contains(p.stdout.String(), "docker/"+rt) {
				t.Errorf("banner does not name docker/%s:\n%s", rt, p.stdout)
			}
		})
	}
}

// checkCancel starts a long program on runOn, finds its id with running()
// once it is stored as running, and cancels it through cancelOn: the run
// must end canceled at once (not after its sleep), GET must show the state
// at each step, and a second cancel must be 409 execution_finished.
func checkCancel(t *testing.T, runOn, cancelOn *serverProc, key string, running func() (string, error)) {
	t.Helper()
	start := time.Now()
	posted := make(chan httpResult, 1)
	go func() {
		posted <- call(t, "POST", runOn.url+"/api/v1/executions", key,
			map[string]any{"language": "python", "code": "import time\nprint('started', flush=True)\ntime.sleep(50)", "timeout_s": 60}, nil)
	}()
	var id string
	for deadline := time.Now().Add(30 * time.Second); id == ""; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no running execution in the store after 30 s")
		}
		var err error
		if id, err = running(); err != nil {
			t.Fatal(err)
		}
	}
	if r := call(t, "GET", cancelOn.url+"/api/v1/executions/"+id, key, nil, nil); r.status != 200 || r.body["status"] != "running" || r.body["finished_at"] != nil {
		t.Errorf("GET while running: %d %s", r.status, r.raw)
	}
	if r := call(t, "POST", cancelOn.url+"/api/v1/executions/"+id+"/cancel", key, nil, nil); r.status != 200 || (r.body["status"] != "canceled" && r.body["status"] != "running") {
		t.Errorf("cancel: %d %s", r.status, r.raw)
	}
	r := <-posted
	if r.status != 200 || r.body["status"] != "canceled" || r.body["id"] != id {
		t.Errorf("the canceled run answered %d %s", r.status, r.raw)
	}
	if d := time.Since(start); d > 40*time.Second {
		t.Errorf("the canceled run took %v: the cancel did not end it", d)
	}
	if r := call(t, "GET", cancelOn.url+"/api/v1/executions/"+id, key, nil, nil); r.body["status"] != "canceled" || r.body["finished_at"] == nil {
		t.Errorf("GET after cancel: %d %s", r.status, r.raw)
	}
	if r := call(t, "POST", cancelOn.url+"/api/v1/executions/"+id+"/cancel", key, nil, nil); r.status != 409 || r.body["error"].(map[string]any)["code"] != "execution_finished" {
		t.Errorf("second cancel: %d %s", r.status, r.raw)
	}
}

// sqliteRunning finds a running execution in p's SQLite store.
func sqliteRunning(p *serverProc) func() (string, error) {
	return func() (string, error) {
		db, err := sql.Open("sqlite", filepath.Join(p.dataDir, "vertal.db"))
		if err != nil {
			return "", err
		}
		defer db.Close()
		var id string
		err = db.QueryRow(`SELECT id FROM executions WHERE status = 'running'`).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return "", nil
		}
		return id, err
	}
}

// TestServeFirstStartQuietE2E: the first start of `serve --dev` on a fresh
// data directory shows our banner first; River's migration and poll-mode
// lines are not in the log at the default level.
func TestServeFirstStartQuietE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil, "--dev")
	if p.devKey == "" {
		t.Fatalf("no development key printed on the first start:\n%s", p.stdout)
	}
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(line, "rivermigrate") || strings.Contains(line, "Applied migration") ||
			strings.Contains(line, "does not support listener") || strings.Contains(line, "River client") {
			t.Errorf("River's start-up line in the log: %s", line)
		}
	}
}
