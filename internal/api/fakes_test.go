package api

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"
	"github.com/kuboprotocol/vertal2kubo/internal/queue"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// fakeDriver stands in for a sandbox at the Driver seam. The code picks
// the outcome, so tests read like the programs they stand for:
//
//	"print(6 * 7)"  succeeded, stdout "42\n"
//	"exit N"         failed with exit code N
//	"loop"           timed_out, exit 137
//	"hog"            memory_exceeded, exit 137
//	"crash"          the platform fails (error, no result)
//	"block"          waits until the test closes unblock (or ctx ends)
//	"stream"         writes "é" to stdout split across two writes, then "warn"
//	                 to stderr, then "done"; stdout "é tick\ndone\n"
//	"slow"           writes "tick\n", waits for unblock (not ctx: a client
//	                 leaving must not stop it), writes "tock\n"
//	anything else    succeeded, stdout = the code's language name + "\n"
type fakeDriver struct {
	runs    atomic.Int64
	started chan string // receives spec.ID when a run starts, if not nil
	unblock chan struct{}
	mu      sync.Mutex
	specs   []engine.Spec
}

func newFakeDriver() *fakeDriver { return &fakeDriver{unblock: make(chan struct{})} }

func (d *fakeDriver) Name() string                      { return "fake" }
func (d *fakeDriver) Reap(context.Context) (int, error) { return 0, nil }
func (d *fakeDriver) release()                          { close(d.unblock) }
func (d *fakeDriver) lastSpec() engine.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.specs[len(d.specs)-1]
}

func (d *fakeDriver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	d.runs.Add(1)
	d.mu.Lock()
	d.specs = append(d.specs, spec)
	d.mu.Unlock()
	if d.started != nil {
		d.started <- spec.ID
	}
	ok := engine.Result{Status: engine.StatusSucceeded, Duration: 265 * time.Millisecond,
		Usage: engine.Usage{SandboxSeconds: 0.265, CPUSeconds: 0.02, PeakMemoryBytes: 9 << 20}}
	code := spec.Code
	switch {
	case code == "print(6 * 7)":
		ok.Stdout = "42\n"
	case strings.HasPrefix(code, "exit "):
		ok.Status, ok.Stderr = engine.StatusFailed, "boom\n"
		ok.ExitCode = int(code[len(code)-1] - '0')
	case code == "loop":
		ok.Status, ok.ExitCode, ok.Duration = engine.StatusTimedOut, 137, spec.Timeout
	case code == "hog":
		ok.Status, ok.ExitCode = engine.StatusMemoryExceeded, 137
	case code == "crash":
		return engine.Result{}, errors.New("runtime exploded at /var/lib/vertal/run/secret-path")
	case code == "stream":
		out := func(st engine.Stream, p string) {
			if spec.Output != nil {
				spec.Output(st, []byte(p))
			}
		}
		out(engine.Stdout, "\xc3")
		out(engine.Stdout, "\xa9 tick\n")
		out(engine.Stderr, "warn\n")
		out(engine.Stdout, "done\n")
		ok.Stdout, ok.Stderr = "é tick\ndone\n", "warn\n"
	case code == "slow":
		if spec.Output != nil {
			spec.Output(engine.Stdout, []byte("tick\n"))
		}
		<-d.unblock
		if spec.Output != nil {
			spec.Output(engine.Stdout, []byte("tock\n"))
		}
		ok.Stdout = "tick\ntock\n"
	case code == "block":
		select {
		case <-d.unblock:
			ok.Stdout = "unblocked\n"
		case <-ctx.Done():
			return engine.Result{}, ctx.Err()
		}
	default:
		ok.Stdout = spec.Language.Name + "\n"
	}
	if len(spec.ReturnFiles) > 0 {
		// Returns the files it was given, as if it had made them.
		ok.Files, ok.FilesTruncated = spec.Files, true
	}
	return ok, nil
}

// clock runs at real speed from a chosen start, and can jump.
type clock struct {
	mu     sync.Mutex
	base   time.Time
	start  time.Time
	offset time.Duration
}

