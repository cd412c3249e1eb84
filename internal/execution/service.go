// Package execution is the one path a request to run code takes, whatever
// its entry point (the HTTP API, the MCP server, the async queue workers):
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
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Store is what the service keeps in the database: the roles of
// store.Store it uses, so a test fake or another consumer's store need not
// carry keys, accounts or sessions. The whole store.Store satisfies it.
type Store interface {
	store.Quota
	store.Executions
	store.Idempotencies
	store.Nodes
	store.WebhookSecrets
}

// Options configure a Service. Store and Engine are required.
type Options struct {
	Store  Store
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
	// NodeStopped, if set, is called for each stopped node found, after
	// its executions are settled and before its heartbeat is forgotten
	// (the sandboxes it held end as node_lost).
	NodeStopped func(ctx context.Context, node string)
	// NodeAddress is the base URL other nodes reach this one at, sent with
	// each heartbeat ("" for none).
	NodeAddress string
	// Egress serves the proxies of executions whose plan gives them a
	// network (package egress), with Agent, the host path of the agent
	// binary that relays to it inside the sandbox. Without either, a
	// request that would get a network is refused as unavailable.
	Egress *egress.Host
	Agent  string
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
	store   Store
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

// Plans are the plans by name the service applies (Options.Plans, or the
// defaults).
func (s *Service) Plans() map[string]config.Plan { return s.plans }

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

// run is the sequence after the idempotency claim (see attempt). On error
// nothing is left stored or counted.
func (s *Service) run(ctx context.Context, c Caller, req Request, p prepared) (store.Execution, error) {
	exe := store.Execution{
		ID:        newID(),
		Tenant:    c.Key.Tenant,
		KeyID:     c.Key.ID,
		RequestID: req.RequestID,
		Language:  p.spec.Language.Name,
		Image:     p.image,
		// The pool may still hand out a sandbox warmed on the build
		// before an update, until it idles out (docs/API.md).
		ImageVersion: p.imageBuild,
		CreatedAt:    s.now().UTC(),
		Owner:        s.opts.NodeID,
		// Settling the execution after a crash completes the key's claim.
		IdempotencyKey: req.IdempotencyKey,
	}
	at := s.newAttempt(exe, p, c.Plan.MaxConcurrent, &syncEntry{c: c, req: req})
	at.onRun = req.Started
	return at.run(ctx)
}

// syncEntry brings in an execution whose caller waits for its outcome
// (Run). It is stored when it has to wait for a slot, or else when it
// starts, and its quota is reserved with the slot held. One that ends
// without running gets its quota back; one that ends without an outcome
// is deleted and its caller gets the error.
type syncEntry struct {
	c        Caller
	req      Request
	stored   bool // a row for the execution is in the store
	reserved bool // its quota is
}

func (e *syncEntry) queued(ctx context.Context, at *attempt) error {
	return e.accept(ctx, at, store.StatusQueued)
}

// accept stores the execution as status and tracks it.
func (e *syncEntry) accept(ctx context.Context, at *attempt, status string) error {
	at.exe.Status = status
	if status == store.StatusRunning {
		at.exe.StartedAt = at.s.now().UTC()
	}
	if err := at.s.store.CreateExecution(ctx, at.exe); err != nil {
		return unavailable(fmt.Errorf("storing accepted execution %s: %w", at.exe.ID, err))
	}
	e.stored = true
	at.track()
	if e.req.Accepted != nil {
		e.req.Accepted(at.exe.ID)
	}
	return nil
}

// enter reserves the day's quota and stores the execution running.
func (e *syncEntry) enter(ctx context.Context, at *attempt) error {
	s, now := at.s, at.exe.CreatedAt
	day, midnight := quotaDay(now)
	limit := e.c.Plan.ExecutionsPerDay
	used, err := s.store.ReserveExecution(ctx, at.exe.Tenant, day, limit)
	if errors.Is(err, store.ErrQuotaExceeded) {
		qe := Errorf(KindQuotaExceeded, "daily quota of %d executions reached", limit)
		qe.RetryAfter = secondsUntil(now, midnight)
		qe.Quota = &Quota{Limit: limit, Remaining: 0, Reset: midnight}
		return qe
	}
	if err != nil {
		return Internal(err)
	}
	e.reserved = true
	if e.req.Quota != nil {
		e.req.Quota(Quota{Limit: limit, Remaining: max(0, limit-used), Reset: midnight})
	}
	if !e.stored {
		return e.accept(ctx, at, store.StatusRunning)
	}
	at.exe.Status, at.exe.StartedAt = store.StatusRunning, s.now().UTC()
	if err := s.store.StartExecution(context.WithoutCancel(ctx), at.exe.Tenant, at.exe.ID, at.exe.StartedAt); err != nil {
		// The accepted row is there; only its state is behind.
		s.log.Error("marking execution running", "request_id", e.req.RequestID, "execution_id", at.exe.ID, "error", err)
	}
	return nil
}

func (e *syncEntry) leave(ctx context.Context, at *attempt, why leaving, err error) (store.Execution, error) {
	s := at.s
	switch why {
	case canceled:
		// It never ran: it uses no quota, and is stored canceled.
		e.refund(ctx, at)
		at.exe.Status, at.exe.FinishedAt = store.StatusCanceled, s.now().UTC()
		s.metrics.ObserveExecution(at.exe.Language, at.exe.Status, 0)
		return at.save(ctx)
	case unsaved:
		if at.ran {
			// The code ran and its quota was reserved before it started:
			// the answer is its result, and the store gets it once it can
			// take it again (a full disk, a database away).
			s.log.Error("storing the result of an execution that ran; retrying until the store takes it",
				"request_id", e.req.RequestID, "execution_id", at.exe.ID, "error", err)
			s.keepSaving(at.exe, e.req.IdempotencyKey)
			return at.exe, nil
		}
		// An answer with an id that GET cannot find would be worse than
		// none.
		if derr := s.store.DeleteExecution(ctx, at.exe.Tenant, at.exe.ID); derr != nil && !errors.Is(derr, store.ErrNotFound) {
			s.log.Error("deleting execution that could not be saved", "request_id", e.req.RequestID, "execution_id", at.exe.ID, "error", derr)
		}
		return store.Execution{}, unavailable(fmt.Errorf("storing the cancel of %s: %w", at.exe.ID, err))
	}
	e.refund(ctx, at)
	e.forget(ctx, at)
	if why == failed {
		return store.Execution{}, &Error{Kind: KindSandboxError, Msg: "the sandbox failed to run the code; it was not counted against your quota",
			Err: fmt.Errorf("running %s: %w", at.exe.ID, err)}
	}
	if errors.Is(err, engine.ErrBusy) {
		return store.Execution{}, Busy()
	}
	return store.Execution{}, err // the client left the queue, storing failed, or no quota is left
}

// refund gives back the quota, if it was reserved.
func (e *syncEntry) refund(ctx context.Context, at *attempt) {
	if !e.reserved {
		return
	}
	e.reserved = false
	day, _ := quotaDay(at.exe.CreatedAt)
	if err := at.s.store.RefundExecution(ctx, at.exe.Tenant, day); err != nil {
		at.s.log.Error("refunding quota", "request_id", e.req.RequestID, "error", err)
	}
}

// forget removes the row of an execution that ends without a result.
func (e *syncEntry) forget(ctx context.Context, at *attempt) {
	if !e.stored {
		return
	}
	if err := at.s.store.DeleteExecution(ctx, at.exe.Tenant, at.exe.ID); err != nil {
		at.s.log.Error("deleting execution that did not run", "request_id", e.req.RequestID, "execution_id", at.exe.ID, "error", err)
	}
}

// quotaDay is the quota's day (UTC) at now, and when it ends.
func quotaDay(now time.Time) (day string, midnight time.Time) {
	now = now.UTC()
	return now.Format(time.DateOnly), time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
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
