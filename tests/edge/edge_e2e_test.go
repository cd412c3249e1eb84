package edge_test

// The Worker for real: `wrangler dev` (workerd, from cloudflare/node_modules,
// installed by `npm ci` in scripts/setup.sh test) in front of a real
// `vertal serve --dev` with an edge secret, the oci driver and the sandbox
// image. Nothing here reaches Cloudflare: wrangler runs with telemetry,
// error reports, its update check and the request.cf download switched off,
// and a config directory of its own, so no login is ever read.
//
// Gated by VERTAL_E2E=1 (root, an OCI runtime, the sandbox image).

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// edgeMaxBody is the Worker's MAX_BODY_BYTES here: far below what the
// origin accepts from a pro key, so a 413 can only come from the edge.
const edgeMaxBody = 64 << 10

const edgeSecret = "edge-secret-for-tests-0123456789"

// wranglerEnv keeps wrangler off Cloudflare: no usage data, no error
// reports, no request.cf download (local fallback values instead), no
// banner (whose update check asks the npm registry), no interactive
// session, and XDG_CONFIG_HOME of its own so no saved login is used.
func wranglerEnv(configHome string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "CLOUDFLARE_") || strings.HasPrefix(kv, "WRANGLER_") || strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"WRANGLER_SEND_METRICS=false",
		"WRANGLER_SEND_ERROR_REPORTS=false",
		"CLOUDFLARE_CF_FETCH_ENABLED=false",
		"WRANGLER_HIDE_BANNER=true",
		"XDG_CONFIG_HOME="+configHome,
		"CI=true",
	)
}

// process is a command started in its own process group, so that stopping
// it stops its children too (wrangler runs workerd). Its output goes to a
// file, which the test reads while it runs.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// output is what the process has printed so far.
func (p *process) output() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func start(t *testing.T, name string, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{name: name, cmd: cmd, logPath: filepath.Join(t.TempDir(), "output.log"), exited: make(chan struct{})}
	f, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s output (last 6000 bytes):\n%s", name, tail(p.output(), 6000))
		}
	})
	return p
}