func newClock(at time.Time) *clock { return &clock{base: at, start: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(time.Since(c.start) + c.offset)
}

// Set makes the clock read at now, running on from there.
func (c *clock) Set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.base, c.start, c.offset = at, time.Now(), 0
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// countingStore counts idempotency claims, so tests can wait until
// concurrent requests have reached the store, and fails key lookups when
// broken is set, to reach the 500 answers.
type countingStore struct {
	store.Store
	claims   atomic.Int64
	broken   atomic.Bool
	failSave atomic.Bool // SaveExecution fails, as on a full disk
	queued   sync.Map    // ids of executions created queued
}

func (s *countingStore) CreateExecution(ctx context.Context, e store.Execution) error {
	err := s.Store.CreateExecution(ctx, e)
	if err == nil && e.Status == store.StatusQueued {
		s.queued.Store(e.ID, true)
	}
	return err
}

// queuedID is the id of an execution that was created queued, or "".
func (e *testEnv) queuedID(t *testing.T) string {
	id := ""
	e.store.queued.Range(func(k, _ any) bool { id = k.(string); return false })
	return id
}

func (s *countingStore) SaveExecution(ctx context.Context, e store.Execution) error {
	if s.failSave.Load() {
		return errors.New("database or disk is full")
	}
	return s.Store.SaveExecution(ctx, e)
}

func (s *countingStore) KeyByHash(ctx context.Context, h [32]byte) (store.Key, error) {
	if s.broken.Load() {
		return store.Key{}, errors.New("database is on fire")
	}
	return s.Store.KeyByHash(ctx, h)
}

func (s *countingStore) ClaimIdempotency(ctx context.Context, tenant, key, bodyHash string, now, staleBefore, abandonedBefore time.Time) (store.Idempotency, bool, error) {
	s.claims.Add(1)
	return s.Store.ClaimIdempotency(ctx, tenant, key, bodyHash, now, staleBefore, abandonedBefore)
}

// jobQueue stands in for the durable queue: it keeps what the service
// queues, in order, and tests work the jobs themselves (work).
type jobQueue struct {
	mu         sync.Mutex
	runs       []queue.RunArgs
	deliveries []queue.DeliverArgs
}

func (q *jobQueue) EnqueueRuns(_ context.Context, jobs []queue.RunArgs) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.runs = append(q.runs, jobs...)
	return nil
}

func (q *jobQueue) EnqueueDelivery(_ context.Context, d queue.DeliverArgs) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.deliveries = append(q.deliveries, d)
	return nil
}

// runIDs are the execution ids queued to run, in order.
func (q *jobQueue) runIDs() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	ids := make([]string, len(q.runs))
	for i, r := range q.runs {
		ids[i] = r.ExecutionID
	}
	return ids
}

// work runs every queued execution and then makes one attempt at every
// queued delivery, as the queue's workers would.
func (e *testEnv) work() {
	e.t.Helper()
	q := e.queue
	q.mu.Lock()
	runs, deliveries := q.runs, q.deliveries
	q.runs, q.deliveries = nil, nil
	q.mu.Unlock()
	ctx := context.Background()
	for _, r := range runs {
		if err := e.svc.RunQueued(ctx, r.Tenant, r.ExecutionID); err != nil {
			e.t.Fatalf("running %s: %v", r.ExecutionID, err)
		}
	}
	q.mu.Lock()
	deliveries = append(deliveries, q.deliveries...)
	q.deliveries = nil
	q.mu.Unlock()
	for _, d := range deliveries {
		if err := e.svc.DeliverWebhook(ctx, d.Tenant, d.ExecutionID, 1, e.clock.Now()); err != nil {
			e.t.Errorf("delivering %s: %v", d.ExecutionID, err)
		}
	}
}

// withoutQueue makes a server that refuses async requests.
func withoutQueue() envOption {
	return func(c *envConfig) { c.noQueue = true }
}

// withWebhooks accepts webhook_url, with the address policy's allowed
// ranges; tests allow 127.0.0.0/8 to deliver to an httptest receiver.
func withWebhooks(allow ...string) envOption {
	return func(c *envConfig) {
		var prefixes []netip.Prefix
		for _, a := range allow {
			prefixes = append(prefixes, netip.MustParsePrefix(a))
		}
		guard := webhook.NewGuard(prefixes, nil)
		c.service.Webhooks = &execution.Webhooks{Guard: guard, Client: webhook.NewClient(webhook.Options{Guard: guard})}
	}
}

// testEnv is one server over a fake driver and a store.
type testEnv struct {
	t      testing.TB
	srv    *Server
	svc    *execution.Service // the srv's
	http   *httptest.Server
	store  *countingStore
	driver *fakeDriver
	queue  *jobQueue // nil withoutQueue
	engine *engine.Engine
	clock  *clock
	logs   *e2etest.Buffer
	key    string // a pro key of tenant "acme"
	keyID  string
	// covered holds "METHOD /template status" of every documented
	// response the server gave.
	covered sync.Map
}

type envConfig struct {
	opts    Options
	service execution.Options // its Store, Engine, Queue, Render, Metrics, Logger and Now are the env's
	engine  engine.Options
	mcp     *mcpserver.Options // mounts MCP, with MCPBackend, when set
	// mcpSandboxes, when set, gives the MCP tools sandboxes too.
	mcpSandboxes MCPSandboxes
	store        store.Store // under the countingStore; default storefake
	// noQueue leaves Options.Queue nil; otherwise it is a jobQueue.
	noQueue bool
}

type envOption func(*envConfig)

