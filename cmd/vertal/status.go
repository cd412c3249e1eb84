package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// `vertal status` needs no new route on the server and no key: it puts
// together what an operator on the host can already read.
//   - The settings the server runs with (driver and runtime, pool sizes,
//     metrics address), from the server's operator socket in the data
//     directory (operator_socket.go). When the server cannot be asked,
//     the configuration this command resolves stands in, and says so.
//   - The public GET /health of the server at --url: up, and its version.
//   - One unauthenticated request to /v1/languages: 403 means the server
//     enforces the edge secret, 401 that it does not. The secret itself
//     is never read back or printed.
//   - The metrics listener (--metrics-addr), when configured: live warm
//     pool and sandbox slot numbers. It is the operator's listener already.
//   - The store, opened as the other operator commands do: today's totals
//     over every tenant and the async executions still queued.
//   - The configuration this command resolves (the same flags, VERTAL_*
//     variables and --config file as serve) finds the store and the
//     socket: run it where the server's data directory is (inside the
//     container: docker compose exec vertal vertal status).

// statusSettings are the settings status reads besides the store's.
var statusSettings = []string{"driver", "runtime", "max-concurrent", "pool-min", "pool-max", "pool-memory-mb", "metrics-addr", "edge-secret", "docker-image"}

// queuedCap bounds how many queued async executions status counts.
const queuedCap = 1000

type statusReport struct {
	CLIVersion string          `json:"cli_version"`
	Server     serverStatus    `json:"server"`
	Settings   settingsSource  `json:"settings"`
	Sandboxes  sandboxStatus   `json:"sandboxes"`
	Pool       poolStatus      `json:"pool"`
	Metrics    metricsStatus   `json:"metrics"`
	Today      todayStatus     `json:"today"`
	Async      *asyncStatus    `json:"async"`
	Store      storeStatus     `json:"store"`
	EdgeSecret edgeSecretState `json:"edge_secret"`
}

type serverStatus struct {
	URL     string `json:"url"`
	Healthy bool   `json:"healthy"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

type sandboxStatus struct {
	Driver        string   `json:"driver"`
	Runtime       string   `json:"runtime"` // "auto": the best installed
	MaxConcurrent int      `json:"max_concurrent"`
	InUse         *float64 `json:"in_use,omitempty"` // from /metrics
	Waiting       *float64 `json:"waiting,omitempty"`
}

type poolStatus struct {
	Enabled  bool      `json:"enabled"`
	Min      int       `json:"min"`
	Max      int       `json:"max"`
	MemoryMB int       `json:"memory_mb"`
	Live     *poolLive `json:"live,omitempty"` // from /metrics
}

type poolLive struct {
	Ready       float64 `json:"ready"`
	Starting    float64 `json:"starting"`
	InUse       float64 `json:"in_use"`
	MemoryBytes float64 `json:"memory_bytes"`
	Hits        float64 `json:"hits"`
	Misses      float64 `json:"misses"`
}

type metricsStatus struct {
	Addr  string `json:"addr,omitempty"`
	Error string `json:"error,omitempty"`
}

type todayStatus struct {
	Day            string  `json:"day"`
	Tenants        int     `json:"tenants"`
	Executions     int64   `json:"executions"`
	SandboxSeconds float64 `json:"sandbox_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
}

type asyncStatus struct {
	Queued  int  `json:"queued"`
	AtLeast bool `json:"at_least"` // more than Queued are waiting
}

type storeStatus struct {
	Kind     string `json:"kind"` // sqlite or postgresql
	Path     string `json:"path,omitempty"`
	Host     string `json:"host,omitempty"`
	Port     uint16 `json:"port,omitempty"`
	Database string `json:"database,omitempty"`
	User     string `json:"user,omitempty"`
	Error    string `json:"error,omitempty"`
}

// settingsSource says whose settings the report shows.
type settingsSource struct {
	From   string `json:"from"` // "server", or "this command" when it could not be asked
	Socket string `json:"socket"`
	Error  string `json:"error,omitempty"`
}

type edgeSecretState struct {
	Configured bool  `json:"configured"`         // in this command's configuration
	Enforced   *bool `json:"enforced,omitempty"` // by the running server; absent if it could not be asked
}

func cmdStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "status", "status [--url URL] [--json]\n\nShows the server's health and version, the sandbox driver and warm pool, today's totals\n"+
		"over all tenants, the store and whether the edge secret is on. Exits 1 if the server or the\n"+
		"store cannot be reached. Never prints a secret.")
	url := fs.String("url", "http://127.0.0.1:8080", "the server to ask (its /health), as reachable from here")
	asJSON := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", 5*time.Second, "how long each question to the server may take")
	cfg, pos, err := operatorFlags(e, fs, args, statusSettings...)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs)
	}
	hc := &http.Client{Timeout: *timeout}
	rep := gatherStatus(ctx, cfg, hc, strings.TrimRight(*url, "/"), time.Now())
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.write(e.Stdout); err != nil {
		return err
	}
	if !rep.Server.Healthy || rep.Store.Error != "" {
		return exitCode(1)
	}
	return nil
}