// waitFor waits until the process's output matches re and returns the match.
func (p *process) waitFor(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	deadline := time.After(d)
	for {
		if m := re.FindStringSubmatch(p.output()); m != nil {
			return m
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited early:\n%s", p.name, tail(p.output(), 6000))
		case <-deadline:
			t.Fatalf("%s printed no %q in %s:\n%s", p.name, re, d, tail(p.output(), 6000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

type edgeSetup struct {
	origin string // http://127.0.0.1:PORT of vertal serve
	edge   string // http://127.0.0.1:PORT of wrangler dev
	key    string // the --dev key (plan pro)
	server *process
}

var (
	listenLine = regexp.MustCompile(`listening on (http://\S+)`)
	devKeyLine = regexp.MustCompile(`(?m)^  (kubo_sk_[0-9A-Za-z]{43})$`)
	readyLine  = regexp.MustCompile(`Ready on (http://\S+)`)
	requestID  = regexp.MustCompile(`^req_[0-9a-f]{32}$`)
)

func startEdge(t *testing.T) edgeSetup {
	t.Helper()
	root := repoRoot(t)
	wrangler := filepath.Join(root, "cloudflare", "node_modules", ".bin", "wrangler")
	if _, err := os.Stat(wrangler); err != nil {
		t.Fatalf("%v: run `npm ci` in cloudflare/ (scripts/setup.sh test does)", err)
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "vertal")
	build := exec.Command("go", "build", "-o", bin, "./cmd/vertal")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The agent of sandboxes that stay, where serve looks for it, for the
	// E2B API's subtest.
	agent := exec.Command("go", "build", "-o", filepath.Join(tmp, "vertal-agent"), "./cmd/vertal-agent")
	agent.Dir, agent.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := agent.CombinedOutput(); err != nil {
		t.Fatalf("go build vertal-agent: %v\n%s", err, out)
	}
	imageDir := "/var/lib/vertal/images/default"
	if r := os.Getenv("VERTAL_ROOTFS"); r != "" {
		imageDir = filepath.Dir(r)
	}
	srv := exec.Command(bin, "serve", "--dev", "--host", "127.0.0.1", "--port", "0",
		"--data-dir", filepath.Join(tmp, "data"), "--image-dir", imageDir)
	// The secret through the environment, as the flag's help advises.
	srv.Env = append(os.Environ(), "VERTAL_EDGE_SECRET="+edgeSecret)
	server := start(t, "vertal serve", srv)
	origin := server.waitFor(t, listenLine, 90*time.Second)[1]
	key := server.waitFor(t, devKeyLine, 30*time.Second)[1]

	// The secret goes in like `wrangler secret put` would put it: not as
	// a var on the command line.
	secrets := filepath.Join(tmp, "edge.env")
	if err := os.WriteFile(secrets, []byte("EDGE_SECRET="+edgeSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := e2etest.FreePort(t)
	wd := exec.Command(wrangler, "dev", "--ip", "127.0.0.1", "--port", strconv.Itoa(port),
		"--inspector-port", strconv.Itoa(e2etest.FreePort(t)), "--show-interactive-dev-session=false",
		"--persist-to", filepath.Join(tmp, "wrangler-state"), "--env-file", secrets,
		"--var", "ORIGIN_URL:"+origin, "--var", "MAX_BODY_BYTES:"+strconv.Itoa(edgeMaxBody),
		"--log-level", "info")
	wd.Dir = filepath.Join(root, "cloudflare")
	wd.Env = wranglerEnv(filepath.Join(tmp, "xdg-config"))
	edgeProc := start(t, "wrangler dev", wd)
	edge := edgeProc.waitFor(t, readyLine, 90*time.Second)[1]
	return edgeSetup{origin: origin, edge: strings.TrimRight(edge, "/"), key: key, server: server}
}

// client does not ask for gzip, so what is timed is what the relay sends.
var client = &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 2 * time.Minute}

type errorShape struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id"`
}

func do(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s %s: %v", req.Method, req.URL, err)
	}
	return resp, body
}

func executionRequest(t *testing.T, url, key string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/api/v1/executions", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return req
}

func executionBody(code string) []byte {
	b, _ := json.Marshal(map[string]any{"language": "python", "code": code})
	return b
}

// wantError checks an answer in the API's error shape.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code string) errorShape {
	t.Helper()
	var e errorShape
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("answer is not the error shape: %v\n%s", err, body)
	}
	if resp.StatusCode != status || e.Error.Code != code || e.Error.Message == "" || !requestID.MatchString(e.RequestID) {
		t.Fatalf("got %d %s, want %d with code %q, a message and a request id", resp.StatusCode, body, status, code)
	}
	return e
}

// streamedBody sends b in small pieces with pauses and no Content-Length,
// as a client streaming its upload does.
func streamedBody(b []byte) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		for len(b) > 0 {
			n := min(len(b), 4096)
			if _, err := pw.Write(b[:n]); err != nil {
				return // the relay refused the body; nobody reads on
			}
			b = b[n:]
			time.Sleep(2 * time.Millisecond)
		}
		pw.Close()
	}()
	return pr
}

