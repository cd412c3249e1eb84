package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSandboxTwoNodesOnPostgres: two nodes share one PostgreSQL. A
// sandbox created on A answers every kind of call made to B (commands,
// a streamed command, files both ways, a background command's events,
// and the E2B API's control and data planes),
// forwarded to A and counted once against the rate; when A is SIGKILLed,
// B first answers 503 to retry, then, once A is taken for stopped, ends
// the sandbox as node_lost.
func TestSandboxTwoNodesOnPostgres(t *testing.T) {
	needE2E(t)
	dbURL := newDatabase(t)
	env := []string{"VERTAL_DATABASE_URL=" + dbURL}
	flags := []string{"--node-timeout", "3s"}
	a := startServer(t, t.TempDir(), env, append([]string{"--node-id", "node-a"}, flags...)...)
	b := startServer(t, t.TempDir(), env, append([]string{"--node-id", "node-b"}, flags...)...)
	out, _, err := a.vertal(t, env, "create-key", "agent-author", "--plan", "pro")
	key := strings.TrimSpace(out)
	if err != nil || !strings.HasPrefix(key, "kubo_sk_") {
		t.Fatalf("create-key: %v %q", err, out)
	}
	id := createSandbox(t, a, key, map[string]any{"timeout_s": 300})

	// Commands through B run in A's sandbox, which keeps its state.
	sbxRun(t, a, key, id, "echo from-a > note.txt")
	r := sbxCall(t, b, key, "POST", id, "/commands", map[string]any{"cmd": "cat note.txt; echo from-b >> note.txt"})
	if r.status != 200 || r.body["stdout"] != "from-a\n" {
		t.Fatalf("command through B: %d %s", r.status, r.raw)
	}
	if rl := r.header.Values("X-RateLimit-Remaining"); len(rl) != 1 {
		t.Errorf("X-RateLimit-Remaining %v: want one count, the owner's", rl)
	}
	if ids := r.header.Values("X-Request-ID"); len(ids) != 1 || !strings.Contains(r.raw, ids[0]) {
		t.Errorf("X-Request-ID %v: want one, the same in the body %s", ids, r.raw)
	}

	// Files: uploaded through B, read through A, and the other way.
	if st, raw := sbxRaw(t, b, key, "PUT", id, "/home/user/up.txt", []byte("via b")); st != 200 {
		t.Fatalf("upload through B: %d %s", st, raw)
	}
	if st, got := sbxRaw(t, a, key, "GET", id, "/home/user/up.txt", nil); st != 200 || string(got) != "via b" {
		t.Fatalf("read on A: %d %q", st, got)
	}
	if st, got := sbxRaw(t, b, key, "GET", id, "/home/user/note.txt", nil); st != 200 || string(got) != "from-a\nfrom-b\n" {
		t.Fatalf("read through B: %d %q", st, got)
	}

	// A streamed command through B: its events arrive as they happen.
	req, _ := http.NewRequest("POST", b.url+"/v1/sandboxes/"+id+"/commands", strings.NewReader(`{"cmd":"echo one; sleep 1; echo two"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	var seen strings.Builder
	firstAt := time.Duration(0)
	for {
		n, err := res.Body.Read(buf)
		seen.Write(buf[:n])
		if firstAt == 0 && strings.Contains(seen.String(), "one") {
			firstAt = time.Since(start)
		}
		if err != nil {
			break
		}
	}
	res.Body.Close()
	total := time.Since(start)
	if !strings.Contains(seen.String(), "event: stdout") || !strings.Contains(seen.String(), "two") || !strings.Contains(seen.String(), "event: result") {
		t.Fatalf("streamed command through B: %q", seen.String())
	}
	// Ordering, not speed: the first line came through before the
	// command's second, a second later, was written.
	if firstAt >= total-500*time.Millisecond {
		t.Errorf("the first event arrived at %v of %v: the proxy buffered the stream", firstAt, total)
	}

	// A background command started through B, attached through B.
	r = sbxCall(t, b, key, "POST", id, "/commands", map[string]any{"cmd": "echo bg-out", "background": true})
	if r.status/100 != 2 {
		t.Fatalf("background through B: %d %s", r.status, r.raw)
	}
	pid := strconv.Itoa(int(r.body["pid"].(float64)))
	ev, err := http.NewRequest("GET", b.url+"/v1/sandboxes/"+id+"/commands/"+pid+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	ev.Header.Set("Authorization", "Bearer "+key)
	evRes, err := http.DefaultClient.Do(ev)
	if err != nil {
		t.Fatal(err)
	}
	evBody, _ := io.ReadAll(evRes.Body)
	evRes.Body.Close()
	if evRes.StatusCode != 200 || !strings.Contains(string(evBody), "bg-out") {
		t.Fatalf("events through B: %d %q", evRes.StatusCode, evBody)
	}

	// The E2B API: a sandbox created on A is reached through B on both
	// planes, its data plane by the sandbox's own token.
	e2b := func(srv *serverProc, method, path, token, sbx string, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.url+"/e2b"+path, strings.NewReader(body))
		if token == "" {
			req.Header.Set("X-API-KEY", key)
		} else {
			req.Header.Set("X-Access-Token", token)
			req.Header.Set("E2b-Sandbox-Id", sbx)
			req.Header.Set("Connect-Protocol-Version", "1")
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	st, raw := e2b(a, "POST", "/v2/sandboxes", "", "", `{"templateID":"base","timeout":120}`)
	var e2bSbx struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(raw), &e2bSbx); err != nil || st != 201 {
		t.Fatalf("E2B create on A: %d %s", st, raw)
	}
	if st, raw := e2b(b, "POST", "/files?path=/home/user/e2b.txt", e2bSbx.EnvdAccessToken, e2bSbx.SandboxID, "through b"); st != 200 {
		t.Errorf("E2B upload through B: %d %s", st, raw)
	}
	if st, raw := e2b(a, "GET", "/files?path=/home/user/e2b.txt", e2bSbx.EnvdAccessToken, e2bSbx.SandboxID, ""); st != 200 || raw != "through b" {
		t.Errorf("E2B read on A: %d %q", st, raw)
	}
	if st, raw := e2b(b, "POST", "/filesystem.Filesystem/Stat", "wrong", e2bSbx.SandboxID, `{"path":"/home/user"}`); st != 401 {
		t.Errorf("E2B Stat through B with a wrong token: %d %s, want 401", st, raw)
	}
	if st, raw := e2b(b, "DELETE", "/sandboxes/"+e2bSbx.SandboxID, "", "", ""); st != 204 {
		t.Errorf("E2B kill through B: %d %s", st, raw)
	}

	// A dies: B cannot reach the sandbox (503, retry), then takes A for
	// stopped and ends the sandbox as node_lost.
	_ = a.cmd.Process.Kill()
	<-a.exited
	r = sbxCall(t, b, key, "POST", id, "/commands", map[string]any{"cmd": "echo hi"})
	if r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Errorf("command while A is dead: %d %s, want 503 with Retry-After", r.status, r.raw)
	}
	waitFor(t, func() bool {
		g := sbxCall(t, b, key, "GET", id, "", nil)
		return g.status == 200 && g.body["status"] == "ended" && g.body["reason"] == "node_lost"
	})
	if r := sbxCall(t, b, key, "POST", id, "/commands", map[string]any{"cmd": "echo hi"}); r.status != 409 {
		t.Errorf("command on the lost sandbox: %d %s, want 409", r.status, r.raw)
	}
}
