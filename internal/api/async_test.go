package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// Every answer in this file passes the OpenAPI conformance check of
// newEnv, as in the other tests; these check what the document cannot.

// executionsStored is how many executions the store holds.
func (e *testEnv) executionsStored() int {
	return e.store.Store.(*storefake.Store).Executions()
}

// usedToday is today's counted executions of the env's key.
func (e *testEnv) usedToday(t *testing.T, key string) float64 {
	t.Helper()
	return decode(t, e.do(request{path: "/v1/usage", key: key}))["today"].(map[string]any)["executions"].(float64)
}

// refusal checks that r is an error answer with status and code, and
// returns its message.
func refusal(t *testing.T, r response, status int, code string) string {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if got := errCode(t, r); got != code {
		t.Errorf("code %q, want %q", got, code)
	}
	return decode(t, r)["error"].(map[string]any)["message"].(string)
}

func TestAsyncSubmit(t *testing.T) {
	run := `{"language":"python","code":"print(6 * 7)"}`
	async := `{"language":"python","code":"print(6 * 7)","async":true}`
	for _, tc := range []struct {
		name, path, body string
		header           map[string]string
		wantPrefix       string
	}{
		{"async field", "/v1/executions", async, nil, ""},
		{"async field under /api", "/api/v1/executions", async, nil, "/api"},
		{"Prefer header", "/v1/executions", run, map[string]string{"Prefer": "respond-async"}, ""},
		{"Prefer among others", "/api/v1/executions", run, map[string]string{"Prefer": "return=minimal, Respond-Async; wait=10"}, "/api"},
		{"async false, Prefer header", "/v1/executions", `{"language":"python","code":"print(6 * 7)","async":false}`, map[string]string{"Prefer": "respond-async"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t)
			r := env.do(request{method: "POST", path: tc.path, body: tc.body, header: tc.header})
			if r.status != http.StatusAccepted {
				t.Fatalf("status %d %s", r.status, r.body)
			}
			e := decode(t, r)
			id := e["id"].(string)
			if got, want := r.header.Get("Location"), tc.wantPrefix+"/v1/executions/"+id; got != want {
				t.Errorf("Location %q, want %q", got, want)
			}
			if got := r.header.Get("Preference-Applied"); got != "respond-async" {
				t.Errorf("Preference-Applied %q", got)
			}
			if e["status"] != "queued" || e["started_at"] != nil || e["webhook"] != nil || e["reason"] != nil {
				t.Errorf("accepted: %s", r.body)
			}
			if got := r.header.Get("X-Quota-Remaining"); got != "9999" {
				t.Errorf("X-Quota-Remaining %q: the quota is reserved at accept time", got)
			}
			if diff := cmp.Diff([]string{id}, env.queue.runIDs()); diff != "" {
				t.Errorf("queued (-want +got):\n%s", diff)
			}
			if n := env.driver.runs.Load(); n != 0 {
				t.Errorf("ran %d times before the queue worked it", n)
			}
			// The Location is where the execution is, and the queue's
			// worker runs it.
			env.work()
			got := decode(t, env.do(request{path: r.header.Get("Location")}))
			if got["status"] != "succeeded" || got["stdout"] != "42\n" || got["id"] != id {
				t.Errorf("after the worker: %v", got)
			}
			if n := env.usedToday(t, ""); n != 1 {
				t.Errorf("counted %v executions, want 1", n)
			}
		})
	}
}

