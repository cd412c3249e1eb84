package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/egress/egresstest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

var volatile = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`req_[0-9a-f]{32}`), "req_<id>"},
	{regexp.MustCompile(`exe_[0-9a-f]{32}`), "exe_<id>"},
	{regexp.MustCompile(`"X-Quota-Reset": "[0-9]+"`), `"X-Quota-Reset": "<unix>"`},
	{regexp.MustCompile(`key_[0-9a-f]{12}`), "key_<id>"},
	{regexp.MustCompile(`kubo_sk_[0-9A-Za-z]{43}`), "kubo_sk_<secret>"},
	{regexp.MustCompile(`whsec_[0-9a-f]{64}`), "whsec_<secret>"},
	{regexp.MustCompile(`e2bat_[0-9a-f]{48}`), "e2bat_<token>"},
	{regexp.MustCompile(`"(created|started|finished)_at": [0-9]+`), `"${1}_at": <unix>`},
	{regexp.MustCompile(`"Retry-After": "[0-9]+"`), `"Retry-After": "<seconds>"`},
}

// golden compares a response (status, chosen headers, indented body) with
// testdata/<name>.golden; go test -update rewrites the files.
func golden(t *testing.T, name string, r response, headers ...string) {
	t.Helper()
	var body bytes.Buffer
	if err := json.Indent(&body, r.body, "", "  "); err != nil {
		t.Fatalf("%s: body is not JSON: %s", name, r.body)
	}
	h := map[string]string{}
	for _, k := range headers {
		h[k] = r.header.Get(k)
	}
	hj, _ := json.MarshalIndent(h, "", "  ")
	goldenFile(t, name, []byte("status: "+strconv.Itoa(r.status)+"\nheaders: "+string(hj)+"\n"+body.String()))
}

// goldenFile compares got, its volatile parts replaced, with
// testdata/<name>.golden; go test -update rewrites the file.
func goldenFile(t *testing.T, name string, got []byte) {
	t.Helper()
	for _, v := range volatile {
		got = v.re.ReplaceAll(got, []byte(v.repl))
	}
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", name, diff)
	}
}