func TestEdgeWorker(t *testing.T) {
	e2etest.Require(t, "root, an OCI runtime and the sandbox image, to run the Worker in front of a real server")
	e := startEdge(t)

	t.Run("a call through the Worker succeeds", func(t *testing.T) {
		req := executionRequest(t, e.edge, e.key, bytes.NewReader(executionBody("print(sum(range(10)))")))
		// A client's own secret header is replaced, not relayed.
		req.Header.Set(api.EdgeSecretHeader, "forged")
		resp, body := do(t, req)
		var got struct{ Status, Stdout string }
		if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != http.StatusOK || got.Status != "succeeded" || got.Stdout != "45\n" {
			t.Fatalf("got %d %s (%v), want 200 succeeded with stdout 45", resp.StatusCode, body, err)
		}
		if !requestID.MatchString(resp.Header.Get("X-Request-ID")) {
			t.Errorf("no origin X-Request-ID relayed: %q", resp.Header.Get("X-Request-ID"))
		}
	})

	t.Run("the origin refuses a direct call without the secret", func(t *testing.T) {
		for _, secret := range []string{"", "not-the-edge-secret-0123456789"} {
			req := executionRequest(t, e.origin, e.key, bytes.NewReader(executionBody("print(1)")))
			if secret != "" {
				req.Header.Set(api.EdgeSecretHeader, secret)
			}
			resp, body := do(t, req)
			wantError(t, resp, body, http.StatusForbidden, "forbidden")
		}
	})

	t.Run("a request body streamed without Content-Length is relayed", func(t *testing.T) {
		// About 20 KiB, under the edge's cap, in 4 KiB pieces.
		code := "x = '" + strings.Repeat("a", 20<<10) + "'\nprint(len(x))"
		req := executionRequest(t, e.edge, e.key, streamedBody(executionBody(code)))
		req.ContentLength = -1
		resp, body := do(t, req)
		var got struct{ Status, Stdout string }
		if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != http.StatusOK || got.Stdout != "20480\n" {
			t.Fatalf("got %d %s (%v), want 200 with stdout 20480", resp.StatusCode, tail(string(body), 500), err)
		}
	})

	t.Run("an oversized body is refused at the edge", func(t *testing.T) {
		// Valid JSON the origin would run (a pro key may send far more),
		// so only the edge can refuse it.
		code := "print(1) # " + strings.Repeat("a", edgeMaxBody)
		seen := len(e.server.output())
		for _, tc := range []struct {
			name     string
			body     func() io.Reader
			declared bool
		}{
			{"with Content-Length", func() io.Reader { return bytes.NewReader(executionBody(code)) }, true},
			{"streamed", func() io.Reader { return streamedBody(executionBody(code + strings.Repeat("b", 2*edgeMaxBody))) }, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				req := executionRequest(t, e.edge, e.key, tc.body())
				if !tc.declared {
					req.ContentLength = -1
				}
				resp, body := do(t, req)
				got := wantError(t, resp, body, http.StatusRequestEntityTooLarge, "payload_too_large")
				if !strings.Contains(got.Error.Message, "edge") {
					t.Errorf("message %q does not say the edge refused it", got.Error.Message)
				}
			})
		}
		// The origin never ran them: a body with Content-Length never left
		// the edge, and a streamed one reached it cut short.
		time.Sleep(500 * time.Millisecond)
		if after := e.server.output()[seen:]; strings.Contains(after, `"execution_id"`) {
			t.Errorf("the origin ran an oversized request:\n%s", after)
		}
	})

	t.Run("an event stream arrives as the program runs", func(t *testing.T) {
		code := "import time\nprint('tick', flush=True)\ntime.sleep(3)\nprint('tock')"
		req := executionRequest(t, e.edge, e.key, bytes.NewReader(executionBody(code)))
		req.Header.Set("Accept", "text/event-stream")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("got %d %s %s, want a 200 event stream", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		var tick, result time.Time
		var events []string
		sc := bufio.NewScanner(resp.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
				events = append(events, event)
			case strings.HasPrefix(line, "data: ") && event == "stdout" && tick.IsZero() && strings.Contains(line, "tick"):
				tick = time.Now()
			case strings.HasPrefix(line, "data: ") && event == "result":
				result = time.Now()
				if !strings.Contains(line, `"status":"succeeded"`) || !strings.Contains(line, `tick\ntock\n`) {
					t.Errorf("result event %s, want succeeded with both lines", line)
				}
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("reading the stream: %v (events so far: %v)", err, events)
		}
		if tick.IsZero() || result.IsZero() {
			t.Fatalf("events %v: want a stdout event with tick and a result", events)
		}
		// The program sleeps 3 s between its lines: a relay that held the
		// stream back would deliver both at once.
		if gap := result.Sub(tick); gap < 2*time.Second {
			t.Errorf("tick came %s before the result, want at least 2s: the stream was buffered (events %v)", gap, events)
		}
	})

	t.Run("E2B's control and data planes through the Worker", func(t *testing.T) {
		// What E2B's SDK sends with E2B_API_URL=E2B_SANDBOX_URL=<edge>/api/e2b.
		req, _ := http.NewRequest(http.MethodPost, e.edge+"/api/e2b/v2/sandboxes", strings.NewReader(`{"templateID":"base","timeout":60}`))
		req.Header.Set("X-API-KEY", e.key)
		req.Header.Set("Content-Type", "application/json")
		resp, body := do(t, req)
		var sb struct{ SandboxID, EnvdAccessToken string }
		if err := json.Unmarshal(body, &sb); err != nil || resp.StatusCode != http.StatusCreated || sb.EnvdAccessToken == "" {
			t.Fatalf("create: %d %s (%v)", resp.StatusCode, body, err)
		}
		stat := func(token string) (*http.Response, []byte) {
			req, _ := http.NewRequest(http.MethodPost, e.edge+"/api/e2b/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/home/user"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Connect-Protocol-Version", "1")
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", "49983")
			if token != "" {
				req.Header.Set("X-Access-Token", token)
			}
			resp, body := do(t, req)
			if resp.Header.Get("Content-Encoding") == "gzip" {
				// connect-go compresses for the Worker, which asked for gzip;
				// this client did not, so it unpacks what came.
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			return resp, body
		}
		if resp, body := stat(sb.EnvdAccessToken); resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"FILE_TYPE_DIRECTORY"`)) {
			t.Errorf("Stat through the Worker: %d %s", resp.StatusCode, body)
		}
		if resp, body := stat(""); resp.StatusCode != http.StatusUnauthorized || !bytes.Contains(body, []byte(`"unauthenticated"`)) {
			t.Errorf("Stat without the token: %d %s, want 401 unauthenticated", resp.StatusCode, body)
		}
		req, _ = http.NewRequest(http.MethodDelete, e.edge+"/api/e2b/sandboxes/"+sb.SandboxID, nil)
		req.Header.Set("X-API-KEY", e.key)
		if resp, body := do(t, req); resp.StatusCode != http.StatusNoContent {
			t.Errorf("kill: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("the pricing page shows each plan's limits", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, e.edge+"/pricing", nil)
		resp, body := do(t, req)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /pricing: %d", resp.StatusCode)
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != web.ContentSecurityPolicy {
			t.Errorf("CSP %q, want the server's %q", got, web.ContentSecurityPolicy)
		}
		page := string(body)
		for name, p := range config.DefaultPlans() {
			row := regexp.MustCompile(`<tr data-plan="` + name + `">(.*?)</tr>`).FindStringSubmatch(page)
			if row == nil {
				t.Errorf("no row for plan %s", name)
				continue
			}
			b, _ := json.Marshal(p)
			var limits map[string]int64
			_ = json.Unmarshal(b, &limits)
			for field, v := range limits {
				if want := fmt.Sprintf(`data-field="%s" data-value="%d"`, field, v); !strings.Contains(row[1], want) {
					t.Errorf("plan %s: row has no %s", name, want)
				}
			}
		}
	})

	t.Run("the site and the docs are served with the CSP", func(t *testing.T) {
		for _, tc := range []struct {
			path, contentType, contains string
			status                      int
		}{
			{"/", "text/html", "Run untrusted code", 200},
			{"/_site/style.css", "text/css", "table.plans", 200},
			{"/docs/", "text/html", "Quickstart", 200}, // rendered by the origin
			{"/docs/api", "text/html", "/v1/executions", 200},
			{"/playground", "text/html", "<html", 200},
			// Text from the URL is escaped, never markup.
			{"/x&y'z", "text/html", "x&amp;y&#39;z", 404},
		} {
			req, _ := http.NewRequest(http.MethodGet, e.edge+tc.path, nil)
			resp, body := do(t, req)
			if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.contentType) || !bytes.Contains(body, []byte(tc.contains)) {
				t.Errorf("GET %s: %d %s, want %d %s containing %q:\n%s", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, tc.contentType, tc.contains, tail(string(body), 400))
			}
			if got := resp.Header.Get("Content-Security-Policy"); got != web.ContentSecurityPolicy {
				t.Errorf("GET %s: CSP %q, want %q", tc.path, got, web.ContentSecurityPolicy)
			}
		}
	})
}

// TestWorkerDeployDryRun bundles the Worker as `wrangler deploy` would,
// without uploading it (Cloudflare is out of reach here): the deploy
// workflow's bundle builds, and the config binds ORIGIN_URL and
// MAX_BODY_BYTES but never the secret.
func TestWorkerDeployDryRun(t *testing.T) {
	e2etest.Require(t, "npm ci in cloudflare/, to bundle the Worker with wrangler")
	root := repoRoot(t)
	tmp := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "cloudflare", "node_modules", ".bin", "wrangler"),
		"deploy", "--dry-run", "--outdir", filepath.Join(tmp, "out"))
	cmd.Dir = filepath.Join(root, "cloudflare")
	cmd.Env = wranglerEnv(filepath.Join(tmp, "xdg-config"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("wrangler deploy --dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{"env.ORIGIN_URL", "env.MAX_BODY_BYTES", "--dry-run: exiting now"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	if bytes.Contains(out, []byte("EDGE_SECRET")) {
		t.Errorf("EDGE_SECRET is bound from the config; it must only be a Worker secret:\n%s", out)
	}
	bundle, err := os.ReadFile(filepath.Join(tmp, "out", "worker.js"))
	if err != nil {
		t.Fatal(err)
	}
	// The generated facts are in the bundle, not fetched at run time.
	if !bytes.Contains(bundle, []byte("executions_per_day")) {
		t.Errorf("the bundle does not contain platform.json")
	}
}