func TestAsyncRefusals(t *testing.T) {
	env := newEnv(t, withWebhooks("127.0.0.0/8"))
	noQueue := newEnv(t, withoutQueue())
	noHooks := newEnv(t)
	for _, tc := range []struct {
		name     string
		env      *testEnv
		body     string
		header   map[string]string
		status   int
		code     string
		contains string
	}{
		{"sync with webhook_url", env, `{"language":"python","code":"x","webhook_url":"http://127.0.0.1:9/h"}`, nil,
			400, "invalid_request", `"async": true`},
		{"async not a boolean", env, `{"language":"python","code":"x","async":"yes"}`, nil, 400, "invalid_request", "async"},
		{"webhook_url not a string", env, `{"language":"python","code":"x","async":true,"webhook_url":1}`, nil, 400, "invalid_request", "webhook_url"},
		{"webhook_url not absolute", env, `{"language":"python","code":"x","async":true,"webhook_url":"/hook"}`, nil, 400, "invalid_request", "webhook_url: "},
		{"webhook_url with credentials", env, `{"language":"python","code":"x","async":true,"webhook_url":"http://u:p@127.0.0.1:9/h"}`, nil, 400, "invalid_request", "webhook_url: "},
		{"invalid code is refused before queueing", env, `{"language":"cobol","code":"x","async":true}`, nil, 400, "unsupported_language", "cobol"},
		{"no queue on this server", noQueue, `{"language":"python","code":"x","async":true}`, nil, 503, "unavailable", "async"},
		{"no queue, Prefer header", noQueue, `{"language":"python","code":"x"}`, map[string]string{"Prefer": "respond-async"}, 503, "unavailable", "async"},
		{"no webhooks on this server", noHooks, `{"language":"python","code":"x","async":true,"webhook_url":"https://hooks.example.com/h"}`, nil, 400, "invalid_request", "webhook_url: webhooks are not available"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.env.do(request{method: "POST", path: "/v1/executions", body: tc.body, header: tc.header})
			if msg := refusal(t, r, tc.status, tc.code); !strings.Contains(msg, tc.contains) {
				t.Errorf("message %q does not name %q", msg, tc.contains)
			}
		})
	}
	for _, e := range []*testEnv{env, noQueue, noHooks} {
		if n := e.executionsStored(); n != 0 {
			t.Errorf("%d executions stored by refused requests", n)
		}
		if e.queue != nil && len(e.queue.runIDs()) != 0 {
			t.Errorf("refused requests were queued: %v", e.queue.runIDs())
		}
		if n := e.usedToday(t, ""); n != 0 {
			t.Errorf("refused requests counted %v executions", n)
		}
	}
}