func TestGoldenResponses(t *testing.T) {
	env := newEnv(t)
	run := env.run("python", "print(6 * 7)", map[string]string{"Idempotency-Key": "order-1234"})
	golden(t, "run_succeeded", run, "Content-Type", "X-Quota-Limit", "X-Quota-Remaining", "X-RateLimit-Limit")
	golden(t, "run_replay", env.run("python", "print(6 * 7)", map[string]string{"Idempotency-Key": "order-1234"}))
	golden(t, "run_failed", env.run("bash", "exit 3", nil))
	golden(t, "run_timed_out", env.run("javascript", "loop", nil))
	id := decode(t, run)["id"].(string)
	golden(t, "get_execution", env.do(request{path: "/v1/executions/" + id}))
	golden(t, "usage", env.do(request{path: "/v1/usage"}))
	golden(t, "languages", env.do(request{path: "/v1/languages"}))
	golden(t, "health", env.do(request{path: "/health", key: "-"}))
	golden(t, "error_invalid_timeout", env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","timeout_s":999}`}))
	golden(t, "error_unsupported_language", env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"cobol","code":"x"}`}))
	golden(t, "error_unknown_field", env.do(request{method: "POST", path: "/v1/executions", body: `{"language":"python","code":"x","lang":"y"}`}))
	golden(t, "error_not_found", env.do(request{path: "/v2/anything"}))
	golden(t, "error_method", env.do(request{method: "DELETE", path: "/v1/usage"}), "Allow")
	golden(t, "error_unauthorized", env.do(request{path: "/v1/usage", key: "-"}), "WWW-Authenticate")
	golden(t, "rotate", env.do(request{method: "POST", path: "/v1/keys/rotate"}))
}

func TestGoldenAsyncResponses(t *testing.T) {
	env := newEnv(t, withWebhooks("127.0.0.0/8"))
	golden(t, "async_accepted", env.do(request{method: "POST", path: "/api/v1/executions",
		body: `{"language":"python","code":"print(6 * 7)","async":true,"webhook_url":"http://127.0.0.1:9/hook"}`}),
		"Location", "Preference-Applied", "X-Quota-Remaining")
	batch := `{"executions":[{"language":"python","code":"print(6 * 7)"},{"language":"bash","code":"echo hi"}]}`
	golden(t, "batch_accepted", env.do(request{method: "POST", path: "/v1/executions/batch", body: batch}))
	keyed := map[string]string{"Idempotency-Key": "batch-1"}
	env.do(request{method: "POST", path: "/v1/executions/batch", body: batch, header: keyed})
	golden(t, "batch_replay", env.do(request{method: "POST", path: "/v1/executions/batch", body: batch, header: keyed}))
	golden(t, "error_batch_idempotency_conflict", env.do(request{method: "POST", path: "/v1/executions/batch",
		body: `{"executions":[{"language":"python","code":"print(6 * 7)"}]}`, header: keyed}))
	golden(t, "error_batch_item", env.do(request{method: "POST", path: "/v1/executions/batch",
		body: `{"executions":[{"language":"python","code":"print(6 * 7)"},{"language":"cobol","code":"x"}]}`}))
	golden(t, "webhook_secret", env.do(request{path: "/v1/webhook-secret"}))
}

// TestGoldenImages: GET /v1/images of an image built by vertal image
// build, with its main packages and the tools every built image carries
// (one, file, is missing: the image predates it, so it is not listed).
func TestGoldenImages(t *testing.T) {
	dir := t.TempDir()
	m := `{"name":"datasci","version":"20261201T080500Z-1","built_at":"2026-12-01T08:05:00Z",
	  "recipe":{"apt":["python3-numpy"]},"languages":{"python":"3.11.2"},
	  "packages":{"dpkg":{"python3-numpy":"1:1.24.2-1","bc":"1.07.1-3+b1","jq":"1.6-2.1","procps":"2:4.0.2-3"},"npm":{},"pip":{}}}`
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(m), 0o644); err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, withService(func(o *execution.Options) {
		o.Images = []config.Image{
			{Name: config.DefaultImage, Languages: testLanguages},
			{Name: "datasci", Dir: dir, Languages: testLanguages},
		}
	}))
	golden(t, "images", env.do(request{path: "/v1/images"}))
}

// TestGoldenNetwork: an execution on a plan with egress, whose program
// (here the test, through the socket its Spec names, while the fake
// driver holds the run) reaches one name on its list and is refused
// another: the network record and the usage's byte counts on the wire.
func TestGoldenNetwork(t *testing.T) {
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") }))
	t.Cleanup(site.Close)
	port := site.Listener.Addr().(*net.TCPAddr).Port
	host, err := egress.NewHost(egress.HostOptions{Dir: filepath.Join(t.TempDir(), "net"), Guard: egresstest.Guard("127.0.0.1/32"),
		Resolver: egresstest.Zone{"files.test": egresstest.Addrs("127.0.0.1")}, HTTPPorts: []int{port}})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Reap(); err != nil {
		t.Fatal(err)
	}
	plan := config.DefaultPlans()["pro"]
	plan.Egress = &config.Egress{Allow: []string{"files.test", "*.mirror.test"}}
	env := newEnv(t, withPlans(map[string]config.Plan{"pro": plan}), withService(func(o *execution.Options) {
		o.Egress, o.Agent = host, "/usr/lib/vertal/vertal-agent"
	}))
	env.driver.started = make(chan string, 1)
	done := make(chan response, 1)
	go func() {
		done <- env.do(request{method: "POST", path: "/v1/executions",
			body: `{"language":"python","code":"slow","network":{"allow":["files.test"]}}`})
	}()
	<-env.driver.started
	c := egresstest.Client(filepath.Join(env.driver.lastSpec().EgressDir, egress.SocketName))
	for _, tc := range []struct {
		host   string
		status int
	}{{"files.test", http.StatusOK}, {"pkg.mirror.test", http.StatusForbidden}} {
		r, err := c.Get("http://" + tc.host + ":" + strconv.Itoa(port) + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != tc.status {
			t.Errorf("GET %s: %d, want %d", tc.host, r.StatusCode, tc.status)
		}
	}
	c.CloseIdleConnections()
	env.driver.release()
	r := <-done
	var body bytes.Buffer
	if err := json.Indent(&body, r.body, "", "  "); err != nil {
		t.Fatalf("body is not JSON: %s", r.body)
	}
	got := regexp.MustCompile(`(127\.0\.0\.1:|"port": )`+strconv.Itoa(port)).ReplaceAll(body.Bytes(), []byte("${1}<port>"))
	goldenFile(t, "run_network", []byte("status: "+strconv.Itoa(r.status)+"\n"+string(got)))
}
