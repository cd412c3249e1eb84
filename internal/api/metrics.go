package api

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// MetricsWriter adds its own series to /metrics (the warm pool, drivers).
// It must write complete families in the Prometheus text format.
type MetricsWriter interface {
	WriteMetrics(w io.Writer)
}

// Metrics collects counters and histograms and writes them in the
// Prometheus text exposition format. It is written by hand to keep the
// dependency list short; only what the server needs is implemented.
// Label values come from bounded sets (routes, methods, statuses, codes,
// languages), never from client input, so the series count stays small.
type Metrics struct {
	mu         sync.Mutex
	requests   map[[3]string]uint64 // route, method, status
	reqDur     map[string]*histogram
	executions map[[2]string]uint64 // language, status
	execDur    map[string]*histogram
	errors     map[string]uint64
	replays    uint64
	engine     *engine.Engine
	extra      []MetricsWriter
}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics {
	return &Metrics{
		requests:   map[[3]string]uint64{},
		reqDur:     map[string]*histogram{},
		executions: map[[2]string]uint64{},
		execDur:    map[string]*histogram{},
		errors:     map[string]uint64{},
	}
}

// Add registers more series sources.
func (m *Metrics) Add(w MetricsWriter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.extra = append(m.extra, w)
}

func (m *Metrics) setEngine(e *engine.Engine) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.engine = e
}

var buckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

type histogram struct {
	counts []uint64 // per bucket, not cumulative
	sum    float64
	count  uint64
}

func (h *histogram) observe(v float64) {
	if h.counts == nil {
		h.counts = make([]uint64, len(buckets))
	}
	for i, b := range buckets {
		if v <= b {
			h.counts[i]++
			break
		}
	}
	h.sum += v
	h.count++
}

var knownMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true}

func (m *Metrics) observeRequest(route, method string, status int, d time.Duration) {
	if !knownMethods[method] {
		method = "other"
	}
	if route == "" {
		route = "other"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests[[3]string{route, method, strconv.Itoa(status)}]++
	h := m.reqDur[route]
	if h == nil {
		h = &histogram{}
		m.reqDur[route] = h
	}
	h.observe(d.Seconds())
}

func (m *Metrics) observeExecution(language, status string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.executions[[2]string{language, status}]++
	if status == string(engine.StatusError) {
		return
	}
	h := m.execDur[language]
	if h == nil {
		h = &histogram{}
		m.execDur[language] = h
	}
	h.observe(d.Seconds())
}

func (m *Metrics) observeError(code string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.errors[code]++
}

func (m *Metrics) observeReplay() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.replays++
}

// Handler serves the metrics; mount it on the operator's listener only.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		m.Expose(w)
	})
	return mux
}

// Expose writes every series in the text format.
func (m *Metrics) Expose(w io.Writer) {
	m.mu.Lock()
	var b strings.Builder
	family(&b, "vertal_http_requests_total", "counter", "HTTP requests by route, method and status.")
	for _, k := range sortedKeys(m.requests, func(k [3]string) string { return strings.Join(k[:], "\x00") }) {
		fmt.Fprintf(&b, "vertal_http_requests_total{route=%s,method=%s,status=%s} %d\n", q(k[0]), q(k[1]), q(k[2]), m.requests[k])
	}
	family(&b, "vertal_http_request_duration_seconds", "histogram", "HTTP request latency by route, including the sandbox run.")
	for _, route := range sortedKeys(m.reqDur, func(k string) string { return k }) {
		writeHistogram(&b, "vertal_http_request_duration_seconds", "route="+q(route), m.reqDur[route])
	}
	family(&b, "vertal_executions_total", "counter", "Executions by language and status (error: the platform failed).")
	for _, k := range sortedKeys(m.executions, func(k [2]string) string { return k[0] + "\x00" + k[1] }) {
		fmt.Fprintf(&b, "vertal_executions_total{language=%s,status=%s} %d\n", q(k[0]), q(k[1]), m.executions[k])
	}
	family(&b, "vertal_execution_duration_seconds", "histogram", "Wall-clock time of finished executions in the sandbox.")
	for _, lang := range sortedKeys(m.execDur, func(k string) string { return k }) {
		writeHistogram(&b, "vertal_execution_duration_seconds", "language="+q(lang), m.execDur[lang])
	}
	family(&b, "vertal_api_errors_total", "counter", "Error answers by error code.")
	for _, code := range sortedKeys(m.errors, func(k string) string { return k }) {
		fmt.Fprintf(&b, "vertal_api_errors_total{code=%s} %d\n", q(code), m.errors[code])
	}
	family(&b, "vertal_idempotent_replays_total", "counter", "Executions answered from an earlier request with the same Idempotency-Key.")
	fmt.Fprintf(&b, "vertal_idempotent_replays_total %d\n", m.replays)
	if m.engine != nil {
		st := m.engine.Stats()
		family(&b, "vertal_sandboxes_in_use", "gauge", "Sandbox slots currently running code.")
		fmt.Fprintf(&b, "vertal_sandboxes_in_use %d\n", st.Running)
		family(&b, "vertal_sandbox_slots", "gauge", "Sandboxes that may run at once (--max-concurrent).")
		fmt.Fprintf(&b, "vertal_sandbox_slots %d\n", st.MaxConcurrent)
		family(&b, "vertal_queue_depth", "gauge", "Requests waiting for a free sandbox.")
		fmt.Fprintf(&b, "vertal_queue_depth %d\n", st.Waiting)
	}
	extra := append([]MetricsWriter(nil), m.extra...)
	m.mu.Unlock()
	_, _ = io.WriteString(w, b.String())
	for _, e := range extra {
		e.WriteMetrics(w)
	}
}

func family(b *strings.Builder, name, typ, help string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func writeHistogram(b *strings.Builder, name, labels string, h *histogram) {
	var cum uint64
	for i, le := range buckets {
		if h.counts != nil {
			cum += h.counts[i]
		}
		fmt.Fprintf(b, "%s_bucket{%s,le=%q} %d\n", name, labels, formatFloat(le), cum)
	}
	fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, labels, h.count)
	fmt.Fprintf(b, "%s_sum{%s} %s\n", name, labels, formatFloat(h.sum))
	fmt.Fprintf(b, "%s_count{%s} %d\n", name, labels, h.count)
}

func formatFloat(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// q quotes a label value as the text format wants.
func q(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(v) + `"`
}

func sortedKeys[K comparable, V any](m map[K]V, str func(K) string) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return str(keys[i]) < str(keys[j]) })
	return keys
}