func gatherStatus(ctx context.Context, cfg config.Config, hc *http.Client, url string, now time.Time) statusReport {
	src := settingsSource{From: "server", Socket: operatorSocket(cfg.DataDir)}
	set, err := askServer(ctx, cfg.DataDir, hc.Timeout)
	if err != nil {
		src.From, src.Error = "this command", err.Error()
		set = newServerSettings(cfg, cfg.Driver+"/"+cfg.Runtime, "", 0)
	}
	rep := statusReport{
		CLIVersion: version,
		Server:     serverStatus{URL: url},
		Settings:   src,
		Sandboxes:  sandboxStatus{Driver: set.Driver, Runtime: set.Runtime, MaxConcurrent: set.MaxConcurrent},
		Pool:       poolStatus{Enabled: set.PoolMax > 0, Min: set.PoolMin, Max: set.PoolMax, MemoryMB: set.PoolMemoryMB},
		Today:      todayStatus{Day: now.UTC().Format(time.DateOnly)},
		EdgeSecret: edgeSecretState{Configured: cfg.EdgeSecret != ""},
	}
	if v, err := health(ctx, hc, url); err != nil {
		rep.Server.Error = err.Error()
	} else {
		rep.Server.Healthy, rep.Server.Version = true, v
		rep.EdgeSecret.Enforced = edgeEnforced(ctx, hc, url)
	}
	if set.MetricsAddr != "" {
		rep.Metrics.Addr = set.MetricsAddr
		if err := readMetrics(ctx, hc, set.MetricsAddr, &rep); err != nil {
			rep.Metrics.Error = err.Error()
		}
	}
	rep.Store = describeStore(cfg)
	if rep.Store.Error == "" {
		if err := readStore(ctx, cfg, now, &rep); err != nil {
			rep.Store.Error = err.Error()
		}
	}
	return rep
}

func get(ctx context.Context, hc *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return hc.Do(req)
}

// health asks GET /health and returns the server's version.
func health(ctx context.Context, hc *http.Client, url string) (string, error) {
	res, err := get(ctx, hc, url+"/health")
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	var h struct{ Status, Version string }
	if err := json.NewDecoder(io.LimitReader(res.Body, 64<<10)).Decode(&h); err != nil || res.StatusCode != http.StatusOK || h.Status != "ok" {
		return "", fmt.Errorf("GET /health: %s (is --url a Vertal Run server?)", res.Status)
	}
	return h.Version, nil
}

// edgeEnforced sends one request without the edge secret and without a
// key: the server answers 403 when it requires the secret, 401 when not.
func edgeEnforced(ctx context.Context, hc *http.Client, url string) *bool {
	res, err := get(ctx, hc, url+"/v1/languages")
	if err != nil {
		return nil
	}
	res.Body.Close()
	var on bool
	switch res.StatusCode {
	case http.StatusForbidden:
		on = true
	case http.StatusUnauthorized:
		on = false
	default:
		return nil
	}
	return &on
}

// readMetrics reads the live sandbox and pool gauges from the metrics
// listener, summing over labels (the pool's are per language and plan).
func readMetrics(ctx context.Context, hc *http.Client, addr string, rep *statusReport) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	res, err := get(ctx, hc, "http://"+net.JoinHostPort(host, port)+"/metrics")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /metrics: %s", res.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(res.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("reading /metrics: %w", err)
	}
	sum := func(name string) (float64, bool) {
		f, ok := fams[name]
		if !ok {
			return 0, false
		}
		var v float64
		for _, m := range f.GetMetric() {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
		return v, true
	}
	if v, ok := sum("vertal_sandboxes_in_use"); ok {
		rep.Sandboxes.InUse = &v
	}
	if v, ok := sum("vertal_queue_depth"); ok {
		rep.Sandboxes.Waiting = &v
	}
	if _, ok := fams["vertal_pool_ready"]; ok {
		var l poolLive
		l.Ready, _ = sum("vertal_pool_ready")
		l.Starting, _ = sum("vertal_pool_starting")
		l.InUse, _ = sum("vertal_pool_in_use")
		l.MemoryBytes, _ = sum("vertal_pool_memory_bytes")
		l.Hits, _ = sum("vertal_pool_hits_total")
		l.Misses, _ = sum("vertal_pool_misses_total")
		rep.Pool.Live = &l
	}
	return nil
}

