package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestErrorKindsTable keeps the one table complete and its codes unique.
func TestErrorKindsTable(t *testing.T) {
	seen := map[string]Kind{}
	for k := KindInternal; k <= lastKind; k++ {
		info, ok := kinds[k]
		if !ok {
			t.Errorf("kind %d has no entry", k)
			continue
		}
		if prev, dup := seen[info.code]; dup {
			t.Errorf("code %s used by kinds %d and %d", info.code, prev, k)
		}
		seen[info.code] = k
		if info.status < 400 {
			t.Errorf("%s: status %d", info.code, info.status)
		}
	}
	doc := loadDoc(t)
	enum := doc.resolve(map[string]any{"$ref": "#/components/schemas/Error"})["properties"].(map[string]any)["error"].(map[string]any)["properties"].(map[string]any)["code"].(map[string]any)["enum"].([]any)
	var documented []string
	for _, c := range enum {
		documented = append(documented, c.(string))
	}
	var codes []string
	for k := KindInternal; k <= lastKind; k++ {
		codes = append(codes, kindCode(k))
	}
	if diff := cmp.Diff(sortedStrings(documented), sortedStrings(codes)); diff != "" {
		t.Errorf("error codes in openapi.json vs errors.go (-doc +code):\n%s", diff)
	}
}

