package api

import (
	"bufio"
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

type poolMetrics struct{}

func (poolMetrics) WriteMetrics(w io.Writer) {
	io.WriteString(w, "# HELP vertal_pool_ready Ready sandboxes.\n# TYPE vertal_pool_ready gauge\nvertal_pool_ready{language=\"python\"} 2\n")
}

// sample is "name{labels} value" as the text format writes it.
var sample = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? ([-+0-9.eE]+|[-+]Inf|NaN)$`)

func scrape(t *testing.T, m *Metrics) map[string]string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("metrics: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	out := map[string]string{}
	sc := bufio.NewScanner(rec.Body)
	typed := map[string]bool{}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# TYPE ") {
			typed[strings.Fields(line)[2]] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		if !sample.MatchString(line) {
			t.Errorf("malformed sample line %q", line)
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		name := line[:i]
		if j := strings.IndexAny(name, "{"); j >= 0 {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name[:j], "_bucket"), "_sum"), "_count")
			if !typed[base] && !typed[name[:j]] {
				t.Errorf("sample %s has no # TYPE", name)
			}
		}
		out[name] = line[i+1:]
	}
	return out
}

func TestMetrics(t *testing.T) {
	env := newEnv(t, withEngine(engine.Options{MaxConcurrent: 3, MaxQueue: 12, QueueTimeout: time.Second}))
	env.srv.Metrics().Add(poolMetrics{})
	env.run("python", "print(6 * 7)", nil)
	env.run("python", "exit 1", nil)
	env.run("bash", "loop", nil)
	env.run("python", "crash", nil)
	env.do(request{path: "/v1/usage", key: "-"})
	env.do(request{path: "/health", key: "-"})
	env.do(request{method: "BREW", path: "/health", key: "-"})

	got := scrape(t, env.srv.Metrics())
	for name, want := range map[string]string{
		`vertal_executions_total{language="python",status="succeeded"}`:                 "1",
		`vertal_executions_total{language="python",status="failed"}`:                    "1",
		`vertal_executions_total{language="bash",status="timed_out"}`:                   "1",
		`vertal_executions_total{language="python",status="error"}`:                     "1",
		`vertal_http_requests_total{method="POST",route="/v1/executions",status="200"}`: "3",
		`vertal_http_requests_total{method="POST",route="/v1/executions",status="500"}`: "1",
		`vertal_http_requests_total{method="GET",route="/v1/usage",status="401"}`:       "1",
		`vertal_http_requests_total{method="GET",route="/health",status="200"}`:         "1",
		`vertal_http_requests_total{method="other",route="other",status="405"}`:         "1",
		`vertal_api_errors_total{code="unauthorized"}`:                                  "1",
		`vertal_api_errors_total{code="sandbox_error"}`:                                 "1",
		`vertal_execution_duration_seconds_bucket{language="python",le="0.25"}`:         "0",
		`vertal_execution_duration_seconds_bucket{language="python",le="0.5"}`:          "2",
		`vertal_execution_duration_seconds_count{language="python"}`:                    "2",
		`vertal_http_request_duration_seconds_count{route="/v1/executions"}`:            "4",
		`vertal_sandbox_slots`:                 "3",
		`vertal_sandboxes_in_use`:              "0",
		`vertal_queue_depth`:                   "0",
		`vertal_idempotent_replays_total`:      "0",
		`vertal_pool_ready{language="python"}`: "2",
	} {
		if got[name] != want {
			t.Errorf("%s = %q, want %q", name, got[name], want)
		}
	}
	// The Go runtime's and the process's own series come with the library.
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_open_fds", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if got[name] == "" {
			t.Errorf("no %s", name)
		}
	}
}

type brokenMetrics struct{}

func (brokenMetrics) WriteMetrics(w io.Writer) { io.WriteString(w, "not the text format {\n") }

// TestMetricsBrokenWriter: a source that writes garbage is reported, and
// every other series is still served.
func TestMetricsBrokenWriter(t *testing.T) {
	m := NewMetrics()
	m.Add(brokenMetrics{})
	m.Add(poolMetrics{})
	m.ObserveReplay()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"vertal_idempotent_replays_total 1", `vertal_pool_ready{language="python"} 2`, "go_goroutines "} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in:\n%s", want, body)
		}
	}
}

// TestSandboxesInUseGauge reads the gauge while an execution is running.
func TestSandboxesInUseGauge(t *testing.T) {
	env := newEnv(t)
	env.driver.started = make(chan string, 1)
	done := env.goRun("python", "block", nil)
	<-env.driver.started
	if got := scrape(t, env.srv.Metrics())["vertal_sandboxes_in_use"]; got != "1" {
		t.Errorf("in use while running = %s", got)
	}
	env.driver.release()
	<-done
}
