package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// MetricsWriter adds its own series to /metrics (the warm pool, drivers).
// It must write complete families in the Prometheus text format.
type MetricsWriter interface {
	WriteMetrics(w io.Writer)
}

// Metrics holds the server's Prometheus registry: its own series, the Go
// runtime's and the process's. Label values come from bounded sets
// (routes, methods, statuses, codes, languages), never from client
// input, so the series count stays small.
type Metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	reqDur       *prometheus.HistogramVec
	executions   *prometheus.CounterVec
	execDur      *prometheus.HistogramVec
	errors       *prometheus.CounterVec
	replays      prometheus.Counter
	connsOpen    prometheus.Gauge
	connsRefused *prometheus.CounterVec
	connsEvicted prometheus.Counter

	mu     sync.Mutex
	engine *engine.Engine
	extra  []MetricsWriter
}

var buckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300}

// NewMetrics returns empty metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vertal_http_requests_total", Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		reqDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vertal_http_request_duration_seconds", Help: "HTTP request latency by route, including the sandbox run.", Buckets: buckets,
		}, []string{"route"}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vertal_executions_total", Help: "Executions by language and status (error: the platform failed).",
		}, []string{"language", "status"}),
		execDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vertal_execution_duration_seconds", Help: "Wall-clock time of finished executions in the sandbox.", Buckets: buckets,
		}, []string{"language"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vertal_api_errors_total", Help: "Error answers by error code.",
		}, []string{"code"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vertal_idempotent_replays_total", Help: "Executions answered from an earlier request with the same Idempotency-Key.",
		}),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vertal_connections_open", Help: "Client connections open on the API listener.",
		}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vertal_connections_refused_total", Help: "Connections answered 503 and closed for being over --max-conns (reason total), --max-conns-per-ip (per_address), --max-unauth-conns-per-prefix (per_prefix) or --max-unauth-conns (unauthenticated) with no idle connection to close instead, or whose request was refused for --max-conns-per-tenant (per_tenant).",
		}, []string{"reason"}),
		connsEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vertal_connections_evicted_total", Help: "Idle connections closed to make room for a new connection over a cap.",
		}),
	}
	m.reg.MustRegister(m.requests, m.reqDur, m.executions, m.execDur, m.errors, m.replays, m.connsOpen, m.connsRefused, m.connsEvicted,
		engineCollector{m}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Add registers more series sources.
func (m *Metrics) Add(w MetricsWriter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.extra = append(m.extra, w)
}

// SetEngine makes /metrics show e's sandbox slots and queue.
func (m *Metrics) SetEngine(e *engine.Engine) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.engine = e
}

var knownMethods = map[string]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "OPTIONS": true}

func (m *Metrics) observeRequest(route, method string, status int, d time.Duration) {
	if !knownMethods[method] {
		method = "other"
	}
	if route == "" {
		route = "other"
	}
	m.requests.WithLabelValues(route, method, fmt.Sprint(status)).Inc()
	m.reqDur.WithLabelValues(route).Observe(d.Seconds())
}

// ObserveExecution and ObserveReplay count for the execution service
// (they make Metrics an execution.Metrics).
func (m *Metrics) ObserveExecution(language, status string, d time.Duration) {
	m.executions.WithLabelValues(language, status).Inc()
	if status == string(engine.StatusError) {
		return
	}
	m.execDur.WithLabelValues(language).Observe(d.Seconds())
}

func (m *Metrics) observeError(code string) { m.errors.WithLabelValues(code).Inc() }

func (m *Metrics) ObserveReplay() { m.replays.Inc() }

// setOpenConnections and the observe*Connection(s) methods do nothing on nil
// Metrics, so a LimitListener works without them.
func (m *Metrics) setOpenConnections(n int) {
	if m != nil {
		m.connsOpen.Set(float64(n))
	}
}

func (m *Metrics) observeRefusedConnection(reason string) {
	if m != nil {
		m.connsRefused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) observeEvictedConnections(n int) {
	if m != nil {
		m.connsEvicted.Add(float64(n))
	}
}

// Handler serves the metrics; mount it on the operator's listener only.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(prometheus.Gatherers{m.reg, prometheus.GathererFunc(m.gatherExtra)},
		promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	return mux
}

// gatherExtra parses what the MetricsWriters write, so their families are
// checked and exposed like the registry's own.
func (m *Metrics) gatherExtra() ([]*dto.MetricFamily, error) {
	m.mu.Lock()
	extra := append([]MetricsWriter(nil), m.extra...)
	m.mu.Unlock()
	var out []*dto.MetricFamily
	var errs []error
	for _, e := range extra {
		var b bytes.Buffer
		e.WriteMetrics(&b)
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(&b)
		if err != nil {
			errs = append(errs, fmt.Errorf("metrics of %T: %w", e, err))
			continue
		}
		for _, f := range fams {
			out = append(out, f)
		}
	}
	return out, errors.Join(errs...)
}

// engineCollector reads the engine's slots and queue at scrape time; it
// has no series until the engine is set.
type engineCollector struct{ m *Metrics }

var (
	descInUse = prometheus.NewDesc("vertal_sandboxes_in_use", "Sandbox slots currently running code.", nil, nil)
	descSlots = prometheus.NewDesc("vertal_sandbox_slots", "Sandboxes that may run at once (--max-concurrent).", nil, nil)
	descQueue = prometheus.NewDesc("vertal_queue_depth", "Requests waiting for a free sandbox.", nil, nil)
)

func (engineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descInUse
	ch <- descSlots
	ch <- descQueue
}

func (c engineCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	e := c.m.engine
	c.m.mu.Unlock()
	if e == nil {
		return
	}
	st := e.Stats()
	ch <- prometheus.MustNewConstMetric(descInUse, prometheus.GaugeValue, float64(st.Running))
	ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(st.MaxConcurrent))
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(st.Waiting))
}