func TestRequestErrors(t *testing.T) {
	env := newEnv(t)
	long := strings.Repeat("a", 256)
	big := strings.Repeat("x", 512<<10+1)
	for _, tc := range []struct {
		name       string
		req        request
		wantStatus int
		wantCode   string
		wantHeader map[string]string
	}{
		{"no key", request{method: "GET", path: "/v1/usage", key: "-"}, 401, "unauthorized", map[string]string{"WWW-Authenticate": `Bearer realm="vertal"`}},
		{"basic auth", request{method: "GET", path: "/v1/usage", key: "-", header: map[string]string{"Authorization": "Basic YTpi"}}, 401, "unauthorized", nil},
		{"malformed key", request{method: "GET", path: "/v1/usage", key: "kubo_sk_short"}, 401, "unauthorized", nil},
		{"unknown key", request{method: "GET", path: "/v1/usage", key: NewAPIKey()}, 401, "unauthorized", nil},
		{"no key on run", request{method: "POST", path: "/v1/executions", key: "-", body: `{"language":"python","code":"print(6 * 7)"}`}, 401, "unauthorized", nil},
		{"malformed json", request{method: "POST", path: "/v1/executions", body: `{"language":"python",`}, 400, "invalid_json", nil},
		{"not json at all", request{method: "POST", path: "/v1/executions", body: `language=python`}, 400, "invalid_json", nil},
		{"trailing data", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"} {}`}, 400, "invalid_json", nil},
		{"empty body", request{method: "POST", path: "/v1/executions", ctype: ptr("application/json")}, 400, "invalid_json", nil},
		{"text content type", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, ctype: ptr("text/plain")}, 400, "invalid_content_type", nil},
		{"form content type", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, ctype: ptr("application/x-www-form-urlencoded")}, 400, "invalid_content_type", nil},
		{"no content type", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, ctype: ptr("")}, 400, "invalid_content_type", nil},
		{"latin1 charset", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, ctype: ptr("application/json; charset=latin1")}, 400, "invalid_content_type", nil},
		{"unknown field", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","memory":1}`}, 400, "invalid_request", nil},
		{"code wrong type", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":5}`}, 400, "invalid_request", nil},
		{"timeout as string", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":"10"}`}, 400, "invalid_request", nil},
		{"array body", request{method: "POST", path: "/v1/executions", body: `[]`}, 400, "invalid_request", nil},
		{"missing language", request{method: "POST", path: "/v1/executions", body: `{"code":"x"}`}, 400, "invalid_request", nil},
		{"missing code", request{method: "POST", path: "/v1/executions", body: `{"language":"python"}`}, 400, "invalid_request", nil},
		{"empty code", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":""}`}, 400, "invalid_request", nil},
		{"unsupported language", request{method: "POST", path: "/v1/executions", body: `{"language":"cobol","code":"x"}`}, 400, "unsupported_language", nil},
		{"timeout zero", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":0}`}, 400, "invalid_timeout", nil},
		{"timeout negative", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":-1}`}, 400, "invalid_timeout", nil},
		{"timeout over plan", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":61}`}, 400, "invalid_timeout", nil},
		{"timeout 999", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":999}`}, 400, "invalid_timeout", nil},
		{"code too large", request{method: "POST", path: "/v1/executions", body: jsonBody(map[string]any{"language": "python", "code": big})}, 413, "payload_too_large", nil},
		{"stdin too large", request{method: "POST", path: "/v1/executions", body: jsonBody(map[string]any{"language": "python", "code": "x", "stdin": strings.Repeat("s", 1<<20+1)})}, 413, "payload_too_large", nil},
		{"body too large", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"` + strings.Repeat(`\u0000`, 1<<20) + `"}`}, 413, "payload_too_large", nil},
		{"empty idempotency key", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, header: map[string]string{"Idempotency-Key": ""}}, 400, "invalid_idempotency_key", nil},
		{"idempotency key too long", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, header: map[string]string{"Idempotency-Key": long}}, 400, "invalid_idempotency_key", nil},
		{"idempotency key with space", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, header: map[string]string{"Idempotency-Key": "order 1234"}}, 400, "invalid_idempotency_key", nil},
		{"idempotency key non-ascii", request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, header: map[string]string{"Idempotency-Key": "bestellung-ä"}}, 400, "invalid_idempotency_key", nil},
		{"unknown execution", request{path: "/v1/executions/exe_00000000000000000000000000000000"}, 404, "not_found", nil},
		{"malformed execution id", request{path: "/v1/executions/../../etc/passwd"}, 404, "not_found", nil},
		{"malformed execution id 2", request{path: "/v1/executions/exe_XYZ"}, 404, "not_found", nil},
		{"unknown route", request{path: "/v1/nope"}, 404, "not_found", nil},
		{"unknown route under api", request{path: "/api/v1/nope"}, 404, "not_found", nil},
		{"root without web", request{path: "/", key: "-"}, 404, "not_found", nil},
		{"trailing slash", request{path: "/v1/usage/"}, 404, "not_found", nil},
		{"wrong method on executions", request{method: "GET", path: "/v1/executions"}, 405, "method_not_allowed", map[string]string{"Allow": "POST"}},
		{"wrong method on health", request{method: "DELETE", path: "/health", key: "-"}, 405, "method_not_allowed", map[string]string{"Allow": "GET, HEAD"}},
		{"wrong method on rotate", request{method: "GET", path: "/api/v1/keys/rotate"}, 405, "method_not_allowed", map[string]string{"Allow": "POST"}},
		{"put on execution", request{method: "PUT", path: "/v1/executions/exe_00000000000000000000000000000000", body: "{}"}, 405, "method_not_allowed", map[string]string{"Allow": "GET, HEAD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := env.do(tc.req)
			if res.status != tc.wantStatus {
				t.Errorf("status = %d, want %d; body %s", res.status, tc.wantStatus, clip(string(res.body), 300))
			}
			if got := errCode(t, res); got != tc.wantCode {
				t.Errorf("code = %q, want %q", got, tc.wantCode)
			}
			for k, v := range tc.wantHeader {
				if got := res.header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
			for _, leak := range []string{"/var/", "goroutine", ".go:", "sql", "SELECT"} {
				if strings.Contains(string(res.body), leak) {
					t.Errorf("body leaks %q: %s", leak, res.body)
				}
			}
		})
	}
	if n := env.driver.runs.Load(); n != 0 {
		t.Errorf("refused requests ran code %d times", n)
	}
	u, err := env.store.Usage(context.Background(), "acme", testStart.Format(time.DateOnly))
	if err != nil {
		t.Fatal(err)
	}
	if u.Executions != 0 {
		t.Errorf("refused requests used %d of the quota", u.Executions)
	}
}

// TestSandboxErrorRefunds: a platform failure is a 500 in the shape that
// names no internals, and the quota is given back.
func TestSandboxErrorRefunds(t *testing.T) {
	env := newEnv(t)
	res := env.run("python", "crash", nil)
	if res.status != http.StatusInternalServerError || errCode(t, res) != "sandbox_error" {
		t.Fatalf("got %d %s", res.status, res.body)
	}
	if strings.Contains(string(res.body), "/var/lib") || strings.Contains(string(res.body), "exploded") {
		t.Errorf("driver detail reached the client: %s", res.body)
	}
	if !strings.Contains(env.logs.String(), "exploded") {
		t.Errorf("driver detail missing from the log")
	}
	u, _ := env.store.Usage(context.Background(), "acme", testStart.Format(time.DateOnly))
	if u.Executions != 0 {
		t.Errorf("sandbox error used quota: %d", u.Executions)
	}
}

// TestUnstoredResultIsAnswered: a result the store cannot save yet is
// still the answer (the code ran), not 503 "not run"; the quota counts it,
// and the retry with the key, once the store has room, replays it.
func TestUnstoredResultIsAnswered(t *testing.T) {
	env := newEnv(t)
	env.store.failSave.Store(true)
	hdr := map[string]string{"Idempotency-Key": "full-disk"}
	body := `{"language":"python","code":"print(6 * 7)"}`
	res := env.do(request{method: "POST", path: "/v1/executions", body: body, header: hdr})
	first := decode(t, res)
	if res.status != http.StatusOK || first["stdout"] != "42\n" {
		t.Fatalf("got %d %s", res.status, res.body)
	}
	u, _ := env.store.Usage(context.Background(), "acme", testStart.Format(time.DateOnly))
	if u.Executions != 1 {
		t.Errorf("the execution that ran counted %d times, want 1", u.Executions)
	}
	env.store.failSave.Store(false)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		res = env.do(request{method: "POST", path: "/v1/executions", body: body, header: hdr})
		if res.status == http.StatusOK && decode(t, res)["status"] == "succeeded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry after the disk has room: %d %s", res.status, res.body)
		}
	}
	if got := decode(t, res); got["idempotent_replay"] != true || got["id"] != first["id"] {
		t.Errorf("retry after the disk has room: %s; want a replay of %v", res.body, first["id"])
	}
	if env.driver.runs.Load() != 1 {
		t.Errorf("the code ran %d times, want once", env.driver.runs.Load())
	}
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
