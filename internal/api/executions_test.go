package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

func TestRunCode(t *testing.T) {
	env := newEnv(t)
	res := env.run("python", "print(6 * 7)", nil)
	if res.status != http.StatusOK {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	var got wire.Execution
	if err := decodeStrict(res.body, &got); err != nil {
		t.Fatal(err)
	}
	want := wire.Execution{
		ID: got.ID, Status: "succeeded", Stdout: "42\n", Stderr: "", ExitCode: 0, DurationMS: 265, Truncated: false,
		Usage:    wire.ExecutionUsage{SandboxSeconds: 0.265, CPUSeconds: 0.02, PeakMemoryBytes: 9 << 20},
		Language: "python", Image: ptr("default"), CreatedAt: got.CreatedAt, StartedAt: &got.CreatedAt, FinishedAt: &got.CreatedAt,
		Files: []wire.ReturnedFile{}, RequestID: res.header.Get("X-Request-ID"),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}
	if !execution.ValidID(got.ID) || !requestIDRe.MatchString(got.RequestID) {
		t.Errorf("ids %q %q", got.ID, got.RequestID)
	}
	if d := got.CreatedAt - testStart.Unix(); d < 0 || d > 60 {
		t.Errorf("created_at %d, clock started at %d", got.CreatedAt, testStart.Unix())
	}
	spec := env.driver.lastSpec()
	if spec.ID != got.ID || spec.Timeout != 10*time.Second || spec.Limits.MemoryBytes != 512<<20 || spec.Language.Name != "python" || spec.Language.Image != "/img/rootfs" {
		t.Errorf("driver got spec %+v", spec)
	}
	for h, want := range map[string]string{
		"X-Quota-Limit": "10000", "X-Quota-Remaining": "9999", "X-RateLimit-Limit": "120", "X-RateLimit-Remaining": "119",
		"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
	} {
		if got := res.header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
}

func TestLanguagesAndAliases(t *testing.T) {
	env := newEnv(t)
	for _, tc := range []struct{ in, want string }{
		{"python", "python"}, {"py", "python"}, {"python3", "python"}, {"Python", "python"},
		{"javascript", "javascript"}, {"js", "javascript"}, {"node", "javascript"}, {"nodejs", "javascript"},
		{"bash", "bash"}, {"sh", "bash"}, {" BASH ", "bash"},
	} {
		res := env.run(tc.in, "which", nil)
		if res.status != http.StatusOK {
			t.Errorf("%q: %d %s", tc.in, res.status, res.body)
			continue
		}
		if got := decode(t, res)["language"]; got != tc.want {
			t.Errorf("%q ran as %v, want %s", tc.in, got, tc.want)
		}
	}
	res := env.do(request{path: "/v1/languages"})
	want := `{"languages":[{"name":"bash","version":"5.2.15","aliases":["sh"]},{"name":"javascript","version":"22.23.5","aliases":["js","node","nodejs"]},{"name":"python","version":"3.11.2","aliases":["py","python3"]}]}` + "\n"
	if diff := cmp.Diff(want, string(res.body)); diff != "" {
		t.Errorf("languages (-want +got):\n%s", diff)
	}
}

// TestOutcomes: whatever the program does, a finished execution is a 200.
func TestOutcomes(t *testing.T) {
	env := newEnv(t)
	for _, tc := range []struct {
		code, status string
		exit         float64
	}{
		{"print(6 * 7)", "succeeded", 0},
		{"exit 3", "failed", 3},
		{"loop", "timed_out", 137},
		{"hog", "memory_exceeded", 137},
	} {
		m := decodeOK(t, tc.code, env.run("python", tc.code, nil))
		if m["status"] != tc.status || m["exit_code"] != tc.exit {
			t.Errorf("%s: status %v exit %v, want %s %v", tc.code, m["status"], m["exit_code"], tc.status, tc.exit)
		}
	}
}

func TestTimeoutDefaultsAndPlanCap(t *testing.T) {
	env := newEnv(t, withPlans(map[string]config.Plan{
		"pro":  config.DefaultPlans()["pro"],
		"tiny": {ExecutionsPerDay: 10, RequestsPerMinute: 100, MaxTimeoutS: 5, MemoryMB: 128},
	}))
	tiny, _ := env.newKey("small", "tiny")
	for _, tc := range []struct {
		key     string
		body    string
		status  int
		timeout time.Duration
	}{
		{env.key, `{"language":"bash","code":"x"}`, 200, 10 * time.Second},
		{env.key, `{"language":"bash","code":"x","timeout_s":60}`, 200, 60 * time.Second},
		{env.key, `{"language":"bash","code":"x","timeout_s":1.5}`, 200, 1500 * time.Millisecond},
		{env.key, `{"language":"bash","code":"x","timeout_s":null}`, 200, 10 * time.Second},
		{tiny, `{"language":"bash","code":"x"}`, 200, 5 * time.Second},
		{tiny, `{"language":"bash","code":"x","timeout_s":6}`, 400, 0},
	} {
		before := env.driver.runs.Load()
		res := env.do(request{method: "POST", path: "/v1/executions", key: tc.key, body: tc.body})
		if res.status != tc.status {
			t.Errorf("%s: status %d %s", tc.body, res.status, res.body)
			continue
		}
		if tc.status == 200 {
			if got := env.driver.lastSpec().Timeout; got != tc.timeout || env.driver.runs.Load() != before+1 {
				t.Errorf("%s: timeout %v, want %v", tc.body, got, tc.timeout)
			}
		} else if errCode(t, res) != "invalid_timeout" {
			t.Errorf("%s: %s", tc.body, res.body)
		}
	}
	// The memory limit comes from the plan.
	env.do(request{method: "POST", path: "/v1/executions", key: tiny, body: `{"language":"bash","code":"x"}`})
	if got := env.driver.lastSpec().Limits.MemoryBytes; got != 128<<20 {
		t.Errorf("memory limit %d", got)
	}
}

func TestStdinReachesDriver(t *testing.T) {
	env := newEnv(t)
	env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","stdin":"hello\n"}`})
	if got := env.driver.lastSpec().Stdin; got != "hello\n" {
		t.Errorf("stdin %q", got)
	}
}

func TestGetExecution(t *testing.T) {
	env := newEnv(t)
	other, _ := env.newKey("globex", "pro")
	run := decode(t, env.run("python", "print(6 * 7)", nil))
	id := run["id"].(string)

	for _, path := range []string{"/v1/executions/" + id, "/api/v1/executions/" + id} {
		res := env.do(request{path: path})
		if res.status != 200 {
			t.Fatalf("GET %s: %d %s", path, res.status, res.body)
		}
		got := decode(t, res)
		if got["request_id"] != res.header.Get("X-Request-ID") {
			t.Errorf("request_id %v is not this request's", got["request_id"])
		}
		delete(got, "request_id")
		delete(run, "request_id")
		if diff := cmp.Diff(run, got); diff != "" {
			t.Errorf("GET differs from POST (-post +get):\n%s", diff)
		}
	}

	// Another tenant's id and an unknown id are indistinguishable.
	theirs := env.do(request{path: "/v1/executions/" + id, key: other})
	unknown := env.do(request{path: "/v1/executions/exe_0123456789abcdef0123456789abcdef", key: other})
	if theirs.status != 404 || unknown.status != 404 {
		t.Fatalf("statuses %d %d", theirs.status, unknown.status)
	}
	strip := func(r response) map[string]any { m := decode(t, r); delete(m, "request_id"); return m }
	if diff := cmp.Diff(strip(unknown), strip(theirs)); diff != "" {
		t.Errorf("other tenant's id answers differently from an unknown id:\n%s", diff)
	}
}

func TestUsage(t *testing.T) {
	env := newEnv(t)
	for i := 0; i < 3; i++ {
		env.run("python", "print(6 * 7)", nil)
	}
	env.run("python", "crash", nil) // refunded, not counted
	res := env.do(request{path: "/api/v1/usage"})
	var got wire.Usage
	if err := decodeStrict(res.body, &got); err != nil {
		t.Fatal(err)
	}
	want := wire.Usage{
		Tenant: "acme", Plan: "pro",
		Today:  wire.UsageToday{Date: "2026-03-14", Executions: 3, SandboxSeconds: 0.795, CPUSeconds: 0.06},
		Limits: wire.Limits{ExecutionsPerDay: 10000, RequestsPerMinute: 120, MaxTimeoutS: 60, MemoryMB: 512},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}

// TestQuotaBurst: 150 parallel requests on a quota of 100 run exactly 100.
func TestQuotaBurst(t *testing.T) {
	plans := config.DefaultPlans()
	free := plans["free"]
	free.RequestsPerMinute = 1000
	free.MaxConcurrent = 1000 // the quota is under test here, not the tenant's share of slots
	plans["free"] = free
	env := newEnv(t, withPlans(plans))
	key, _ := env.newKey("burst", "free")
	var wg sync.WaitGroup
	statuses := make([]response, 150)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = env.do(request{method: "POST", path: "/v1/executions", key: key, body: `{"language":"python","code":"print(6 * 7)"}`})
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for _, r := range statuses {
		count[r.status]++
		if r.status == 429 {
			if errCode(t, r) != "quota_exceeded" {
				t.Errorf("429 with %s", r.body)
			}
			if r.header.Get("Retry-After") == "" || r.header.Get("X-Quota-Remaining") != "0" {
				t.Errorf("429 headers %v", r.header)
			}
		}
	}
	if diff := cmp.Diff(map[int]int{200: 100, 429: 50}, count); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if n := env.driver.runs.Load(); n != 100 {
		t.Errorf("driver ran %d times, want 100", n)
	}
	res := env.do(request{path: "/v1/usage", key: key})
	if got := decode(t, res)["today"].(map[string]any)["executions"]; got != 100.0 {
		t.Errorf("usage executions %v", got)
	}
}

// TestQuotaResetsAtUTCMidnight: Retry-After counts to the next UTC day, and
// the quota is fresh then.
func TestQuotaResetsAtUTCMidnight(t *testing.T) {
	plans := map[string]config.Plan{"pro": config.DefaultPlans()["pro"], "one": {ExecutionsPerDay: 1, RequestsPerMinute: 100, MaxTimeoutS: 10, MemoryMB: 64}}
	env := newEnv(t, withPlans(plans))
	clk := env.clock
	clk.Set(time.Date(2026, 3, 14, 23, 59, 0, 0, time.UTC))
	key, _ := env.newKey("once", "one")
	body := `{"language":"bash","code":"x"}`
	if r := env.do(request{method: "POST", path: "/v1/executions", key: key, body: body}); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := env.do(request{method: "POST", path: "/v1/executions", key: key, body: body})
	if r.status != 429 || errCode(t, r) != "quota_exceeded" {
		t.Fatalf("second: %d %s", r.status, r.body)
	}
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 55 || ra > 60 {
		t.Errorf("Retry-After %q, want about 60", r.header.Get("Retry-After"))
	}
	midnight := time.Date(2026, 3, 15, 0, 0, 0, 0, time.UTC).Unix()
	if r.header.Get("X-Quota-Reset") != strconv.FormatInt(midnight, 10) {
		t.Errorf("X-Quota-Reset %q, want %d", r.header.Get("X-Quota-Reset"), midnight)
	}
	if got := decode(t, r)["error"].(map[string]any)["message"]; got != "daily quota of 1 executions reached" {
		t.Errorf("message %q", got)
	}
	clk.Advance(time.Minute)
	if r := env.do(request{method: "POST", path: "/v1/executions", key: key, body: body}); r.status != 200 {
		t.Fatalf("after midnight: %d %s", r.status, r.body)
	}
}

// TestOverload: with every slot busy and the queue full, the answer is an
// immediate 503 (it arrives while the running execution is still blocked,
// so no timing is involved), with Retry-After and no quota used.
func TestOverload(t *testing.T) {
	env := newEnv(t, withEngine(engine.Options{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Hour}))
	env.driver.started = make(chan string, 10)
	first := env.goRun("python", "block", nil)
	<-env.driver.started
	second := env.goRun("python", "print(6 * 7)", nil)
	waitFor(t, func() bool { return env.engine.Stats().Waiting == 1 })

	res := env.run("python", "print(6 * 7)", nil)
	if res.status != http.StatusServiceUnavailable || errCode(t, res) != "overloaded" || res.header.Get("Retry-After") == "" {
		t.Fatalf("got %d %s %v", res.status, res.body, res.header)
	}
	select {
	case <-first:
		t.Fatal("the blocked execution finished before the 503")
	default:
	}
	env.driver.release()
	if r := <-first; r.status != 200 {
		t.Errorf("first: %d", r.status)
	}
	if r := <-second; r.status != 200 {
		t.Errorf("queued: %d", r.status)
	}
	u := decode(t, env.do(request{path: "/v1/usage"}))
	if got := u["today"].(map[string]any)["executions"]; got != 2.0 {
		t.Errorf("executions counted %v, want 2 (the 503 must not count)", got)
	}
}

// TestQueueTimeout: a request that waited the whole queue timeout gets 503.
func TestQueueTimeout(t *testing.T) {
	env := newEnv(t, withEngine(engine.Options{MaxConcurrent: 1, MaxQueue: 5, QueueTimeout: 20 * time.Millisecond}))
	env.driver.started = make(chan string, 10)
	first := env.goRun("python", "block", nil)
	<-env.driver.started
	res := env.run("python", "print(6 * 7)", nil)
	if res.status != 503 || errCode(t, res) != "overloaded" {
		t.Fatalf("got %d %s", res.status, res.body)
	}
	env.driver.release()
	<-first
}

func TestRateLimit(t *testing.T) {
	plans := map[string]config.Plan{"pro": config.DefaultPlans()["pro"], "slow": {ExecutionsPerDay: 100, RequestsPerMinute: 3, MaxTimeoutS: 10, MemoryMB: 64}}
	env := newEnv(t, withPlans(plans))
	key, _ := env.newKey("slowpoke", "slow")
	clk := env.clock
	clk.Set(time.Date(2026, 3, 14, 12, 0, 50, 0, time.UTC))
	windowEnd := time.Date(2026, 3, 14, 12, 1, 0, 0, time.UTC).Unix()
	for i := 1; i <= 3; i++ {
		r := env.do(request{path: "/v1/usage", key: key})
		if r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
		if got, want := r.header.Get("X-RateLimit-Remaining"), strconv.Itoa(3-i); got != want {
			t.Errorf("request %d: remaining %s, want %s", i, got, want)
		}
	}
	r := env.run("python", "print(6 * 7)", nil) // another tenant is unaffected
	if r.status != 200 {
		t.Errorf("other tenant: %d", r.status)
	}
	r = env.do(request{method: "POST", path: "/v1/executions", key: key, body: `{"language":"python","code":"x"}`})
	if r.status != 429 || errCode(t, r) != "rate_limited" {
		t.Fatalf("4th: %d %s", r.status, r.body)
	}
	if diff := cmp.Diff(map[string]string{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(windowEnd, 10)},
		map[string]string{"X-RateLimit-Limit": r.header.Get("X-RateLimit-Limit"), "X-RateLimit-Remaining": r.header.Get("X-RateLimit-Remaining"), "X-RateLimit-Reset": r.header.Get("X-RateLimit-Reset")}); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 1 || ra > 10 {
		t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
	}
	if env.driver.runs.Load() != 1 {
		t.Errorf("rate-limited request ran")
	}
	clk.Advance(15 * time.Second)
	if r := env.do(request{path: "/v1/usage", key: key}); r.status != 200 {
		t.Errorf("next window: %d", r.status)
	}
}

func TestRotateAndRevoke(t *testing.T) {
	env := newEnv(t)
	res := env.do(request{method: "POST", path: "/v1/keys/rotate"})
	if res.status != 200 {
		t.Fatalf("rotate: %d %s", res.status, res.body)
	}
	var rot wire.KeyRotation
	if err := decodeStrict(res.body, &rot); err != nil {
		t.Fatal(err)
	}
	if rot.RevokedKeyID != env.keyID || rot.Plan != "pro" || !ValidKeyID(rot.KeyID) || !wellFormedKey(rot.APIKey) || len(rot.APIKey) != len(KeyPrefix)+43 {
		t.Errorf("rotate answer %+v", rot)
	}
	if r := env.do(request{path: "/v1/usage"}); r.status != 401 || errCode(t, r) != "unauthorized" {
		t.Errorf("old key after rotation: %d %s", r.status, r.body)
	}
	r := env.do(request{path: "/v1/usage", key: rot.APIKey})
	if r.status != 200 || decode(t, r)["plan"] != "pro" || decode(t, r)["tenant"] != "acme" {
		t.Fatalf("new key: %d %s", r.status, r.body)
	}
	// Revocation by the operator takes effect on the next request.
	if err := env.store.RevokeKey(context.Background(), rot.KeyID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := env.do(request{path: "/v1/usage", key: rot.APIKey}); r.status != 401 {
		t.Errorf("revoked key: %d", r.status)
	}
}

func TestHealthAndOpenAPI(t *testing.T) {
	env := newEnv(t)
	for _, p := range []string{"/health", "/api/health"} {
		r := env.do(request{path: p, key: "-"})
		if diff := cmp.Diff(`{"status":"ok","version":"0.2.0-test"}`+"\n", string(r.body)); r.status != 200 || diff != "" {
			t.Errorf("%s: %d %s", p, r.status, diff)
		}
	}
	for p, server := range map[string]string{"/v1/openapi.json": "/", "/api/v1/openapi.json": "/api"} {
		r := env.do(request{path: p, key: "-"})
		var doc struct {
			OpenAPI string           `json:"openapi"`
			Servers []map[string]any `json:"servers"`
			Info    map[string]any   `json:"info"`
		}
		if err := json.Unmarshal(r.body, &doc); err != nil || r.status != 200 {
			t.Fatalf("%s: %d %v", p, r.status, err)
		}
		if doc.OpenAPI != "3.1.0" || doc.Servers[0]["url"] != server || doc.Info["version"] != "0.2.0-test" {
			t.Errorf("%s: %+v", p, doc)
		}
	}
}

func TestSecurityHeadersEverywhere(t *testing.T) {
	env := newEnv(t)
	for _, req := range []request{
		{path: "/health", key: "-"}, {path: "/v1/usage"}, {path: "/nope"}, {path: "/v1/usage", key: "-"},
		{method: "POST", path: "/v1/executions", body: `{"language":"py","code":"print(6 * 7)"}`},
	} {
		r := env.do(req)
		for h, want := range map[string]string{
			"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
			"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
		} {
			if got := r.header.Get(h); got != want {
				t.Errorf("%s %s: %s = %q", req.method, req.path, h, got)
			}
		}
		if !requestIDRe.MatchString(r.header.Get("X-Request-ID")) {
			t.Errorf("%s: X-Request-ID %q", req.path, r.header.Get("X-Request-ID"))
		}
	}
}

func TestEdgeSecret(t *testing.T) {
	const secret = "edge-secret-0123456789"
	env := newEnv(t, withOptions(func(o *Options) { o.EdgeSecret = secret }))
	for _, tc := range []struct {
		name   string
		req    request
		status int
	}{
		{"health is open", request{path: "/health", key: "-"}, 200},
		{"api health is open", request{path: "/api/health", key: "-"}, 200},
		{"no secret", request{path: "/v1/usage"}, 403},
		{"wrong secret", request{path: "/v1/usage", header: map[string]string{EdgeSecretHeader: "edge-secret-0123456788"}}, 403},
		{"prefix of secret", request{path: "/v1/usage", header: map[string]string{EdgeSecretHeader: "edge-secret"}}, 403},
		{"openapi needs it", request{path: "/v1/openapi.json", key: "-"}, 403},
		{"unknown route needs it", request{path: "/nope", key: "-"}, 403},
		{"right secret", request{path: "/v1/usage", header: map[string]string{EdgeSecretHeader: secret}}, 200},
		{"right secret, run", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, header: map[string]string{EdgeSecretHeader: secret}}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := env.do(tc.req)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.status == 403 && errCode(t, r) != "forbidden" {
				t.Errorf("body %s", r.body)
			}
		})
	}
	if env.driver.runs.Load() != 1 {
		t.Errorf("runs %d", env.driver.runs.Load())
	}
}

func TestPanicBecomes500(t *testing.T) {
	env := newEnv(t, withOptions(func(o *Options) {
		o.Web = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("kaboom at /srv/secret.go:12") })
	}))
	r := env.do(request{path: "/", key: "-"})
	if r.status != 500 || errCode(t, r) != "internal_error" {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if string(r.body) != fmt.Sprintf(`{"error":{"code":"internal_error","message":"internal error; quote the request id when reporting it"},"request_id":"%s"}`+"\n", r.header.Get("X-Request-ID")) {
		t.Errorf("body %s", r.body)
	}
	if !jsonLogHas(t, env.logs.String(), "panic in handler") {
		t.Errorf("panic not logged")
	}
	// The server keeps serving.
	if r := env.do(request{path: "/health", key: "-"}); r.status != 200 {
		t.Errorf("after panic: %d", r.status)
	}
}

func TestWebAndMCPMounts(t *testing.T) {
	var mcpCaller *Caller
	env := newEnv(t, withOptions(func(o *Options) {
		o.Web = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/" && r.URL.Path != "/docs/" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, "<h1>playground</h1>")
		})
		o.MCP = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mcpCaller, _ = CallerFromContext(r.Context())
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "event: message\n\n")
		})
	}))
	for _, tc := range []struct {
		req    request
		status int
		code   string
	}{
		{request{path: "/", key: "-"}, 200, ""},
		{request{path: "/docs/", key: "-"}, 200, ""},
		{request{path: "/nope", key: "-"}, 404, "not_found"},
		{request{method: "POST", path: "/", key: "-", body: "{}"}, 405, "method_not_allowed"},
		{request{path: "/v1/nope", key: "-"}, 404, "not_found"},
		{request{method: "POST", path: "/mcp", key: "-", body: "{}"}, 401, "unauthorized"},
		{request{method: "POST", path: "/mcp", body: "{}"}, 200, ""},
		{request{method: "POST", path: "/api/mcp", body: "{}"}, 200, ""},
		{request{path: "/mcp"}, 405, "method_not_allowed"},
		{request{method: "DELETE", path: "/api/mcp", key: "-"}, 405, "method_not_allowed"},
		{request{method: "POST", path: "/mcp", body: `[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`}, 400, "invalid_request"},
		{request{method: "POST", path: "/mcp", body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"python","code":"print('\udc00')"}}}`}, 400, "invalid_json"},
	} {
		r := env.do(tc.req)
		if r.status != tc.status {
			t.Errorf("%s %s: %d %s", tc.req.method, tc.req.path, r.status, r.body)
			continue
		}
		if tc.code != "" && errCode(t, r) != tc.code {
			t.Errorf("%s: %s", tc.req.path, r.body)
		}
		if tc.status == 405 && strings.HasSuffix(tc.req.path, "/mcp") && r.header.Get("Allow") != "POST" {
			t.Errorf("%s %s: Allow %q", tc.req.method, tc.req.path, r.header.Get("Allow"))
		}
		if tc.req.path == "/" && tc.status == 200 && string(r.body) != "<h1>playground</h1>" {
			t.Errorf("web body %q", r.body)
		}
	}
	if mcpCaller == nil || mcpCaller.Key.Tenant != "acme" || mcpCaller.Plan.ExecutionsPerDay != 10000 {
		t.Errorf("MCP handler saw caller %+v", mcpCaller)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMCPMessagesAreRateCounted: every MCP message counts once against the
// key's rate; the tools call the execution service directly, so a
// run_code call counts nothing more against the rate, and against the
// quota exactly what POST /v1/executions does.
func TestMCPMessagesAreRateCounted(t *testing.T) {
	plans := map[string]config.Plan{"pro": config.DefaultPlans()["pro"], "slow": {ExecutionsPerDay: 100, RequestsPerMinute: 3, MaxTimeoutS: 10, MemoryMB: 64}}
	env := newEnv(t, withPlans(plans), withMCP(mcpserver.Options{Languages: []client.Language{{Name: "python"}}}))
	key, _ := env.newKey("slowpoke", "slow")
	hdr := map[string]string{"Accept": "application/json, text/event-stream"}
	msgs := []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"python","code":"print(6 * 7)"}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_usage","arguments":{}}}`,
	}
	var bodies []string
	for i, msg := range msgs {
		r := env.do(request{method: "POST", path: "/mcp", key: key, body: msg, header: hdr})
		if r.status != 200 {
			t.Fatalf("message %d: %d %s", i+1, r.status, r.body)
		}
		if got, want := r.header.Get("X-RateLimit-Remaining"), strconv.Itoa(2-i); got != want {
			t.Errorf("message %d: remaining %s, want %s", i+1, got, want)
		}
		bodies = append(bodies, string(r.body))
	}
	if !strings.Contains(bodies[1], `status: succeeded`) || !strings.Contains(bodies[1], `42`) {
		t.Errorf("run_code answer: %s", bodies[1])
	}
	if !strings.Contains(bodies[2], `"executions":1`) {
		t.Errorf("get_usage answer does not count the one run: %s", bodies[2])
	}
	if n := env.driver.runs.Load(); n != 1 {
		t.Errorf("driver ran %d times, want 1", n)
	}
	r := env.do(request{method: "POST", path: "/mcp", key: key, body: msgs[0], header: hdr})
	if r.status != 429 || errCode(t, r) != "rate_limited" {
		t.Fatalf("4th message: %d %s", r.status, r.body)
	}
}