// TestAsyncIdempotentReplay: the same Idempotency-Key gives the execution
// accepted first, as it is now, and queues nothing more.
func TestAsyncIdempotentReplay(t *testing.T) {
	env := newEnv(t)
	body := `{"language":"python","code":"print(6 * 7)","async":true}`
	hdr := map[string]string{"Idempotency-Key": "async-1"}
	first := env.do(request{method: "POST", path: "/v1/executions", body: body, header: hdr})
	if first.status != http.StatusAccepted {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	id := decode(t, first)["id"].(string)
	second := env.do(request{method: "POST", path: "/api/v1/executions", body: body, header: hdr})
	s := decode(t, second)
	if second.status != http.StatusAccepted || s["id"] != id || s["idempotent_replay"] != true || s["status"] != "queued" {
		t.Fatalf("replay while queued: %d %s", second.status, second.body)
	}
	if got := second.header.Get("Location"); got != "/api/v1/executions/"+id {
		t.Errorf("replay Location %q", got)
	}
	env.work()
	third := env.do(request{method: "POST", path: "/v1/executions", body: body, header: hdr})
	if th := decode(t, third); third.status != http.StatusAccepted || th["id"] != id || th["status"] != "succeeded" || th["idempotent_replay"] != true {
		t.Errorf("replay once run: %d %s", third.status, third.body)
	}
	if n := env.driver.runs.Load(); n != 1 {
		t.Errorf("ran %d times", n)
	}
	if n := env.usedToday(t, ""); n != 1 {
		t.Errorf("counted %v executions", n)
	}
	// The same key with another body is a conflict, as for a sync run.
	r := env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"print(1)","async":true}`, header: hdr})
	if r.status != http.StatusConflict || errCode(t, r) != "idempotency_conflict" {
		t.Errorf("other body: %d %s", r.status, r.body)
	}
}

func TestBatch(t *testing.T) {
	env := newEnv(t, withWebhooks("127.0.0.0/8"))
	body := `{"executions":[` +
		`{"language":"python","code":"print(6 * 7)"},` +
		`{"language":"bash","code":"echo","webhook_url":"http://127.0.0.1:9/own"},` +
		`{"language":"js","code":"x","async":false}` +
		`],"webhook_url":"http://127.0.0.1:9/batch"}`
	r := env.do(request{method: "POST", path: "/api/v1/executions/batch", body: body})
	if r.status != http.StatusAccepted {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	var got struct {
		Executions []struct {
			ID        string `json:"id"`
			Status    string `json:"status"`
			RequestID string `json:"request_id"`
			Webhook   struct {
				URL string `json:"url"`
			} `json:"webhook"`
		} `json:"executions"`
	}
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	var ids, summary []string
	for _, e := range got.Executions {
		ids = append(ids, e.ID)
		summary = append(summary, e.Status+" "+e.Webhook.URL)
		if e.RequestID != r.header.Get("X-Request-ID") {
			t.Errorf("request_id %q is not this request's", e.RequestID)
		}
	}
	want := []string{"queued http://127.0.0.1:9/batch", "queued http://127.0.0.1:9/own", "queued http://127.0.0.1:9/batch"}
	if diff := cmp.Diff(want, summary); diff != "" {
		t.Errorf("executions (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ids, env.queue.runIDs()); diff != "" {
		t.Errorf("queued in another order (-answered +queued):\n%s", diff)
	}
	var langs []string
	for _, id := range ids {
		langs = append(langs, decode(t, env.do(request{path: "/v1/executions/" + id}))["language"].(string))
	}
	if diff := cmp.Diff([]string{"python", "bash", "javascript"}, langs); diff != "" {
		t.Errorf("languages in order (-want +got):\n%s", diff)
	}
	if n := env.usedToday(t, ""); n != 3 {
		t.Errorf("counted %v executions, want 3", n)
	}
}

func TestBatchRefusals(t *testing.T) {
	item := `{"language":"python","code":"print(6 * 7)"}`
	items := func(n int) string { return strings.TrimSuffix(strings.Repeat(item+",", n), ",") }
	for _, tc := range []struct {
		name, body string
		status     int
		code       string
		prefix     string // the message starts with it
	}{
		{"21 items", `{"executions":[` + items(21) + `]}`, 400, "invalid_request", "executions holds 21 executions; a batch holds at most 20"},
		{"no items", `{"executions":[]}`, 400, "invalid_request", "executions must hold at least one"},
		{"no executions", `{"webhook_url":"http://127.0.0.1:9/h"}`, 400, "invalid_request", "executions is required"},
		{"not an array", `{"executions":{}}`, 400, "invalid_request", "field executions must be an array"},
		{"unknown field", `{"executions":[` + item + `],"callback_url":"x"}`, 400, "invalid_request", `unknown field "callback_url"; allowed: executions, webhook_url`},
		{"repeated field", `{"executions":[` + item + `],"executions":[` + item + `]}`, 400, "invalid_request", "field executions is given more than once"},
		{"not JSON", `{"executions":[`, 400, "invalid_json", "request body is not valid JSON"},
		{"item without code", `{"executions":[` + item + `,{"language":"python"}]}`, 400, "invalid_request", "executions[1]: code is required"},
		{"item language", `{"executions":[` + items(3) + `,{"language":"cobol","code":"x"}]}`, 400, "unsupported_language", "executions[3]: "},
		{"item timeout", `{"executions":[{"language":"python","code":"x","timeout_s":999}]}`, 400, "invalid_timeout", "executions[0]: "},
		{"item unknown field", `{"executions":[` + item + `,{"language":"python","code":"x","lang":"y"}]}`, 400, "invalid_request", "executions[1]: unknown field"},
		{"item file path", `{"executions":[{"language":"python","code":"x","files":[{"path":"/etc/passwd"}]}]}`, 400, "invalid_request", "executions[0]: files[0].path: "},
		{"item webhook_url", `{"executions":[` + item + `,` + item + `,{"language":"python","code":"x","webhook_url":"ftp://127.0.0.1/h"}]}`, 400, "invalid_request", "executions[2].webhook_url: "},
		{"batch webhook_url", `{"executions":[` + item + `],"webhook_url":"ftp://127.0.0.1/h"}`, 400, "invalid_request", "webhook_url: "},
		{"item too large", `{"executions":[` + item + `,` + jsonBody(map[string]any{"language": "python", "code": strings.Repeat("x", 600<<10)}) + `]}`, 413, "payload_too_large", "executions[1]: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, withWebhooks("127.0.0.0/8"))
			r := env.do(request{method: "POST", path: "/v1/executions/batch", body: tc.body})
			if msg := refusal(t, r, tc.status, tc.code); !strings.HasPrefix(msg, tc.prefix) {
				t.Errorf("message %q, want it to start with %q", msg, tc.prefix)
			}
			if n, q := env.executionsStored(), env.queue.runIDs(); n != 0 || len(q) != 0 || env.usedToday(t, "") != 0 {
				t.Errorf("a refused batch left %d executions, queued %v, counted %v", n, q, env.usedToday(t, ""))
			}
		})
	}
}

// TestBatchOverQuota: a batch that does not fit in what is left today is
// refused whole, with nothing stored, queued or counted.
func TestBatchOverQuota(t *testing.T) {
	plans := config.DefaultPlans()
	plans["five"] = config.Plan{ExecutionsPerDay: 5, RequestsPerMinute: 1000, MaxTimeoutS: 10, MemoryMB: 64}
	env := newEnv(t, withPlans(plans))
	key, _ := env.newKey("five", "five")
	item := `{"language":"python","code":"print(6 * 7)"}`
	batch := func(n int) string {
		return `{"executions":[` + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + `]}`
	}
	if r := env.do(request{method: "POST", path: "/v1/executions", key: key, body: item}); r.status != 200 {
		t.Fatalf("sync run: %d %s", r.status, r.body)
	}
	r := env.do(request{method: "POST", path: "/v1/executions/batch", key: key, body: batch(5)})
	if msg := refusal(t, r, http.StatusTooManyRequests, "quota_exceeded"); !strings.Contains(msg, "4 left") {
		t.Errorf("message %q does not say what is left", msg)
	}
	if r.header.Get("X-Quota-Remaining") != "4" || r.header.Get("Retry-After") == "" {
		t.Errorf("headers %v", r.header)
	}
	if n, q := env.executionsStored(), env.queue.runIDs(); n != 1 || len(q) != 0 || env.usedToday(t, key) != 1 {
		t.Errorf("the refused batch left %d executions (want the sync one), queued %v, counted %v", n, q, env.usedToday(t, key))
	}
	// What fits is accepted, and then nothing is left.
	if r := env.do(request{method: "POST", path: "/v1/executions/batch", key: key, body: batch(4)}); r.status != http.StatusAccepted {
		t.Fatalf("batch of 4 with 4 left: %d %s", r.status, r.body)
	}
	if r := env.do(request{method: "POST", path: "/v1/executions/batch", key: key, body: batch(1)}); r.status != http.StatusTooManyRequests {
		t.Errorf("batch of 1 with none left: %d %s", r.status, r.body)
	}
	if n := env.usedToday(t, key); n != 5 {
		t.Errorf("counted %v, want 5", n)
	}
}

var secretRe = regexp.MustCompile(`^whsec_[0-9a-f]{64}$`)

func TestWebhookSecret(t *testing.T) {
	env := newEnv(t)
	secret := func(method, path, key string) (string, float64) {
		t.Helper()
		r := env.do(request{method: method, path: path, key: key})
		if r.status != 200 {
			t.Fatalf("%s %s: %d %s", method, path, r.status, r.body)
		}
		b := decode(t, r)
		s := b["secret"].(string)
		if !secretRe.MatchString(s) {
			t.Errorf("secret %q", s)
		}
		return s, b["created_at"].(float64)
	}
	first, created := secret("GET", "/v1/webhook-secret", "")
	if again, at := secret("GET", "/api/v1/webhook-secret", ""); again != first || at != created {
		t.Errorf("a second GET made another secret: %q at %v, then %q at %v", first, created, again, at)
	}
	sameTenant, _ := env.newKey("acme", "free")
	if s, _ := secret("GET", "/v1/webhook-secret", sameTenant); s != first {
		t.Errorf("another key of the tenant sees %q, not %q", s, first)
	}
	other, _ := env.newKey("globex", "pro")
	if s, _ := secret("GET", "/v1/webhook-secret", other); s == first {
		t.Errorf("two tenants share a secret")
	}
	env.clock.Advance(time.Hour)
	rotated, at := secret("POST", "/v1/webhook-secret/rotate", "")
	if rotated == first || at <= created {
		t.Errorf("rotate gave %q at %v after %q at %v", rotated, at, first, created)
	}
	if now, _ := secret("GET", "/v1/webhook-secret", ""); now != rotated {
		t.Errorf("after rotate GET shows %q, not the new %q", now, rotated)
	}
	if r := env.do(request{method: "GET", path: "/v1/webhook-secret/rotate"}); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET rotate: %d", r.status)
	}
}

// TestWebhookURLPolicy: a loopback webhook_url is refused at submit
// unless the operator allowed its range.
func TestWebhookURLPolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		allow  []string
		url    string
		status int
	}{
		{"loopback refused", nil, "http://127.0.0.1:9/hook", 400},
		{"loopback over https refused", nil, "https://127.0.0.1/hook", 400},
		{"IPv6 loopback refused", nil, "https://[::1]/hook", 400},
		{"other loopback refused", nil, "https://127.1.2.3/hook", 400},
		{"private refused", nil, "https://10.0.0.1/hook", 400},
		{"metadata refused", nil, "https://169.254.169.254/latest", 400},
		{"loopback allowed by range", []string{"127.0.0.0/8"}, "http://127.0.0.1:9/hook", 202},
		{"outside the allowed range", []string{"127.0.0.0/8"}, "https://10.0.0.1/hook", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, withWebhooks(tc.allow...))
			r := env.do(request{method: "POST", path: "/v1/executions", body: jsonBody(map[string]any{
				"language": "python", "code": "print(6 * 7)", "async": true, "webhook_url": tc.url})})
			if tc.status == 202 {
				if r.status != tc.status {
					t.Fatalf("status %d %s", r.status, r.body)
				}
				hook := decode(t, r)["webhook"].(map[string]any)
				want := map[string]any{"url": tc.url, "state": "pending", "attempts": 0.0, "last_status": nil, "last_error": nil}
				if diff := cmp.Diff(want, hook); diff != "" {
					t.Errorf("webhook (-want +got):\n%s", diff)
				}
				return
			}
			if msg := refusal(t, r, tc.status, "invalid_request"); !strings.HasPrefix(msg, "webhook_url: ") {
				t.Errorf("message %q does not name webhook_url", msg)
			}
			if env.executionsStored() != 0 || env.usedToday(t, "") != 0 {
				t.Errorf("a refused webhook left something behind")
			}
		})
	}
}

// TestWebhookDelivery delivers to a receiver on loopback and checks the
// delivery against the document's webhooks section: the body is the
// execution as GET shows it, the headers are as documented, and the
// signature verifies with the secret GET /v1/webhook-secret shows.
func TestWebhookDelivery(t *testing.T) {
	type delivery struct {
		header http.Header
		body   []byte
	}
	var mu sync.Mutex
	var got []delivery
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, delivery{r.Header.Clone(), b})
		mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != "/hook" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	env := newEnv(t, withWebhooks("127.0.0.0/8"))
	accepted := env.do(request{method: "POST", path: "/v1/executions", body: jsonBody(map[string]any{
		"language": "python", "code": "print(6 * 7)", "async": true, "webhook_url": recv.URL + "/hook"})})
	if accepted.status != http.StatusAccepted {
		t.Fatalf("submit: %d %s", accepted.status, accepted.body)
	}
	id := decode(t, accepted)["id"].(string)
	env.work()

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d deliveries, want 1", len(got))
	}
	dl := got[0]
	d := loadDoc(t)
	op := pointer("#/webhooks", "execution.finished", "post")
	var body any
	if err := json.Unmarshal(dl.body, &body); err != nil {
		t.Fatalf("delivered body %q: %v", dl.body, err)
	}
	for _, e := range d.checkBody(pointer(op, "requestBody", "content", "application/json", "schema"), dl.header, dl.body) {
		t.Errorf("delivered body: %s", e)
	}
	for i, p := range d.lookup(op)["parameters"].([]any) {
		name := p.(map[string]any)["name"].(string)
		v := dl.header.Get(name)
		if v == "" {
			t.Errorf("delivery lacks header %s", name)
			continue
		}
		for _, e := range d.validate(pointer(op, "parameters", fmt.Sprint(i), "schema"), v, "header "+name) {
			t.Errorf("delivery: %s", e)
		}
	}
	secret := decode(t, env.do(request{path: "/v1/webhook-secret"}))["secret"].(string)
	if err := webhook.Verify(secret, dl.header.Get("Vertal-Signature"), dl.body, time.Minute, time.Now()); err != nil {
		t.Errorf("signature does not verify with the tenant's secret: %v", err)
	}

	// The body is what GET answers, but for the request id (the
	// submitting request's) and the delivery state, which the delivery
	// itself changes.
	var sent, now map[string]any
	_ = json.Unmarshal(dl.body, &sent)
	now = decode(t, env.do(request{path: "/v1/executions/" + id}))
	if sent["request_id"] != accepted.header.Get("X-Request-ID") {
		t.Errorf("delivered request_id %v, want the submitting request's %s", sent["request_id"], accepted.header.Get("X-Request-ID"))
	}
	wantHook := map[string]any{"url": recv.URL + "/hook", "state": "delivered", "attempts": 1.0, "last_status": 204.0, "last_error": nil}
	if diff := cmp.Diff(wantHook, now["webhook"]); diff != "" {
		t.Errorf("GET's webhook after the delivery (-want +got):\n%s", diff)
	}
	for _, k := range []string{"request_id", "webhook"} {
		delete(sent, k)
		delete(now, k)
	}
	if diff := cmp.Diff(now, sent); diff != "" {
		t.Errorf("delivered body differs from GET (-GET +delivered):\n%s", diff)
	}
	if sent["status"] != "succeeded" {
		t.Errorf("delivered status %v", sent["status"])
	}
}

// TestBatchIdempotency: a batch repeated with its Idempotency-Key answers
// 202 with the same executions in order, each marked idempotent_replay,
// and counts nothing more; other items under the key, or a single
// request's key, are 409 idempotency_conflict in the error shape.
func TestBatchIdempotency(t *testing.T) {
	env := newEnv(t)
	hdr := map[string]string{"Idempotency-Key": "nightly-2026-12-01"}
	body := `{"executions":[{"language":"python","code":"print(1)"},{"language":"bash","code":"echo 2"}]}`
	type answer struct {
		Executions []struct {
			ID        string `json:"id"`
			Replay    *bool  `json:"idempotent_replay"`
			RequestID string `json:"request_id"`
		} `json:"executions"`
	}
	submit := func(body string) (response, answer) {
		t.Helper()
		r := env.do(request{method: "POST", path: "/v1/executions/batch", header: hdr, body: body})
		var a answer
		if r.status == http.StatusAccepted {
			if err := json.Unmarshal(r.body, &a); err != nil {
				t.Fatal(err)
			}
		}
		return r, a
	}
	r1, first := submit(body)
	// The same batch, written otherwise (an alias, another field order).
	r2, second := submit(`{"executions":[{"code":"print(1)","language":"py"},{"language":"bash","code":"echo 2"}]}`)
	if r1.status != http.StatusAccepted || r2.status != http.StatusAccepted {
		t.Fatalf("statuses %d and %d, want 202 both: %s %s", r1.status, r2.status, r1.body, r2.body)
	}
	var ids1, ids2 []string
	for _, e := range first.Executions {
		ids1 = append(ids1, e.ID)
		if e.Replay != nil {
			t.Errorf("the first answer is marked as a replay")
		}
	}
	for _, e := range second.Executions {
		ids2 = append(ids2, e.ID)
		if e.Replay == nil || !*e.Replay {
			t.Errorf("replayed %s is not marked idempotent_replay", e.ID)
		}
		if e.RequestID != r2.header.Get("X-Request-ID") {
			t.Errorf("replayed request_id %q is not the new request's", e.RequestID)
		}
	}
	if len(ids1) != 2 {
		t.Fatalf("first batch answered %v", ids1)
	}
	if diff := cmp.Diff(ids1, ids2); diff != "" {
		t.Errorf("replayed ids (-first +replay):\n%s", diff)
	}
	if diff := cmp.Diff(ids1, env.queue.runIDs()); diff != "" {
		t.Errorf("queued (-each once +got):\n%s", diff)
	}
	if n := env.usedToday(t, ""); n != 2 {
		t.Errorf("counted %v executions, want the batch once (2)", n)
	}

	for _, tc := range []struct{ name, path, body string }{
		{"other items", "/v1/executions/batch", `{"executions":[{"language":"python","code":"print(1)"}]}`},
		{"single request under a batch's key", "/v1/executions", `{"language":"python","code":"print(1)","async":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := env.do(request{method: "POST", path: tc.path, header: hdr, body: tc.body})
			msg := refusal(t, r, http.StatusConflict, "idempotency_conflict")
			if !strings.Contains(msg, "Idempotency-Key") || decode(t, r)["request_id"] != r.header.Get("X-Request-ID") {
				t.Errorf("conflict body %s", r.body)
			}
		})
	}
	// And the reverse: a batch under a single request's key.
	single := map[string]string{"Idempotency-Key": "one-run"}
	if r := env.do(request{method: "POST", path: "/v1/executions", header: single, body: `{"language":"python","code":"print(1)"}`}); r.status != http.StatusOK {
		t.Fatalf("single run: %d %s", r.status, r.body)
	}
	r := env.do(request{method: "POST", path: "/v1/executions/batch", header: single, body: `{"executions":[{"language":"python","code":"print(1)"}]}`})
	refusal(t, r, http.StatusConflict, "idempotency_conflict")
	// A malformed key is refused before anything else.
	r = env.do(request{method: "POST", path: "/v1/executions/batch", header: map[string]string{"Idempotency-Key": "no spaces"}, body: body})
	refusal(t, r, http.StatusBadRequest, "invalid_idempotency_key")
	if n := env.usedToday(t, ""); n != 3 {
		t.Errorf("counted %v executions after the refusals, want 3", n)
	}
}
