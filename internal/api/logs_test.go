package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// logLines parses the JSON log, failing on a line that is not JSON.
func logLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		out = append(out, m)
	}
	return out
}

func jsonLogHas(t *testing.T, logs, msg string) bool {
	for _, l := range logLines(t, logs) {
		if l["msg"] == msg {
			return true
		}
	}
	return false
}

// TestLogsNeverContainKeysOrCode runs requests that carry keys in every
// place they can be (headers, rotation answers, wrong keys) and code with a
// marker, then greps the whole log.
func TestLogsNeverContainKeysOrCode(t *testing.T) {
	env := newEnv(t)
	const marker = "SECRET_CODE_MARKER_7f3a"
	wrong := NewAPIKey()
	env.run("python", "print('"+marker+"')", nil)
	env.run("python", "crash # "+marker, nil)
	env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"` + marker + `","code":"x"}`})
	env.do(request{path: "/v1/usage", key: wrong})
	env.do(request{path: "/v1/usage", key: "-", header: map[string]string{"Authorization": "Bearer " + env.key + "x"}})
	env.do(request{path: "/v1/usage?api_key=" + env.key})
	env.do(request{path: "/v1/executions/" + env.key})
	env.do(request{path: "/" + env.key, key: "-"})
	rot := decode(t, env.do(request{method: "POST", path: "/v1/keys/rotate"}))
	newKey := rot["api_key"].(string)
	env.do(request{path: "/v1/usage", key: newKey})

	logs := env.logs.String()
	for _, secret := range []string{env.key, wrong, newKey, KeyPrefix, marker} {
		if strings.Contains(logs, secret) {
			t.Errorf("log contains %q", secret)
		}
	}
	// The access log has what an operator needs.
	var sawTenant bool
	for _, l := range logLines(t, logs) {
		if l["msg"] != "request" {
			continue
		}
		for _, f := range []string{"request_id", "method", "path", "route", "status", "duration_ms"} {
			if _, ok := l[f]; !ok {
				t.Errorf("access log line lacks %s: %v", f, l)
			}
		}
		if l["tenant"] == "acme" && l["key_id"] == env.keyID {
			sawTenant = true
		}
	}
	if !sawTenant {
		t.Errorf("no access log line names tenant and key id:\n%s", logs)
	}
}

func TestAccessLogStatus(t *testing.T) {
	env := newEnv(t)
	r := env.run("python", "crash", nil)
	var line map[string]any
	for _, l := range logLines(t, env.logs.String()) {
		if l["request_id"] == r.header.Get("X-Request-ID") && l["msg"] == "request" {
			line = l
		}
	}
	if line == nil {
		t.Fatal("no access log line for the request")
	}
	if line["status"] != float64(http.StatusInternalServerError) || line["error_code"] != "sandbox_error" || line["level"] != "ERROR" || !strings.Contains(line["error"].(string), "exploded") {
		t.Errorf("log line %v", line)
	}
}

// TestAccessLogLevelAndTenant: failures are ERROR, overload (the server
// working as designed) is WARN, and a request whose key was found names
// its tenant even when it fails after the lookup.
func TestAccessLogLevelAndTenant(t *testing.T) {
	env := newEnv(t, withEngine(engine.Options{MaxConcurrent: 1, MaxQueue: 5, QueueTimeout: 20 * time.Millisecond}))
	ghost, _, err := CreateKey(context.Background(), env.store, "ghost", "retired-plan", env.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	overload := func() response {
		env.driver.started = make(chan string, 1)
		first := env.goRun("python", "block", nil)
		<-env.driver.started
		defer func() { env.driver.release(); <-first }()
		return env.run("python", "print(6 * 7)", nil)
	}
	for _, tc := range []struct {
		name       string
		do         func() response
		wantStatus float64
		wantLevel  string
		wantTenant any
	}{
		{"platform failure", func() response { return env.run("python", "crash", nil) }, 500, "ERROR", "acme"},
		{"overload", overload, 503, "WARN", "acme"},
		{"plan no longer configured", func() response { return env.do(request{path: "/v1/usage", key: ghost}) }, 500, "ERROR", "ghost"},
	} {
		r := tc.do()
		var line map[string]any
		for _, l := range logLines(t, env.logs.String()) {
			if l["request_id"] == r.header.Get("X-Request-ID") && l["msg"] == "request" {
				line = l
			}
		}
		if line == nil {
			t.Fatalf("%s: no access log line", tc.name)
		}
		if line["status"] != tc.wantStatus || line["level"] != tc.wantLevel || line["tenant"] != tc.wantTenant {
			t.Errorf("%s: status %v level %v tenant %v; want %v %v %v", tc.name, line["status"], line["level"], line["tenant"], tc.wantStatus, tc.wantLevel, tc.wantTenant)
		}
	}
}
