// Package execution is the one path a request to run code takes, whatever
// its entry point (the HTTP API, the MCP server, and later async workers):
// validate and apply defaults (where a request becomes an engine.Spec),
// claim the Idempotency-Key, store the accepted execution, wait for a
// sandbox slot fairly among tenants, reserve the daily quota, run, then
// meter (or refund) and store the result. Entry points only translate
// their wire format to an Input and a returned *Error to theirs.
//
// Nothing is acknowledged that is not stored: an execution is written to
// the store when it is accepted (queued or running) and again when it
// finishes; if either write fails, the caller gets KindUnavailable, the
// quota is given back and the idempotency claim released.
package execution

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Options configure a Service. Store and Engine are required.
type Options struct {
	Store  store.Store
	Engine *engine.Engine
	// Languages are the runnable languages of the default image
	// (config.ResolveLanguages), used when Images is empty.
	Languages []engine.Language
	// Images are the images requests may name (config.ResolveImages),
	// the default one first; nil means one "default" image of Languages.
	Images []config.Image
	// Plans by name; nil means config.DefaultPlans(). The longest timeout
	// of any plan bounds how long an idempotency claim can be held.
	Plans map[string]config.Plan
	// MaxCodeBytes and MaxStdinBytes cap a request; zero means the config
	// defaults.
	MaxCodeBytes  int
	MaxStdinBytes int
	// QueueTimeout is the engine's wait for a slot; it bounds how long a
	// request waits for a concurrent one with the same Idempotency-Key.
	QueueTimeout time.Duration
	// IdempotencyWait overrides that bound (plan max timeout + QueueTimeout
	// + 15 s); IdempotencyPoll is the longest pause between two looks at
	// the store while waiting (default 200 ms).
	IdempotencyWait time.Duration
	IdempotencyPoll time.Duration
	// CancelPoll is how often the node running an execution looks in the
	// store for a cancel recorded by another node (default 1 s).
	CancelPoll time.Duration
	// NodeID names this server among those sharing the store; executions it
	// runs are owned by it, and settled by another node if it stops
	// sending heartbeats (see Start). Stable across restarts of one
	// installation, unique among the nodes of one database.
	NodeID string
	// Queue is where async executions and webhook deliveries wait; nil
	// refuses async requests.
	Queue Queue
	// Webhooks check and deliver webhook_url; nil refuses webhook_url.
	Webhooks *Webhooks
	// Render is the JSON a webhook delivers for an execution: exactly what
	// GET /v1/executions/{id} answers. Required with Webhooks.
	Render func(store.Execution) ([]byte, error)
	// NodeTimeout is how long a node may go without a heartbeat before its
	// executions are settled (default 60 s); heartbeats are sent every
	// NodeTimeout/6.
	NodeTimeout time.Duration
	// Metrics counts executions and replays; nil counts nothing.
	Metrics Metrics
	// Logger receives what goes wrong after an answer is decided; nil
	// discards it.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Metrics is what the service reports to the operator's metrics.
type Metrics interface {
	ObserveReplay()
	ObserveExecution(language, status string, d time.Duration)
}

// Caller is the authenticated tenant behind a request.
type Caller struct {
	Key  store.Key // the key used; Key.Plan is the tenant's plan
	Plan config.Plan
}

// Service runs executions. It is safe for concurrent use.
type Service struct {
	opts    Options
	store   store.Store
	engine  *engine.Engine
	langs   Languages
	images  images
	plans   map[string]config.Plan
	metrics Metrics
	log     *slog.Logger
	now     func() time.Time

	mu     sync.Mutex
	active map[string]*active // executions accepted on this node and not yet final

	unsaved atomic.Int32 // results kept in memory until the store takes them (keepSaving)
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Store == nil || opts.Engine == nil {
		return nil, errors.New("execution: Store and Engine are required")
	}
	s := &Service{
		opts:    opts,
		store:   opts.Store,
		engine:  opts.Engine,
		plans:   opts.Plans,
		metrics: opts.Metrics,
		log:     opts.Logger,
		now:     opts.Now,
		active:  map[string]*active{},
	}
	if s.plans == nil {
		s.plans = config.DefaultPlans()
	}
	if s.metrics == nil {
		s.metrics = noMetrics{}
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.opts.MaxCodeBytes <= 0 {
		s.opts.MaxCodeBytes = config.DefaultMaxCodeBytes
	}
	if s.opts.MaxStdinBytes <= 0 {
		s.opts.MaxStdinBytes = config.DefaultMaxStdinBytes
	}
	if s.opts.IdempotencyPoll <= 0 {
		s.opts.IdempotencyPoll = 200 * time.Millisecond
	}
	if s.opts.CancelPoll <= 0 {
		s.opts.CancelPoll = time.Second
	}
	list := opts.Images
	if len(list) == 0 {
		list = []config.Image{{Name: config.DefaultImage, Languages: opts.Languages}}
	}
	var err error
	if s.images, err = newImages(list); err != nil {
		return nil, err
	}
	def, ok := s.images.byName[config.DefaultImage]
	if !ok {
		return nil, errors.New("execution: no default image")
	}
	s.langs = def.langs
	return s, nil
}

type noMetrics struct{}

func (noMetrics) ObserveReplay()                                 {}
func (noMetrics) ObserveExecution(string, string, time.Duration) {}

// Languages are the languages the service runs.
func (s *Service) Languages() Languages { return s.langs }

// MaxCodeBytes and MaxStdinBytes are the request caps in effect.
func (s *Service) MaxCodeBytes() int  { return s.opts.MaxCodeBytes }
func (s *Service) MaxStdinBytes() int { return s.opts.MaxStdinBytes }

var idPattern = regexp.MustCompile(`^exe_[0-9a-f]{32}$`)

// ValidID reports whether id looks like an execution id.
func ValidID(id string) bool { return idPattern.MatchString(id) }

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails; it aborts the process instead
	return "exe_" + hex.EncodeToString(b)
}

// runMargin is added to an execution's timeout to bound the whole run,
// including sandbox creation and teardown, when the client has gone.
const runMargin = 60 * time.Second

// cancelWait bounds how long Cancel waits for a run on this node to end.
const cancelWait = 15 * time.Second

// Request is one request to run code.
type Request struct {
	Input
	// IdempotencyKey, when set, makes a retry with the same Input get the
	// stored result instead of running again.
	IdempotencyKey string
	// RequestID is stored with the execution.
	RequestID string
	// Accepted, if set, is called with the execution's id when it is
	// stored or replayed (for the access log).
	Accepted func(id string)
	// Quota, if set, is called once the daily quota has been reserved.
	Quota func(Quota)
	// Started, if set, is called when the sandbox is about to run: past
	// every refusal, quota reserved. Attach follows it live from then on
	// (a stream that attaches in Started misses nothing). It is not
	// called for a replay or an execution canceled before it started.
	Started func(id string)
}

// Quota is a tenant's daily execution quota after a reservation.
type Quota struct {
	Limit     int64
	Remaining int64
	Reset     time.Time // the next UTC midnight
}

// Outcome is a finished execution: run now, or replayed.
type Outcome struct {
	Execution store.Execution
	Replay    bool
}

// Run runs one request through the whole sequence. A program that fails,
// times out or is canceled is an Outcome; an error is an *Error (or the
// caller's ctx.Err() when it left while waiting), and then nothing was
// stored, nothing counted and the idempotency claim released.
func (s *Service) Run(ctx context.Context, c Caller, req Request) (Outcome, error) {
	if req.Input.WebhookURL != nil && *req.Input.WebhookURL != "" {
		return Outcome{}, Errorf(KindInvalidRequest, `webhook_url needs an async request ("async": true, or the header Prefer: respond-async)`)
	}
	p, err := s.prepare(c, req.Input)
	if err != nil {
		return Outcome{}, err
	}
	return s.idempotentOne(ctx, c, req, p.hash, func() (store.Execution, error) {
		return s.run(ctx, c, req, p)
	})
}

// run is the sequence after the idempotency claim. On error nothing is
// left stored or counted.
func (s *Service) run(ctx context.Context, c Caller, req Request, p prepared) (_ store.Execution, err error) {
	tenant := c.Key.Tenant
	bg := context.WithoutCancel(ctx)
	now := s.now().UTC()
	exe := store.Execution{
		ID:        newID(),
		Tenant:    tenant,
		KeyID:     c.Key.ID,
		RequestID: req.RequestID,
		Language:  p.spec.Language.Name,
		Image:     p.image,
		// The pool may still hand out a sandbox warmed on the build
		// before an update, until it idles out (docs/API.md).
		ImageVersion: p.imageBuild,
		CreatedAt:    now,
		Owner:        s.opts.NodeID,
		// Settling the execution after a crash completes the key's claim.
		IdempotencyKey: req.IdempotencyKey,
	}
	p.spec.ID = exe.ID
	a := &active{tenant: tenant, events: newEventLog(), done: make(chan struct{})}
	p.spec.Output = a.events.output
	stored := false // a row for exe is in the store
	accept := func(status string) error {
		exe.Status = status
		if status == store.StatusRunning {
			exe.StartedAt = s.now().UTC()
		}
		if err := s.store.CreateExecution(ctx, exe); err != nil {
			return unavailable(fmt.Errorf("storing accepted execution %s: %w", exe.ID, err))
		}
		stored = true
		s.track(exe.ID, a)
		go s.pollCancel(tenant, exe.ID, a)
		if req.Accepted != nil {
			req.Accepted(exe.ID)
		}
		return nil
	}
	defer func() {
		// The followers get the outcome before the log is dropped; later
		// ones replay from the store.
		a.events.finish(exe, err)
		if stored {
			s.untrack(exe.ID)
		}
		close(a.done)
	}()
	// forget removes the row of an execution that ends without a result.
	forget := func() {
		if !stored {
			return
		}
		if err := s.store.DeleteExecution(bg, tenant, exe.ID); err != nil {
			s.log.Error("deleting execution that did not run", "request_id", req.RequestID, "execution_id", exe.ID, "error", err)
		}
	}

	// Wait for a slot. The wait ends when the client leaves or the
	// execution is canceled.
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	a.setCancel(stopWait)
	release, err := s.engine.Admit(waitCtx, engine.Admission{
		Tenant: tenant,
		Limit:  c.Plan.MaxConcurrent,
		Queued: func() error { return accept(store.StatusQueued) },
	})
	switch {
	case err == nil:
	case a.isCanceled():
		// Canceled while queued: it never ran and used no quota.
		exe.Status, exe.FinishedAt = store.StatusCanceled, s.now().UTC()
		s.metrics.ObserveExecution(exe.Language, exe.Status, 0)
		return s.save(bg, req, exe, false)
	case errors.Is(err, engine.ErrBusy):
		forget()
		e := Errorf(KindOverloaded, "every sandbox is busy; retry shortly")
		e.RetryAfter = 1
		return store.Execution{}, e
	default:
		forget()
		return store.Execution{}, err // the client left the queue, or storing failed
	}
	defer release()

	day := now.Format(time.DateOnly)
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	limit := c.Plan.ExecutionsPerDay
	used, err := s.store.ReserveExecution(ctx, tenant, day, limit)
	if errors.Is(err, store.ErrQuotaExceeded) {
		forget()
		e := Errorf(KindQuotaExceeded, "daily quota of %d executions reached", limit)
		e.RetryAfter = secondsUntil(now, midnight)
		e.Quota = &Quota{Limit: limit, Remaining: 0, Reset: midnight}
		return store.Execution{}, e
	}
	if err != nil {
		forget()
		return store.Execution{}, Internal(err)
	}
	refund := func() {
		if err := s.store.RefundExecution(bg, tenant, day); err != nil {
			s.log.Error("refunding quota", "request_id", req.RequestID, "error", err)
		}
	}
	if req.Quota != nil {
		req.Quota(Quota{Limit: limit, Remaining: max(0, limit-used), Reset: midnight})
	}

	if stored {
		exe.Status, exe.StartedAt = store.StatusRunning, s.now().UTC()
		if err := s.store.StartExecution(bg, tenant, exe.ID, exe.StartedAt); err != nil {
			// The accepted row is there; only its state is behind.
			s.log.Error("marking execution running", "request_id", req.RequestID, "execution_id", exe.ID, "error", err)
		}
	} else if err := accept(store.StatusRunning); err != nil {
		refund()
		return store.Execution{}, err
	}

	if !a.isCanceled() {
		a.events.start(exe)
		if req.Started != nil {
			req.Started(exe.ID)
		}
	}
	if a.isCanceled() {
		// Canceled between the slot and the start: nothing ran.
		refund()
		exe.Status, exe.FinishedAt = store.StatusCanceled, s.now().UTC()
		s.metrics.ObserveExecution(exe.Language, exe.Status, 0)
		return s.save(bg, req, exe, false)
	}

	// The run does not stop when the client hangs up: the quota is spent,
	// and the result is stored so that GET or an idempotent retry gets it.
	// Only a cancel (or the bound) ends it early.
	res, runErr, canceled := s.execute(bg, a, p.spec, release)
	if runErr != nil && !canceled {
		s.metrics.ObserveExecution(exe.Language, string(engine.StatusError), 0)
		refund()
		forget()
		return store.Execution{}, &Error{Kind: KindSandboxError, Msg: "the sandbox failed to run the code; it was not counted against your quota",
			Err: fmt.Errorf("running %s: %w", exe.ID, runErr)}
	}
	if runErr == nil {
		fillResult(&exe, res)
	}
	if canceled {
		// Its sandbox started, so it counts, with what it used.
		exe.Status = store.StatusCanceled
	}
	exe.FinishedAt = s.now().UTC()
	s.metrics.ObserveExecution(exe.Language, exe.Status, res.Duration)
	saved, err := s.save(bg, req, exe, true)
	if errors.Is(err, errSettled) {
		return saved, nil
	}
	if err != nil {
		refund()
	}
	return saved, err
}

// execute runs spec in the sandbox slot the caller holds (release gives
// it back as soon as the sandbox is gone). The run does not end with the
// caller's context: only a cancel, or the timeout plus runMargin, ends it
// early. It reports the platform's error, if any, and whether a cancel
// ended the run.
func (s *Service) execute(bg context.Context, a *active, spec engine.Spec, release func()) (engine.Result, error, bool) {
	runCtx, stopRun := context.WithTimeout(bg, spec.Timeout+runMargin)
	defer stopRun()
	a.setCancel(stopRun)
	res, err := s.engine.Execute(runCtx, spec)
	release()
	if err == nil && res.Status == engine.StatusError {
		err = errors.New("driver reported a platform error")
	}
	return res, err, a.isCanceled()
}

// fillResult copies what the program did into exe.
func fillResult(exe *store.Execution, res engine.Result) {
	exe.Status = string(res.Status)
	exe.Stdout, exe.Stderr = res.Stdout, res.Stderr
	exe.ExitCode = res.ExitCode
	exe.DurationMS = res.Duration.Milliseconds()
	exe.Truncated = res.Truncated
	exe.SandboxSeconds = res.Usage.SandboxSeconds
	exe.CPUSeconds = res.Usage.CPUSeconds
	exe.PeakMemoryBytes = res.Usage.PeakMemoryBytes
	for _, f := range res.Files {
		exe.Files = append(exe.Files, store.File{Path: f.Path, Content: f.Content})
	}
	exe.FilesTruncated = res.FilesTruncated
}

// save stores the finished exe. If that fails, the accepted row is
// removed if possible and the caller gets KindUnavailable: an answer with
// an id that GET cannot find would be worse than none.
func (s *Service) save(ctx context.Context, req Request, exe store.Execution, ran bool) (store.Execution, error) {
	if err := s.store.SaveExecution(ctx, exe); err != nil {
		if cur, gerr := s.store.Execution(ctx, exe.Tenant, exe.ID); gerr == nil && store.Final(cur.Status) {
			// Settled meanwhile by a node that took this one for dead
			// (see settle): that outcome stands, refund included.
			s.log.Warn("execution was settled elsewhere while it ran here", "execution_id", exe.ID, "status", cur.Status)
			return cur, errSettled
		}
		if ran {
			// The code ran and its quota was reserved before it started:
			// the answer is its result, and the store gets it once it can
			// take it again (a full disk, a database away).
			s.log.Error("storing the result of an execution that ran; retrying until the store takes it",
				"request_id", req.RequestID, "execution_id", exe.ID, "error", err)
			s.keepSaving(exe, req.IdempotencyKey)
			return exe, nil
		}
		if derr := s.store.DeleteExecution(ctx, exe.Tenant, exe.ID); derr != nil && !errors.Is(derr, store.ErrNotFound) {
			s.log.Error("deleting execution that could not be saved", "request_id", req.RequestID, "execution_id", exe.ID, "error", derr)
		}
		what := "storing the result of"
		if !ran {
			what = "storing the cancel of"
		}
		return store.Execution{}, unavailable(fmt.Errorf("%s %s: %w", what, exe.ID, err))
	}
	return exe, nil
}

// maxUnsaved bounds the results held in memory for keepSaving. Past it a
// result is still answered, and its row, left running, is settled when the
// server restarts.
const maxUnsaved = 256

// Pauses between keepSaving's attempts, and how long it keeps trying.
var (
	saveRetryFirst = 500 * time.Millisecond
	saveRetryMax   = 10 * time.Second
	saveRetryFor   = IdempotencyTTL
)

// keepSaving stores exe, which ran, in the background until the store takes
// it, then completes its Idempotency-Key (key) with it; it stops early if
// another node settled the execution meanwhile.
func (s *Service) keepSaving(exe store.Execution, key string) {
	if s.unsaved.Add(1) > maxUnsaved {
		s.unsaved.Add(-1)
		s.log.Error("too many results waiting for the store; this one is settled at the next start", "execution_id", exe.ID)
		return
	}
	go func() {
		defer s.unsaved.Add(-1)
		ctx := context.Background()
		pause := saveRetryFirst
		for deadline := time.Now().Add(saveRetryFor); time.Now().Before(deadline); pause = min(2*pause, saveRetryMax) {
			time.Sleep(pause)
			err := s.store.SaveExecution(ctx, exe)
			if err != nil {
				if cur, gerr := s.store.Execution(ctx, exe.Tenant, exe.ID); gerr == nil && store.Final(cur.Status) {
					s.log.Warn("execution was settled elsewhere before its result could be stored", "execution_id", exe.ID, "status", cur.Status)
					return
				}
				continue
			}
			if key != "" {
				if err := s.store.CompleteIdempotency(ctx, exe.Tenant, key, exe.ID); err != nil {
					s.log.Error("completing idempotency key", "execution_id", exe.ID, "error", err)
				}
			}
			s.log.Info("stored the result of an execution once the store took it again", "execution_id", exe.ID)
			return
		}
		s.log.Error("gave up storing the result of an execution; it is settled at the next start", "execution_id", exe.ID)
	}()
}

// errSettled: the execution was ended elsewhere before its result could
// be stored; the stored outcome is returned with it.
var errSettled = errors.New("execution: settled elsewhere")

// Get returns tenant's execution in whatever state it is.
func (s *Service) Get(ctx context.Context, c Caller, id string) (store.Execution, error) {
	if !ValidID(id) {
		return store.Execution{}, Errorf(KindNotFound, "execution not found")
	}
	e, err := s.store.Execution(ctx, c.Key.Tenant, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Execution{}, Errorf(KindNotFound, "execution not found")
	}
	if err != nil {
		return store.Execution{}, Internal(err)
	}
	return e, nil
}

// Usage returns the caller's metering for today (UTC) and the day.
func (s *Service) Usage(ctx context.Context, c Caller) (store.DayUsage, string, error) {
	day := s.now().UTC().Format(time.DateOnly)
	u, err := s.store.Usage(ctx, c.Key.Tenant, day)
	if err != nil {
		return store.DayUsage{}, day, Internal(err)
	}
	return u, day, nil
}

// secondsUntil rounds up, and is at least 1 so a client never retries at once.
func secondsUntil(now, t time.Time) int {
	d := t.Sub(now)
	secs := int((d + time.Second - 1) / time.Second)
	return max(1, secs)
}