func withPlans(p map[string]config.Plan) envOption {
	return func(c *envConfig) { c.service.Plans = p }
}

func withEngine(e engine.Options) envOption {
	return func(c *envConfig) { c.engine = e }
}

func withOptions(f func(*Options)) envOption {
	return func(c *envConfig) { f(&c.opts) }
}

func withService(f func(*execution.Options)) envOption {
	return func(c *envConfig) { f(&c.service) }
}

// withMCP mounts the MCP server, its tools backed by the env's service.
func withMCP(o mcpserver.Options) envOption {
	return func(c *envConfig) { c.mcp = &o }
}

func withStore(st store.Store) envOption {
	return func(c *envConfig) { c.store = st }
}

// testLanguages are what config.ResolveLanguages gives for the oci driver.
var testLanguages = []engine.Language{
	{Name: "python", Image: "/img/rootfs", File: "main.py", Command: []string{"python3", "/code/main.py"}, Version: "3.11.2"},
	{Name: "javascript", Image: "/img/rootfs", File: "main.js", Command: []string{"node", "/code/main.js"}, Version: "22.23.5"},
	{Name: "bash", Image: "/img/rootfs", File: "main.sh", Command: []string{"bash", "/code/main.sh"}, Version: "5.2.15"},
}

var testStart = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func newEnv(t testing.TB, opts ...envOption) *testEnv {
	t.Helper()
	env := &testEnv{t: t, driver: newFakeDriver(), clock: newClock(testStart), logs: &e2etest.Buffer{}}
	cfg := envConfig{
		opts: Options{
			Version: "0.2.0-test",
			Logger:  slog.New(slog.NewJSONHandler(env.logs, nil)),
			Now:     env.clock.Now,
		},
		service: execution.Options{Languages: testLanguages, QueueTimeout: time.Second},
		engine:  engine.Options{MaxConcurrent: 256, MaxQueue: 1024, QueueTimeout: time.Second},
		store:   storefake.New(),
	}
	for _, f := range opts {
		f(&cfg)
	}
	env.store = &countingStore{Store: cfg.store}
	o, so := cfg.opts, cfg.service
	env.engine = enginetest.New(t, env.driver, cfg.engine)
	o.Metrics = NewMetrics()
	o.Metrics.SetEngine(env.engine)
	so.Store, so.Engine = env.store, env.engine
	so.Render, so.Metrics, so.Logger, so.Now = RenderExecution, o.Metrics, o.Logger, o.Now
	if !cfg.noQueue {
		env.queue = &jobQueue{}
		so.Queue = env.queue
	}
	svc, err := execution.New(so)
	if err != nil {
		t.Fatal(err)
	}
	o.Service, o.Store = svc, env.store
	if cfg.mcp != nil {
		o.MCP = mcpserver.HTTPHandler(mcpserver.HTTPOptions{Options: *cfg.mcp, Backend: MCPBackendWithSandboxes(svc, cfg.mcpSandboxes, o.Metrics, o.Logger)})
	}
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	env.srv, env.svc = srv, svc
	env.http = httptest.NewServer(conformance(t, srv, &env.covered))
	t.Cleanup(env.http.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", env.logs.String())
		}
	})
	env.key, env.keyID = env.newKey("acme", "pro")
	return env
}

func (e *testEnv) newKey(tenant, plan string) (secret, id string) {
	e.t.Helper()
	secret, k, err := CreateKey(context.Background(), e.store, tenant, plan, e.clock.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	return secret, k.ID
}

// request is one call; zero fields get defaults (POST body → JSON type).
type request struct {
	method string
	path   string
	key    string // "" → env.key; "-" → none
	body   string
	header map[string]string
	// add appends header values after the others, for repeated headers.
	add   [][2]string
	ctype *string
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (e *testEnv) do(r request) response {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodGet
	}
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, e.http.URL+r.path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	switch r.key {
	case "":
		req.Header.Set("Authorization", "Bearer "+e.key)
	case "-":
	default:
		req.Header.Set("Authorization", "Bearer "+r.key)
	}
	if r.ctype != nil {
		if *r.ctype != "" {
			req.Header.Set("Content-Type", *r.ctype)
		}
	} else if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	for _, kv := range r.add {
		req.Header.Add(kv[0], kv[1])
	}
	res, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// run posts code in language with optional extra JSON fields.
func (e *testEnv) run(language, code string, header map[string]string) response {
	e.t.Helper()
	return e.do(request{method: http.MethodPost, path: "/v1/executions", body: jsonBody(map[string]any{"language": language, "code": code}), header: header})
}

// goRun is run in a goroutine: the response arrives on the channel.
func (e *testEnv) goRun(language, code string, header map[string]string) <-chan response {
	c := make(chan response, 1)
	go func() { c <- e.run(language, code, header) }()
	return c
}

func ptr[T any](v T) *T { return &v }