// describeStore says where the store is, never with a password.
func describeStore(cfg config.Config) storeStatus {
	if !cfg.UsesPostgres() {
		return storeStatus{Kind: "sqlite", Path: sqlitePath(cfg)}
	}
	s := storeStatus{Kind: "postgresql"}
	pc, err := pgconn.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// The parser's message can quote the URL; say only that it is bad.
		s.Error = "database-url cannot be parsed"
		return s
	}
	s.Host, s.Port, s.Database, s.User = pc.Host, pc.Port, pc.Database, pc.User
	return s
}

// readStore adds today's totals over every tenant and the queued async
// executions.
func readStore(ctx context.Context, cfg config.Config, now time.Time, rep *statusReport) error {
	if !cfg.UsesPostgres() {
		// Opening would create an empty database: say it is missing.
		if _, err := os.Stat(sqlitePath(cfg)); errors.Is(err, iofs.ErrNotExist) {
			return fmt.Errorf("no database at %s (is --data-dir / VERTAL_DATA_DIR the server's?)", sqlitePath(cfg))
		}
	}
	st, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	keys, err := st.ListKeys(ctx, "")
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k.Tenant] {
			continue
		}
		seen[k.Tenant] = true
		u, err := st.Usage(ctx, k.Tenant, rep.Today.Day)
		if err != nil {
			return err
		}
		if u.Executions > 0 || u.SandboxSeconds > 0 {
			rep.Today.Tenants++
		}
		rep.Today.Executions += u.Executions
		rep.Today.SandboxSeconds += u.SandboxSeconds
		rep.Today.CPUSeconds += u.CPUSeconds
	}
	q, err := st.QueuedAsync(ctx, now, queuedCap)
	if err != nil {
		return err
	}
	rep.Async = &asyncStatus{Queued: len(q), AtLeast: len(q) == queuedCap}
	return nil
}

func (r statusReport) write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, a...)...) }
	if r.Server.Healthy {
		row("server", "%s: ok, version %s (this vertal: %s)", r.Server.URL, r.Server.Version, r.CLIVersion)
	} else {
		row("server", "%s: NOT REACHABLE: %s", r.Server.URL, r.Server.Error)
	}
	if r.Settings.From == "server" {
		row("settings", "the server's (from %s)", r.Settings.Socket)
	} else {
		row("settings", "THIS COMMAND'S, not the server's: %s", r.Settings.Error)
	}
	sb := fmt.Sprintf("%s driver, runtime %s, %d at once", r.Sandboxes.Driver, r.Sandboxes.Runtime, r.Sandboxes.MaxConcurrent)
	if r.Sandboxes.InUse != nil {
		sb += fmt.Sprintf("; %g in use", *r.Sandboxes.InUse)
	}
	if r.Sandboxes.Waiting != nil {
		sb += fmt.Sprintf(", %g waiting", *r.Sandboxes.Waiting)
	}
	row("sandboxes", "%s", sb)
	if !r.Pool.Enabled {
		row("warm pool", "off")
	} else {
		p := fmt.Sprintf("%d..%d per language, up to %d MiB waiting", r.Pool.Min, r.Pool.Max, r.Pool.MemoryMB)
		if l := r.Pool.Live; l != nil {
			p += fmt.Sprintf("; %g ready, %g starting, %g in use, %.0f MiB; %g hits, %g misses", l.Ready, l.Starting, l.InUse, l.MemoryBytes/(1<<20), l.Hits, l.Misses)
		}
		row("warm pool", "%s", p)
	}
	switch {
	case r.Metrics.Addr == "":
		row("metrics", "off (--metrics-addr adds live sandbox and pool numbers here)")
	case r.Metrics.Error != "":
		row("metrics", "%s: %s", r.Metrics.Addr, r.Metrics.Error)
	default:
		row("metrics", "http://%s/metrics", r.Metrics.Addr)
	}
	switch r.Store.Kind {
	case "sqlite":
		row("store", "sqlite %s", r.Store.Path)
	default:
		row("store", "postgresql host %s port %d database %s user %s", r.Store.Host, r.Store.Port, r.Store.Database, r.Store.User)
	}
	if r.Store.Error != "" {
		row("", "STORE ERROR: %s", r.Store.Error)
	} else {
		row("today", "%s UTC: %d executions, %.1f sandbox seconds, %.1f CPU seconds, %d tenants active",
			r.Today.Day, r.Today.Executions, r.Today.SandboxSeconds, r.Today.CPUSeconds, r.Today.Tenants)
		more := ""
		if r.Async.AtLeast {
			more = " or more"
		}
		row("async", "%d%s queued", r.Async.Queued, more)
	}
	switch e := r.EdgeSecret; {
	case e.Enforced != nil && *e.Enforced:
		row("edge secret", "on (the server refuses requests without it)")
	case e.Enforced != nil:
		row("edge secret", "OFF (the server answers without it; set VERTAL_EDGE_SECRET behind a public edge)")
	case e.Configured:
		row("edge secret", "configured here; the server was not asked")
	default:
		row("edge secret", "not configured here; the server was not asked")
	}
	return tw.Flush()
}