// TestRunningExecutionAndCancel: GET shows a running execution's state;
// cancel ends it as canceled (its POST answers that too); cancel of a
// finished execution is 409 execution_finished.
func TestRunningExecutionAndCancel(t *testing.T) {
	env := newEnv(t)
	env.driver.started = make(chan string, 1)
	posted := env.goRun("python", "block", nil)
	id := <-env.driver.started
	steps := []struct {
		name       string
		req        request
		wantStatus int
		want       map[string]any // fields of the answer
	}{
		{"get while running", request{path: "/v1/executions/" + id}, 200,
			map[string]any{"status": "running", "stdout": "", "finished_at": nil}},
		{"cancel", request{method: "POST", path: "/v1/executions/" + id + "/cancel"}, 200,
			map[string]any{"status": "canceled"}},
		{"get after cancel", request{path: "/v1/executions/" + id}, 200,
			map[string]any{"status": "canceled"}},
		{"cancel again", request{method: "POST", path: "/api/v1/executions/" + id + "/cancel"}, 409,
			map[string]any{"error": map[string]any{"code": "execution_finished", "message": "execution " + id + " has already finished with status canceled"}}},
	}
	for _, step := range steps {
		res := env.do(step.req)
		if res.status != step.wantStatus {
			t.Fatalf("%s: %d %s", step.name, res.status, res.body)
		}
		got := decode(t, res)
		picked := map[string]any{}
		for k := range step.want {
			picked[k] = got[k]
		}
		if diff := cmp.Diff(step.want, picked); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step.name, diff)
		}
	}
	res := <-posted
	if res.status != 200 || decode(t, res)["status"] != "canceled" {
		t.Errorf("the canceled POST: %d %s", res.status, res.body)
	}
}
