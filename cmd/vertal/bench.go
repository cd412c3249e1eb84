package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kuboprotocol/vertal2kubo/internal/bench"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

func cmdBench(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "bench", "bench [flags]\n\n"+
		"Runs print(6*7), console.log(6*7) and echo 42 N times through every available\n"+
		"driver/runtime and, in the same run, with the bare interpreter on the host; prints\n"+
		"p50/p95, executions per second at each parallel level, and the ratios to bare.\n"+
		"Needs root for the oci driver.")
	b := config.Bind(fs, "image-dir", "docker-image")
	n := fs.Int("n", 50, "executions per target, language and parallel level")
	warmup := fs.Int("warmup", 3, "unmeasured executions before each measurement")
	rounds := fs.Int("rounds", 5, "interleave the targets in this many rounds, so a load spike on a shared host hits them all alike")
	drivers := fs.String("drivers", "oci/crun,oci/runc,oci/runsc,docker/runc,docker/runsc", "driver/runtime pairs to measure; unavailable ones are reported and skipped")
	langs := fs.String("langs", "python,javascript,bash", "languages to measure")
	parallel := fs.String("parallel", "1,2", "parallel levels (executions in flight at once)")
	rawDocker := fs.Bool("raw-docker", true, "also time a raw docker run with the docker driver's hardening, for each docker runtime measured")
	httpSelf := fs.Bool("http", false, "also measure end to end through the HTTP API: starts private vertal serve processes (oci driver, the runtimes of --api-runtimes; one with the warm pool off, one with it on, as --api-pool says) on free local ports, each with its own data directory and a plan without limits")
	apiRuntimes := fs.String("api-runtimes", "", "with --http: the OCI runtimes the API servers use, e.g. crun,bwrap; one pair of servers per runtime (default: the first oci runtime of --drivers, else crun); a runtime the server cannot start with is reported and skipped")
	apiPool := fs.String("api-pool", "off,warm", "with --http: which API servers to start per runtime: off (warm pool off), warm (warm pool on), or both")
	cpuTail := fs.Duration("cpu-tail", 250*time.Millisecond, "keep the CPU window of each API block open up to this long after its last answer, until the server's /metrics shows it idle, so its work after answering (the warm pool refilling) is charged to the API and not to the next target (an --http-url server, whose metrics the bench cannot see, gets all of it)")
	httpURL := fs.String("http-url", "", "also measure through an already running API, e.g. http://127.0.0.1:8080/api (key in --api-key or KUBO_API_KEY; its plan's rate limit must allow the load)")
	apiKey := fs.String("api-key", "", "API key for --http-url (default $KUBO_API_KEY)")
	stateDir := fs.String("state-dir", "/run/vertal/bench", "private state directory for the bench's sandboxes")
	sustain := fs.Duration("sustain", 0, "with --http: after the table, load the warm-pool server with as many clients as the highest --parallel level for this long per language (e.g. 60s), against the bare interpreter for as long, and report throughput, p99/p50 and the server's memory before and after")
	settle := fs.Duration("settle", 10*time.Second, "with --sustain: how long after the load the server's memory is read again")
	sandboxes := fs.Bool("sandboxes", false, "also measure sandboxes that stay through a private vertal serve (oci driver, the first runtime of --api-runtimes, else of --drivers; needs vertal-agent next to vertal): create and delete p50/p95, echo 1 as a command against bare /bin/sh, an idle sandbox's memory read host-side, and how many idle sandboxes the host holds (--sandbox-fill)")
	table := fs.Bool("table", true, "measure the executions table; --table=false with --sandboxes measures only the sandboxes")
	sandboxN := fs.Int("sandbox-n", 50, "with --sandboxes: creates, commands and bare runs measured")
	sandboxFill := fs.Int("sandbox-fill", 200, "with --sandboxes: hold up to this many idle sandboxes at once (the plan's max_sandboxes; the next create meets it); 0 skips the fill")
	sandboxFloor := fs.Int64("sandbox-floor-mb", 4096, "with --sandboxes: stop the fill while the host still has this much memory available (MiB)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := b.Resolve(e.Getenv)
	if err != nil {
		return err
	}
	levels, err := parseInts(*parallel)
	if err != nil {
		return fmt.Errorf("--parallel: %w", err)
	}
	pools, err := parsePools(*apiPool)
	if err != nil {
		return fmt.Errorf("--api-pool: %w", err)
	}
	cpu := bench.NewHostCPU()
	opts := bench.Options{N: *n, Warmup: *warmup, Rounds: *rounds, Parallel: levels, Langs: splitList(*langs), CPU: cpu}
	for _, l := range opts.Langs {
		if _, ok := bench.Programs[l]; !ok {
			return fmt.Errorf("--langs: unknown language %q (python, javascript, bash)", l)
		}
	}
	// Whole-machine CPU is only as good as the machine is quiet: say how
	// busy it was before the bench started anything (the API servers'
	// pools fill at start).
	background, bgErr := bench.Background(ctx, cpu, time.Second)
	log := slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	imageNode := filepath.Join(cfg.RootFS(), "usr/local/bin/node")
	if _, err := os.Stat(imageNode); err != nil {
		imageNode = ""
	}
	targets := []bench.Target{bench.BareTarget(bench.BareCommands(imageNode))}
	var skipped []bench.Row
	work, err := os.MkdirTemp("", "vertal-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}

	pairs := splitList(*drivers)
	if !*table {
		pairs = nil // no table: no driver to measure
	}
	for _, pair := range pairs {
		kind, rt, _ := strings.Cut(pair, "/")
		c := cfg
		c.Driver, c.Runtime = kind, rt
		d, closeDriver, err := benchDriver(ctx, c, *stateDir, log)
		if err != nil {
			fmt.Fprintf(e.Stderr, "bench: skipping %s: %v\n", pair, err)
			skipped = append(skipped, bench.Row{Target: pair, Skipped: firstClause(err.Error())})
			continue
		}
		defer closeDriver()
		ls, err := c.ResolveLanguages()
		if err != nil {
			return err
		}
		targets = append(targets, bench.DriverTarget(d, ls))
		if kind == "docker" && *rawDocker {
			cli, err := exec.LookPath("docker")
			if err != nil {
				skipped = append(skipped, bench.Row{Target: "docker run " + rt + " (CLI)", Skipped: "no docker CLI in PATH"})
				continue
			}
			t, err := bench.DockerCLITarget(bench.DockerCLI{Docker: cli, Image: c.DockerImage, Runtime: c.Runtime, Languages: ls, WorkDir: work})
			if err != nil {
				return err
			}
			targets = append(targets, t)
		}
	}
	if *sustain > 0 && !*httpSelf {
		return errors.New("--sustain needs --http")
	}
	var warmServer *benchServer
	if *httpURL != "" {
		key := *apiKey
		if key == "" {
			key = e.Getenv("KUBO_API_KEY")
		}
		if key == "" {
			return errors.New("--http-url needs an API key: --api-key or KUBO_API_KEY")
		}
		t := bench.HTTPTarget(*httpURL, key, nil)
		t.CPUTail = *cpuTail
		targets = append(targets, t)
	}
	if *httpSelf {
		rts := splitList(*apiRuntimes)
		if len(rts) == 0 {
			rts = []string{firstOCIRuntime(splitList(*drivers))}
		}
		for _, rt := range rts {
			for _, mode := range pools {
				name := mode.name + " (oci/" + rt + ")"
				srv, err := startBenchServer(ctx, cfg, rt, slices.Max(levels), filepath.Join(work, mode.name+" "+rt), mode.env)
				if err != nil {
					// A runtime this build does not know, or one not
					// installed: the server exits, the row says why.
					fmt.Fprintf(e.Stderr, "bench: skipping %s: %v\n", name, err)
					skipped = append(skipped, bench.Row{Target: name, Skipped: firstClause(err.Error())})
					continue
				}
				defer srv.stop()
				if mode.name == bench.APIWarmPool && warmServer == nil {
					warmServer = srv
				}
				t := bench.HTTPTarget(srv.base, srv.key, nil)
				t.Name = name
				t.CPUTail, t.Idle = *cpuTail, srv.idle
				targets = append(targets, t)
			}
		}
	}

	total := len(targets) * len(opts.Langs) * len(levels)
	step := 0
	began := time.Now()
	opts.Progress = func(target, lang string, p int) {
		step++
		fmt.Fprintf(e.Stderr, "bench: [%d/%d] %s %s ×%d (%s elapsed)\n", step, total, target, lang, p, time.Since(began).Round(time.Second))
	}
	machine := bench.Machine(ctx)
	if !*table {
		opts.Langs, targets, skipped = nil, nil, nil
	}
	rows := bench.Run(ctx, targets, skipped, opts)
	if err := ctx.Err(); err != nil {
		return err
	}

	if *table {
		fmt.Fprintf(e.Stdout, "vertal bench: n=%d per cell in %d interleaved rounds, warm-up %d, parallel %s, %s\n",
			*n, *rounds, *warmup, *parallel, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	} else {
		fmt.Fprintf(e.Stdout, "vertal bench: sandboxes only, %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	}
	for _, l := range machine {
		fmt.Fprintln(e.Stdout, l)
	}
	fmt.Fprintf(e.Stdout, "CPU time: whole-machine busy time (/proc/stat, %d ticks/s) per successful execution over each target's blocks; API blocks stay open until the server is idle, at most %s; \"bench's own\" is this process's part (getrusage)\n", cpu.Hz, *cpuTail)
	if bgErr == nil {
		fmt.Fprintf(e.Stdout, "CPU time: before the run the machine kept %.2f CPUs busy on its own (the CPU columns are only as good as this is close to 0)\n", background)
	}
	fmt.Fprintln(e.Stdout)
	if *table {
		if err := bench.WriteMarkdown(e.Stdout, rows, levels); err != nil {
			return err
		}
	}
	if r := bench.Ratios(rows); len(r) > 0 {
		fmt.Fprintln(e.Stdout)
		bench.WriteRatios(e.Stdout, r)
	}
	for _, o := range bench.APIOverhead(rows) {
		fmt.Fprintln(e.Stdout, "- "+o)
	}
	if *sustain > 0 && warmServer != nil {
		results, err := sustainedLoad(ctx, e, targets[0], warmServer, opts.Langs, slices.Max(levels), *warmup, *sustain, *settle)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.Stdout, "\nSustained load through the API with the warm pool (oci), %d clients, against the bare interpreter:\n\n", slices.Max(levels))
		bench.WriteSustain(e.Stdout, results)
	}
	if *sandboxes {
		rt := firstOCIRuntime(splitList(*drivers))
		if rts := splitList(*apiRuntimes); len(rts) > 0 {
			rt = rts[0]
		}
		return benchSandboxes(ctx, e, cfg, sandboxBench{runtime: rt, n: *sandboxN, warmup: *warmup, rounds: *rounds,
			fill: *sandboxFill, floor: *sandboxFloor << 20, work: work, sandboxLifeS: 3600, serverConcurr: slices.Max(levels)})
	}
	return nil
}

// sustainedLoad runs each language for d on the bare interpreter, then for
// d through the warm-pool server with as many clients, reading the
// server's memory before the load, right after it and after settle.
func sustainedLoad(ctx context.Context, e *env, bare bench.Target, srv *benchServer, langs []string, clients, warmup int, d, settle time.Duration) ([]bench.SustainResult, error) {
	api := bench.HTTPTarget(srv.base, srv.key, nil)
	pid := srv.cmd.Process.Pid
	var out []bench.SustainResult
	for _, lang := range langs {
		fmt.Fprintf(e.Stderr, "bench: sustained load, %s: bare %s, then the API %s\n", lang, d, d)
		r := bench.SustainResult{Lang: lang, Duration: d, Clients: clients, Settle: settle}
		r.Bare = bench.Summarize(bench.MeasureFor(ctx, func(ctx context.Context) error { return bare.Run(ctx, lang) }, clients, warmup, d))
		var err error
		if r.RSSBefore, err = bench.ProcessRSS(pid); err != nil {
			return nil, err
		}
		r.API = bench.Summarize(bench.MeasureFor(ctx, func(ctx context.Context) error { return api.Run(ctx, lang) }, clients, warmup, d))
		if r.RSSAfter, err = bench.ProcessRSS(pid); err != nil {
			return nil, err
		}
		select {
		case <-time.After(settle):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if r.RSSSettled, err = bench.ProcessRSS(pid); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// benchDriver validates one --drivers pair and opens its driver; either
// failing makes the pair a skipped row, as a runtime that is not installed
// does, so one unusable pair does not cost the whole run.
func benchDriver(ctx context.Context, c config.Config, stateDir string, log *slog.Logger) (engine.Driver, func(), error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	d, _, closeDriver, err := newDriver(ctx, c, stateDir, log)
	return d, closeDriver, err
}

// firstOCIRuntime is the runtime of the first oci pair, the API servers'
// runtime when --api-runtimes is not given.
func firstOCIRuntime(pairs []string) string {
	for _, pair := range pairs {
		if k, r, _ := strings.Cut(pair, "/"); k == "oci" && r != "" {
			return r
		}
	}
	return "crun"
}

// apiPool is one kind of private API server: pool off is the API's own
// cost on top of a cold sandbox, the warm pool what a client of a default
// server sees.
type apiPool struct {
	name string
	env  []string
}

func parsePools(s string) ([]apiPool, error) {
	var out []apiPool
	for _, p := range splitList(s) {
		switch p {
		case "off":
			out = append(out, apiPool{bench.APIPoolOff, []string{"VERTAL_POOL_MIN=0", "VERTAL_POOL_MAX=0"}})
		case "warm":
			out = append(out, apiPool{bench.APIWarmPool, []string{"VERTAL_POOL_PLAN=bench"}})
		default:
			return nil, fmt.Errorf("%q is not off or warm", p)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("empty: give off, warm or off,warm")
	}
	return out, nil
}

// benchServer is a private `vertal serve` the bench measures through.
type benchServer struct {
	base, key string
	keys      []string // one per tenant, key first
	metrics   string   // URL of its /metrics
	cmd       *exec.Cmd
	log       string
	exited    chan struct{} // closed when the process has been waited for
}

// idle says whether the server has finished the work it does after
// answering: no sandbox in use, none being pre-started, and every warm
// pool back at its target.
func (s *benchServer) idle(ctx context.Context) (bool, error) {
	b, err := s.scrape(ctx)
	if err != nil {
		return false, err
	}
	return serverIdle(bytes.NewReader(b))
}

// scrape reads the server's /metrics.
func (s *benchServer) scrape(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metrics, nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", res.Status)
	}
	return io.ReadAll(io.LimitReader(res.Body, 8<<20))
}

// gauge reads the sum of a gauge's series from the server's /metrics.
func (s *benchServer) gauge(ctx context.Context, name string) (float64, error) {
	b, err := s.scrape(ctx)
	if err != nil {
		return 0, err
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return 0, fmt.Errorf("reading /metrics: %w", err)
	}
	var sum float64
	for _, m := range fams[name].GetMetric() {
		sum += m.GetGauge().GetValue()
	}
	return sum, nil
}

// serverIdle reads the gauges of idle from a /metrics text.
func serverIdle(r io.Reader) (bool, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(r, 8<<20))
	if err != nil {
		return false, fmt.Errorf("reading /metrics: %w", err)
	}
	if _, ok := fams["vertal_sandboxes_in_use"]; !ok {
		return false, errors.New("/metrics has no vertal_sandboxes_in_use")
	}
	// gauge maps each series of name, by its labels, to its value.
	gauge := func(name string) map[string]float64 {
		v := map[string]float64{}
		for _, m := range fams[name].GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v[strings.Join(labels, ",")] = m.GetGauge().GetValue()
		}
		return v
	}
	sum := func(name string) float64 {
		var t float64
		for _, v := range gauge(name) {
			t += v
		}
		return t
	}
	if sum("vertal_sandboxes_in_use") > 0 || sum("vertal_pool_starting") > 0 || sum("vertal_pool_in_use") > 0 {
		return false, nil
	}
	ready := gauge("vertal_pool_ready")
	for bucket, want := range gauge("vertal_pool_target") {
		if ready[bucket] < want {
			return false, nil
		}
	}
	return true, nil
}

func (s *benchServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// startBenchServer runs this binary's `serve` on a free port with its own
// data directory, a plan without practical limits (so quotas and rate
// limits do not shape the numbers) and a key for it, all through the
// public CLI and environment variables.
func startBenchServer(ctx context.Context, cfg config.Config, runtime string, concurrent int, dir string, extraEnv []string) (*benchServer, error) {
	plan := `{"plans": {"bench": {"executions_per_day": 1000000000, "requests_per_minute": 10000000, "max_timeout_s": 60, "memory_mb": 256, "max_concurrent": 1024}}}`
	return startBenchServerWith(ctx, cfg, runtime, concurrent, dir, extraEnv, plan, []string{"bench"})
}

// startBenchServerWith is startBenchServer with its own config file (plan,
// a JSON config with a plan named bench) and a key on that plan for each
// of tenants (the first is benchServer.key, all are in keys).
func startBenchServerWith(ctx context.Context, cfg config.Config, runtime string, concurrent int, dir string, extraEnv []string, plan string, tenants []string) (*benchServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(plan), 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	metricsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(),
		"VERTAL_CONFIG="+filepath.Join(dir, "config.json"),
		"VERTAL_DATA_DIR="+filepath.Join(dir, "data"),
		"VERTAL_HOST=127.0.0.1", "VERTAL_PORT="+strconv.Itoa(port),
		"VERTAL_DRIVER=oci", "VERTAL_RUNTIME="+runtime,
		"VERTAL_IMAGE_DIR="+cfg.ImageDir,
		"VERTAL_MAX_CONCURRENT="+strconv.Itoa(max(2, concurrent)),
		"VERTAL_DATABASE_URL=", "VERTAL_DEV=", "VERTAL_EDGE_SECRET=", "VERTAL_METRICS_ADDR=127.0.0.1:"+strconv.Itoa(metricsPort))
	env = append(env, extraEnv...)
	var keys []string
	for _, tenant := range tenants {
		key := exec.CommandContext(ctx, exe, "create-key", tenant, "--plan", "bench")
		key.Env = env
		var stderr strings.Builder
		key.Stderr = &stderr
		out, err := key.Output()
		if err != nil {
			return nil, fmt.Errorf("vertal create-key: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		keys = append(keys, strings.TrimSpace(string(out)))
	}
	s := &benchServer{base: fmt.Sprintf("http://127.0.0.1:%d/api", port), key: keys[0], keys: keys,
		metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), log: filepath.Join(dir, "serve.log")}
	logf, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(exe, "serve")
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting vertal serve: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.exited:
			// It refused its configuration (an unknown runtime, say) or
			// could not open its driver: its last log line says why.
			tail, _ := os.ReadFile(s.log)
			return nil, fmt.Errorf("vertal serve exited: %s", strings.TrimPrefix(lastLines(string(tail), 1), "vertal serve: "))
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			tail, _ := os.ReadFile(s.log)
			return nil, fmt.Errorf("vertal serve did not answer /health within 60s: %s", lastLines(string(tail), 10))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// freePort asks the kernel for a free local port. Another process could
// take it before the server binds it; on a test host that is rare enough.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 || v > 64 {
			return nil, fmt.Errorf("%q is not a number in 1..64", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// firstClause shortens a driver error for a table cell.
func firstClause(s string) string {
	s = strings.TrimPrefix(s, "engine: sandbox driver unavailable: ")
	if len(s) > 90 {
		s = s[:89] + "…"
	}
	return s
}
