package api

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// TestOpenAPICoverage makes the server give every response the document
// describes (each one is validated on the way by conformance) and fails
// when a documented response cannot be produced, or the document lists an
// operation the walk does not know.
func TestOpenAPICoverage(t *testing.T) {
	doc := loadDoc(t)
	var want []string
	for _, p := range doc.paths {
		for m, op := range p.methods {
			for status := range op["responses"].(map[string]any) {
				want = append(want, fmt.Sprintf("%s %s %s", m, p.template, status))
			}
		}
	}
	sort.Strings(want)

	plans := config.DefaultPlans()
	plans["one"] = config.Plan{ExecutionsPerDay: 1, RequestsPerMinute: 1000, MaxTimeoutS: 10, MemoryMB: 64}
	plans["slow"] = config.Plan{ExecutionsPerDay: 100, RequestsPerMinute: 1, MaxTimeoutS: 10, MemoryMB: 64}
	env := newEnv(t, withPlans(plans), withEngine(engine.Options{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Millisecond}))
	run := `{"language":"python","code":"print(6 * 7)"}`
	id := decode(t, env.do(request{method: "POST", path: "/v1/executions", body: run, header: map[string]string{"Idempotency-Key": "cov"}}))["id"].(string)
	env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x"}`, header: map[string]string{"Idempotency-Key": "cov"}}) // 409
	env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python"}`})                                                                 // 400
	env.do(request{method: "POST", path: "/v1/executions", body: jsonBody(map[string]any{"language": "python", "code": strings.Repeat("x", 600<<10)})})    // 413
	env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"crash"}`})                                                  // 500
	one, _ := env.newKey("one", "one")
	env.do(request{method: "POST", path: "/v1/executions", key: one, body: run})
	env.do(request{method: "POST", path: "/v1/executions", key: one, body: run}) // 429 quota
	// Async executions and batches (202, the batch's 400, 409, 413 and 429).
	batch := `{"executions":[` + run + `,` + run + `]}`
	env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"print(6 * 7)","async":true}`})
	env.do(request{method: "POST", path: "/v1/executions/batch", body: batch})
	env.do(request{method: "POST", path: "/v1/executions/batch", body: `{"executions":[]}`})
	env.do(request{method: "POST", path: "/v1/executions/batch", body: `{"executions":[` + jsonBody(map[string]any{"language": "python", "code": strings.Repeat("x", 600<<10)}) + `]}`})
	env.do(request{method: "POST", path: "/v1/executions/batch", key: one, body: batch})
	env.do(request{method: "POST", path: "/v1/executions/batch", body: `{"executions":[` + run + `]}`, header: map[string]string{"Idempotency-Key": "cov"}}) // 409: a single request's key
	nenv := newEnv(t, withoutQueue())
	nenv.do(request{method: "POST", path: "/v1/executions/batch", body: batch}) // 503: no queue
	env.do(request{path: "/v1/webhook-secret"})
	env.do(request{method: "POST", path: "/v1/webhook-secret/rotate"})
	// 503: the only slot is busy and the one queue place times out.
	env.driver.started = make(chan string, 1)
	blocked := env.goRun("python", "block", nil)
	<-env.driver.started
	env.run("python", "print(6 * 7)", nil)
	env.driver.release()
	<-blocked
	env.do(request{path: "/v1/executions/" + id})
	env.do(request{path: "/v1/executions/exe_00000000000000000000000000000000"})                                                 // 404
	env.do(request{path: "/v1/executions/" + id + "/events"})                                                                    // 200, replayed from the store
	env.do(request{path: "/v1/executions/exe_00000000000000000000000000000000/events"})                                          // 404
	env.do(request{method: "POST", path: "/v1/executions", body: run, header: map[string]string{"Accept": "text/event-stream"}}) // 200, streamed
	env.do(request{method: "POST", path: "/v1/executions/" + id + "/cancel"})                                                    // 409: finished
	env.do(request{method: "POST", path: "/v1/executions/exe_00000000000000000000000000000000/cancel"})                          // 404
	cenv := newEnv(t)
	cenv.driver.started = make(chan string, 1)
	blocked = cenv.goRun("python", "block", nil)
	cenv.do(request{method: "POST", path: "/v1/executions/" + <-cenv.driver.started + "/cancel"}) // 200
	<-blocked
	env.do(request{path: "/v1/usage"})
	env.do(request{path: "/v1/languages"})
	env.do(request{path: "/v1/images"})
	env.do(request{path: "/v1/openapi.json", key: "-"})
	env.do(request{path: "/health", key: "-"})
	slow, _ := env.newKey("slow", "slow")
	env.do(request{path: "/v1/usage", key: slow})
	for _, r := range []request{
		{method: "POST", path: "/v1/executions", body: run},
		{path: "/v1/executions/" + id}, {path: "/v1/usage"}, {method: "POST", path: "/v1/keys/rotate"}, {path: "/v1/languages"}, {path: "/v1/images"},
		{method: "POST", path: "/v1/executions/" + id + "/cancel"}, {path: "/v1/executions/" + id + "/events"},
		{method: "POST", path: "/v1/executions/batch", body: batch}, {path: "/v1/webhook-secret"},
		{method: "POST", path: "/v1/webhook-secret/rotate"},
	} {
		r.key = slow
		env.do(r) // 429 rate
		r.key = "-"
		env.do(r) // 401
	}
	rotated := decode(t, env.do(request{method: "POST", path: "/v1/keys/rotate"}))
	env.key = rotated["api_key"].(string)

	// 500 for every authenticated operation: the store fails.
	benv := newEnv(t)
	benv.store.broken.Store(true)
	for _, r := range []request{
		{method: "POST", path: "/v1/executions", body: run}, {path: "/v1/executions/" + id}, {path: "/v1/usage"},
		{method: "POST", path: "/v1/keys/rotate"}, {path: "/v1/languages"}, {path: "/v1/images"}, {method: "POST", path: "/v1/executions/" + id + "/cancel"},
		{path: "/v1/executions/" + id + "/events"}, {method: "POST", path: "/v1/executions/batch", body: batch},
		{path: "/v1/webhook-secret"}, {method: "POST", path: "/v1/webhook-secret/rotate"},
	} {
		benv.do(r)
	}

	// 403 from the edge secret.
	eenv := newEnv(t, withOptions(func(o *Options) { o.EdgeSecret = "0123456789abcdef0123" }))
	for _, r := range []request{
		{method: "POST", path: "/v1/executions", body: run}, {path: "/v1/executions/" + id}, {path: "/v1/usage"},
		{method: "POST", path: "/v1/keys/rotate"}, {path: "/v1/languages"}, {path: "/v1/images"}, {path: "/v1/openapi.json", key: "-"},
		{method: "POST", path: "/v1/executions/" + id + "/cancel"}, {path: "/v1/executions/" + id + "/events"},
		{method: "POST", path: "/v1/executions/batch", body: batch}, {path: "/v1/webhook-secret"},
		{method: "POST", path: "/v1/webhook-secret/rotate"},
	} {
		eenv.do(r)
	}

	got := map[string]bool{}
	for _, e := range append([]*testEnv{env, cenv, nenv, benv, eenv}, coverSandboxes(t)...) {
		e.covered.Range(func(k, _ any) bool { got[k.(string)] = true; return true })
	}
	var gotList []string
	for k := range got {
		gotList = append(gotList, k)
	}
	sort.Strings(gotList)
	if diff := cmp.Diff(want, gotList); diff != "" {
		t.Errorf("documented responses (-documented +produced):\n%s", diff)
	}
}
