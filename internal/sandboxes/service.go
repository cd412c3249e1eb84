package sandboxes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Store is what the service keeps in the store: the sandboxes, the daily
// quota it shares with executions, and Idempotency-Keys.
type Store interface {
	store.Sandboxes
	store.Idempotencies
	ReserveExecution(ctx context.Context, tenant, day string, limit int64) (int64, error)
	RefundExecution(ctx context.Context, tenant, day string) error
	NodeAddress(ctx context.Context, node string) (string, error)
}

// agentClient is what the service uses of an agent connection;
// *agent.Client has it, and the unit tests fake it.
type agentClient interface {
	Ping(ctx context.Context) error
	Spawn(ctx context.Context, r agent.SpawnRequest) (agent.Process, error)
	Stat(ctx context.Context, path string) (agent.FileInfo, error)
	List(ctx context.Context, dir string) ([]agent.FileInfo, error)
	ReadFile(ctx context.Context, path string, max int64, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, path string, r io.Reader, max int64, mode os.FileMode) (int64, error)
	Remove(ctx context.Context, path string) error
	Mkdir(ctx context.Context, path string) error
	Move(ctx context.Context, from, to string) error
	SaveHome(ctx context.Context, max int64, w io.Writer) (int64, error)
	RestoreHome(ctx context.Context, r io.Reader) error
	SetDeadline(ctx context.Context, t time.Time) error
	SetEnv(ctx context.Context, env map[string]string) error
	Egress(ctx context.Context, socket string, port int) error
	// Unresponsive is closed once a reply has not come in time.
	Unresponsive() <-chan struct{}
	Close() error
}

var _ agentClient = (*agent.Client)(nil)

// Options configure a Service. Store, Starter and Image are required.
type Options struct {
	Store   Store
	Starter engine.Starter
	// Image resolves a request's image name ("" is the default image) to
	// the driver's image (engine.LiveSpec.Image), the name to record, and
	// that image's version; an error means no such image.
	Image func(name string) (driverImage, recorded, version string, err error)
	// Agent is the host path of the agent binary.
	Agent string
	// DataDir holds the saved homes of paused sandboxes, under
	// DataDir/sandboxes/<id>/home.tar.
	DataDir string
	// NodeID names this server among those sharing the store.
	NodeID string
	// MemoryBudget bounds the memory limits of this node's live sandboxes
	// taken together, so that they can never take more of the host than
	// this even when all of them use their whole limit: past it, a create
	// or resume is refused with 503 overloaded and Retry-After. 0 means
	// no bound.
	MemoryBudget int64
	// Warm is how many sandboxes are kept pre-started for each image and
	// plan that a create asked for lately (warm.go); 0 keeps none.
	Warm int
	// WarmPlans are the plans whose default-image sandboxes are kept
	// pre-started from Start on, before any create asks.
	WarmPlans []config.Plan
	// Admit, if set, admits commands to the node's sandbox slots (admit.go).
	Admit Admitter
	// OutputRate bounds, in bytes a second, the output the server relays
	// from one live sandbox's commands taken together (default
	// DefaultOutputRate, with a burst of as much). Reading, logging and
	// dropping output costs the server's own CPU, outside the sandbox's
	// cgroup; past the rate (after a burst of outputBurst seconds of it)
	// the server reads more slowly, and the sandbox's writers wait on
	// their full pipes, as on a slow terminal.
	OutputRate int
	// Egress, if set, lets the sandboxes of plans with egress reach what
	// their allowlist names (network.go); nil refuses a create that asks.
	// The caller reaps it (egress.Host.Reap) before Start.
	Egress *egress.Host
	// Tick is how often expiries are looked at (default 1 s).
	Tick   time.Duration
	Logger *slog.Logger
	Now    func() time.Time
}

// DefaultOutputRate is Options.OutputRate's default: far above what a
// person or an agent reads, far below what `yes` writes. Relaying 2 MiB a
// second costs the server about a tenth of a core on the 2 vCPU test host
// (TestSandboxOutputFloodE2E logs it); unpaced, two `yes` kept one of its
// cores busy.
const DefaultOutputRate = 2 << 20

// outputBurst is how many seconds of the rate a quiet sandbox saves up:
// a command that prints a few MiB at once is not slowed.
const outputBurst = 4

// DefaultTimeout is a sandbox's timeout when the request names none,
// capped by the plan's lifetime.
const DefaultTimeout = 5 * time.Minute

// deadlineGrace is added to expires_at for the agent's own deadline: the
// service's timer ends (or pauses) the sandbox first, and the agent's
// deadline holds when the server is gone.
const deadlineGrace = 15 * time.Second

// idemPrefix keeps sandboxes' Idempotency-Keys apart from executions'.
const idemPrefix = "sbx:"

// Service serves sandboxes. It is safe for concurrent use.
type Service struct {
	opts    Options
	store   Store
	log     *slog.Logger
	now     func() time.Time
	connect func(engine.Live) agentClient

	mu      sync.Mutex
	entries map[string]*entry
	warm    *warmPool

	memMu        sync.Mutex
	memCommitted int64 // the memory limits of the live sandboxes (Options.MemoryBudget)
}

// errMemoryBudget is the answer when the node's live sandboxes hold its
// whole memory budget.
func errMemoryBudget() error {
	return &execution.Error{Kind: execution.KindOverloaded, RetryAfter: 10,
		Msg: "this server holds as many sandboxes as its memory allows; retry later, or pause or kill one"}
}

// reserveMemory takes n bytes of the budget for a live sandbox, and
// leaves at least spare bytes of it free (a pre-started sandbox leaves
// room for one create of its size).
func (s *Service) reserveMemory(n, spare int64) bool {
	s.memMu.Lock()
	defer s.memMu.Unlock()
	if s.opts.MemoryBudget > 0 && s.memCommitted+n+spare > s.opts.MemoryBudget {
		return false
	}
	s.memCommitted += n
	return true
}

func (s *Service) releaseMemory(n int64) {
	s.memMu.Lock()
	s.memCommitted -= n
	s.memMu.Unlock()
}

// memoryFull reports whether a sandbox of n bytes would not fit now.
func (s *Service) memoryFull(n int64) bool {
	s.memMu.Lock()
	defer s.memMu.Unlock()
	return s.opts.MemoryBudget > 0 && s.memCommitted+n > s.opts.MemoryBudget
}

// roomFor reports whether a sandbox of n bytes fits now, once the
// pre-started sandboxes made room if it would not.
func (s *Service) roomFor(n int64) bool {
	return !s.memoryFull(n) || (s.warm.drain() && !s.memoryFull(n))
}

// entry serializes the lifecycle (create, pause, resume, kill, expiry,
// timeout) of one sandbox id on this node and holds its live sandbox.
type entry struct {
	mu sync.Mutex
	b  *box // nil when not live on this node
}

// live says whether the entry holds a live sandbox now.
func (e *entry) live() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.b != nil
}

// box is one live sandbox.
type box struct {
	id        string
	tenant    string
	net       *egress.Box // its egress proxy, nil without network
	network   *Network    // what it was handed (handOver); nil is none
	live      engine.Live
	ag        agentClient
	since     time.Time     // when this live period began, for metering
	cpuBase   float64       // the CPU seconds spent before it (a pre-started sandbox's start)
	ending    atomic.Bool   // set when the service ends it, so its Done is not a failure
	byOwner   atomic.Bool   // set with ending when the tenant asked (pause, kill) or its timeout ran out
	mem       int64         // its share of Options.MemoryBudget
	released  atomic.Bool   // mem given back
	out       *rate.Limiter // paces the output relayed from its commands (Options.OutputRate)
	logBytes  atomic.Int64  // its commands' logs together (maxBoxLogBytes)
	followers atomic.Int32  // open Events streams (maxFollowers)

	mu       sync.Mutex
	procs    map[int]*proc
	contexts map[string]*kernel // code contexts (contexts.go)
}

// cpu is the CPU seconds of b's live period.
func (b *box) cpu() float64 { return max(0, b.live.Usage().CPUSeconds-b.cpuBase) }

// New returns a Service; call Start before serving.
func New(opts Options) (*Service, error) {
	if opts.Store == nil || opts.Starter == nil || opts.Image == nil {
		return nil, errors.New("sandboxes: Store, Starter and Image are required")
	}
	s := &Service{opts: opts, store: opts.Store, log: opts.Logger, now: opts.Now, entries: map[string]*entry{}}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.opts.Tick <= 0 {
		s.opts.Tick = time.Second
	}
	if s.opts.OutputRate <= 0 {
		s.opts.OutputRate = DefaultOutputRate
	}
	s.connect = func(l engine.Live) agentClient { return agent.NewClient(l.Conn()) }
	s.warm = newWarmPool(s, max(0, opts.Warm))
	return s, nil
}

// Start ends the sandboxes the store holds running on this node that are
// not live (the server restarted without pausing them: node_lost), then
// ends or pauses sandboxes at their expiry until ctx ends.
func (s *Service) Start(ctx context.Context) error {
	if err := s.reconcile(ctx); err != nil {
		return err
	}
	if s.opts.Warm > 0 && len(s.opts.WarmPlans) > 0 {
		if driverImage, _, version, err := s.opts.Image(""); err == nil {
			for _, p := range s.opts.WarmPlans {
				s.warm.pin(warmKey{image: driverImage, version: version, lim: limitsFor(p)})
			}
		}
	}
	go func() {
		t := time.NewTicker(s.opts.Tick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.expireDue(ctx)
			}
		}
	}()
	return nil
}

func (s *Service) reconcile(ctx context.Context) error {
	recs, err := s.store.NodeSandboxes(ctx, s.opts.NodeID, string(StatusRunning))
	if err != nil {
		return fmt.Errorf("sandboxes: start: %w", err)
	}
	for _, rec := range recs {
		e := s.entry(rec.ID)
		e.mu.Lock()
		if e.b == nil {
			_, err = s.finishLocked(ctx, e, rec, ReasonNodeLost, "the server stopped without pausing the sandbox; its processes and files are gone")
			if err != nil {
				s.log.Error("ending a lost sandbox", "sandbox_id", rec.ID, "error", err)
			}
		}
		e.mu.Unlock()
	}
	return nil
}

// EndNodeSandboxes ends as node_lost the sandboxes that the store holds
// running on node, another node that stopped sending heartbeats: their
// processes and files went with it. Paused ones stay paused, resumable
// on any node that reaches their saved home (docs/SANDBOXES.md, "Several
// nodes"). Called by the node that found node stopped; the store's
// status check makes one winner if several do.
func (s *Service) EndNodeSandboxes(ctx context.Context, node string) {
	if node == s.opts.NodeID {
		return
	}
	recs, err := s.store.NodeSandboxes(ctx, node, string(StatusRunning))
	if err != nil {
		s.log.Error("listing a stopped node's sandboxes", "node", node, "error", err)
		return
	}
	for _, rec := range recs {
		e := s.entry(rec.ID)
		e.mu.Lock()
		if e.b == nil {
			if _, err := s.finishLocked(ctx, e, rec, ReasonNodeLost, "the node holding the sandbox stopped; its processes and files are gone"); err != nil && !errors.Is(err, store.ErrSandboxState) {
				s.log.Error("ending a stopped node's sandbox", "sandbox_id", rec.ID, "node", node, "error", err)
			} else if err == nil {
				s.log.Warn("ended a stopped node's sandbox", "sandbox_id", rec.ID, "node", node)
			}
		}
		e.mu.Unlock()
	}
}

// Shutdown pauses every live sandbox, so that a server stop (an upgrade)
// keeps their files; one that cannot be paused is ended with reason error.
func (s *Service) Shutdown(ctx context.Context) error {
	s.warm.close()
	var errs []error
	for id, e := range s.liveEntries() {
		e.mu.Lock()
		if b := e.b; b != nil {
			rec, err := s.store.Sandbox(ctx, b.tenant, id)
			if err == nil {
				if _, err = s.pauseLocked(ctx, e, rec, false); err != nil {
					_, ferr := s.finishLocked(ctx, e, rec, ReasonError, "the server stopped and could not save the home: "+safeMsg(err))
					err = errors.Join(err, ferr)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("pausing %s: %w", id, err))
			}
		}
		e.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (s *Service) entry(id string) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[id]
	if e == nil {
		e = &entry{}
		s.entries[id] = e
	}
	return e
}

// knownEntry is id's entry if this node has one, else nil.
func (s *Service) knownEntry(id string) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[id]
}

// liveEntries is a snapshot of the entries that hold a live sandbox.
func (s *Service) liveEntries() map[string]*entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*entry{}
	for id, e := range s.entries {
		// e.b is read under e.mu by its users; here a stale view only
		// means one more look.
		out[id] = e
	}
	return out
}

// expireDue ends or pauses the live sandboxes whose expires_at passed,
// each in its own goroutine, and returns at once with a wait for them: one
// whose agent is slow to save its home (or stopped by its code; the
// agent's replies are bounded, agent.ReplyTimeout) delays no other, nor
// the next tick. An entry another call holds (an expiry still under way)
// is left for the next tick.
func (s *Service) expireDue(ctx context.Context) (wait func()) {
	now := s.now()
	var wg sync.WaitGroup
	for id, e := range s.liveEntries() {
		if !e.mu.TryLock() {
			continue
		}
		b := e.b
		if b == nil {
			e.mu.Unlock()
			continue
		}
		rec, err := s.store.Sandbox(ctx, b.tenant, id)
		if err != nil {
			s.log.Error("reading a sandbox at expiry", "sandbox_id", id, "error", err)
			e.mu.Unlock()
			continue
		}
		if rec.Status != string(StatusRunning) || now.Before(rec.ExpiresAt) {
			e.mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer e.mu.Unlock()
			s.expireLocked(ctx, e, rec)
		}()
	}
	return wg.Wait
}

func (s *Service) expireLocked(ctx context.Context, e *entry, rec store.Sandbox) {
	if rec.OnTimeout == "pause" {
		_, err := s.pauseLocked(ctx, e, rec, true)
		if err == nil {
			return
		}
		s.log.Warn("pausing a sandbox at expiry", "sandbox_id", rec.ID, "error", err)
		if _, err := s.finishLocked(ctx, e, rec, ReasonError, "it expired and its home could not be saved: "+safeMsg(err)); err != nil {
			s.log.Error("ending a sandbox at expiry", "sandbox_id", rec.ID, "error", err)
		}
		return
	}
	if _, err := s.finishLocked(ctx, e, rec, ReasonExpired, ""); err != nil {
		s.log.Error("ending a sandbox at expiry", "sandbox_id", rec.ID, "error", err)
	}
}

// watch records a live sandbox that ended on its own, and ends one whose
// agent stopped answering: whichever call met the silence first (a
// command, a file call, a save), the sandbox is of no use from then on,
// and must not hold its memory and slot until it expires.
func (s *Service) watch(id string, b *box) {
	select {
	case <-b.live.Done():
	case <-b.ag.Unresponsive():
		s.endUnresponsive(execution.Caller{Key: store.Key{Tenant: b.tenant}}, id, b)
		return
	}
	if b.ending.Load() {
		return
	}
	e := s.entry(id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.b != b || b.ending.Load() {
		return
	}
	ctx := context.Background()
	rec, err := s.store.Sandbox(ctx, b.tenant, id)
	if err != nil {
		s.log.Error("reading a sandbox that stopped", "sandbox_id", id, "error", err)
		return
	}
	reason, msg := ReasonError, "the sandbox stopped on its own: out of memory, a crash, or its hard deadline"
	if !s.now().Before(rec.ExpiresAt) {
		reason, msg = ReasonExpired, ""
	}
	if _, err := s.finishLocked(ctx, e, rec, reason, msg); err != nil {
		s.log.Error("ending a sandbox that stopped", "sandbox_id", id, "error", err)
	}
}

// Create starts a sandbox. It counts one execution toward the daily
// quota, given back when the platform fails to start it.
func (s *Service) Create(ctx context.Context, c execution.Caller, idemKey string, r CreateRequest) (Sandbox, error) {
	p := c.Plan
	lim := limitsFor(p)
	lifetime := time.Duration(lim.MaxLifetimeS) * time.Second
	timeout := time.Duration(r.TimeoutS) * time.Second
	switch {
	case r.TimeoutS < 0:
		return Sandbox{}, execution.Errorf(execution.KindInvalidTimeout, "timeout_s must not be negative")
	case r.TimeoutS == 0:
		timeout = min(DefaultTimeout, lifetime)
	case timeout > lifetime:
		return Sandbox{}, execution.Errorf(execution.KindInvalidTimeout, "timeout_s %d is beyond the plan's maximum lifetime of %d s", r.TimeoutS, lim.MaxLifetimeS)
	}
	onTimeout := r.OnTimeout
	if onTimeout == "" {
		onTimeout = "kill"
	}
	if onTimeout != "kill" && onTimeout != "pause" {
		return Sandbox{}, execution.Errorf(execution.KindInvalidRequest, `on_timeout must be "kill" or "pause"`)
	}
	if err := checkFiles(r.Files, p.SandboxHomeBytes(), lim.MaxFileMB<<20); err != nil {
		return Sandbox{}, err
	}
	if err := execution.CheckEnv(r.Env, false); err != nil {
		return Sandbox{}, err
	}
	if err := checkMetadata(r.Metadata); err != nil {
		return Sandbox{}, err
	}
	nw, err := execution.NetworkFor(p, r.Network)
	if err != nil {
		return Sandbox{}, err
	}
	if nw != nil && s.opts.Egress == nil {
		return Sandbox{}, execution.Errorf(execution.KindUnavailable, "this server cannot give sandboxes a network (its egress is off); ask the operator")
	}
	name := r.Image
	if name == "" {
		name = config.DefaultImage
	}
	if !p.AllowsImage(name) {
		return Sandbox{}, execution.Errorf(execution.KindForbidden, "your plan does not include the image %q", name)
	}
	driverImage, recorded, version, err := s.opts.Image(r.Image)
	if err != nil {
		return Sandbox{}, execution.Errorf(execution.KindInvalidRequest, "unknown image %q", r.Image)
	}

	tenant := c.Key.Tenant
	claimed := false
	if idemKey != "" {
		sb, replay, err := s.claim(ctx, c, idemKey, r)
		if err != nil || replay {
			return sb, err
		}
		claimed = true
	}
	release := func() {
		if claimed {
			if err := s.store.ReleaseIdempotency(context.WithoutCancel(ctx), tenant, idemPrefix+idemKey); err != nil {
				s.log.Error("releasing an idempotency claim", "error", err)
			}
		}
	}
	now := s.now().UTC()
	day, midnight := quotaDay(now)
	if _, err := s.store.ReserveExecution(ctx, tenant, day, p.ExecutionsPerDay); err != nil {
		release()
		return Sandbox{}, quotaErr(err, now, midnight, p.ExecutionsPerDay)
	}
	refund := func() {
		if err := s.store.RefundExecution(context.WithoutCancel(ctx), tenant, day); err != nil {
			s.log.Error("refunding quota", "error", err)
		}
	}
	// Pre-started sandboxes have no network: the hand-over opens the
	// create's own.
	key := warmKey{image: driverImage, version: version, lim: lim}
	lim.Network = nw
	limits, _ := json.Marshal(lim)
	// A tenant at its cap is refused before a pre-started sandbox is
	// taken, so that refused creates do not burn them (the store's insert
	// below is the check that holds under a parallel burst).
	if running, paused, err := s.store.CountSandboxes(ctx, tenant); err == nil && running+paused >= p.SandboxLimit() {
		refund()
		release()
		return Sandbox{}, errSandboxLimit(p)
	}
	id := newID()
	wb := s.warm.take(key)
	if wb != nil {
		id = wb.id
	}
	// The key's next sandbox starts once this create has its memory (or
	// gave up), so that it never takes the room this one needs.
	defer s.warm.fill(key)
	rec := store.Sandbox{
		ID: id, Tenant: tenant, KeyID: c.Key.ID, Status: string(StatusRunning), Image: recorded, ImageVersion: version,
		Limits: limits, Metadata: r.Metadata, Env: r.Env, OnTimeout: onTimeout, TimeoutS: int(timeout / time.Second),
		Node: s.opts.NodeID, CreatedAt: now, StartedAt: now, ExpiresAt: now.Add(timeout), AccessToken: r.AccessToken,
	}
	if wb == nil && !s.roomFor(lim.cgroupBytes()) {
		refund()
		release()
		return Sandbox{}, errMemoryBudget()
	}
	e := s.entry(rec.ID)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := s.store.CreateSandbox(ctx, rec, p.SandboxLimit()); err != nil {
		if wb != nil {
			s.discard(wb.b)
		}
		refund()
		release()
		if errors.Is(err, store.ErrSandboxLimit) {
			return Sandbox{}, errSandboxLimit(p)
		}
		return Sandbox{}, &execution.Error{Kind: execution.KindUnavailable, Msg: "the sandbox could not be stored, so it was not started or counted; retry shortly", Err: err, RetryAfter: 5}
	}
	var b *box
	if wb != nil {
		if b, err = s.adopt(ctx, wb, rec); err != nil {
			// It died waiting: start this one cold, under the same name.
			s.log.Warn("a pre-started sandbox could not be handed over", "sandbox_id", rec.ID, "error", err)
			s.discard(wb.b)
		}
	}
	if b == nil {
		b, err = s.startLive(ctx, rec, lim, driverImage)
	}
	if err == nil {
		err = writeFiles(ctx, b.ag, r.Files, lim.MaxFileMB<<20)
		if err != nil {
			s.discard(b)
			b = nil
		}
	}
	if err != nil {
		refund()
		release()
		if _, ferr := s.finishLocked(context.WithoutCancel(ctx), e, rec, ReasonError, "it failed to start"); ferr != nil {
			s.log.Error("ending a sandbox that failed to start", "sandbox_id", rec.ID, "error", ferr)
		}
		var xe *execution.Error
		if errors.As(err, &xe) {
			return Sandbox{}, xe
		}
		return Sandbox{}, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox failed to start; it was not counted against your quota",
			Err: fmt.Errorf("starting %s: %w", rec.ID, err)}
	}
	e.b = b
	go s.watch(rec.ID, b)
	if claimed {
		if err := s.store.CompleteIdempotency(context.WithoutCancel(ctx), tenant, idemPrefix+idemKey, rec.ID); err != nil {
			s.log.Error("completing an idempotency claim", "sandbox_id", rec.ID, "error", err)
		}
	}
	return s.view(rec, b), nil
}

// errSandboxLimit is the answer to a create past the plan's cap.
func errSandboxLimit(p config.Plan) error {
	return execution.Errorf(execution.KindSandboxLimit, "your plan allows %d sandbox(es) at once, running or paused, and you hold them all; kill one first", p.SandboxLimit())
}

// claim claims idemKey; replay is true when an earlier request with the
// same key and body created sb.
func (s *Service) claim(ctx context.Context, c execution.Caller, key string, r CreateRequest) (sb Sandbox, replay bool, err error) {
	body, _ := json.Marshal(r)
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	now := s.now()
	rec, claimed, err := s.store.ClaimIdempotency(ctx, c.Key.Tenant, idemPrefix+key, hash, now,
		now.Add(-execution.IdempotencyTTL), now.Add(-10*time.Minute))
	if err != nil {
		return Sandbox{}, false, execution.Internal(err)
	}
	if claimed {
		return Sandbox{}, false, nil
	}
	if rec.BodyHash != hash {
		return Sandbox{}, true, execution.Errorf(execution.KindIdempotencyConflict, "this Idempotency-Key was already used with a different request body")
	}
	if rec.ExecutionID == "" {
		e := execution.Errorf(execution.KindIdempotencyInProgress, "a request with this Idempotency-Key is still running; retry later")
		e.RetryAfter = 1
		return Sandbox{}, true, e
	}
	sb, err = s.Get(ctx, c, rec.ExecutionID)
	return sb, true, err
}

// limitsFor is the limits of a sandbox created on p.
func limitsFor(p config.Plan) Limits {
	l := p.Limits(0)
	return Limits{
		MemoryMB: p.MemoryMB, CPUs: l.CPUs, Pids: l.Pids, HomeMB: p.SandboxHomeBytes() >> 20, TmpMB: l.TmpBytes >> 20,
		OutputBytes: l.OutputBytes, MaxLifetimeS: int(p.SandboxLifetime() / time.Second), MaxFileMB: max(1, p.FilesBytes()>>20),
		FileSizeBytes: p.SandboxHomeBytes(), PausedMB: p.PausedStorageBytes() >> 20,
	}
}

func parseLimits(rec store.Sandbox) Limits {
	var l Limits
	_ = json.Unmarshal(rec.Limits, &l)
	return l
}

// startLive starts a live sandbox for rec, cold, with its environment.
func (s *Service) startLive(ctx context.Context, rec store.Sandbox, lim Limits, driverImage string) (*box, error) {
	b, err := s.launch(ctx, rec.ID, lim, driverImage, rec.ExpiresAt, 0)
	if err != nil {
		return nil, err
	}
	b.tenant = rec.Tenant
	if err := s.handOver(ctx, b, rec, lim); err != nil {
		s.discard(b)
		return nil, err
	}
	// The start's CPU is not the tenant's, as for a pre-started one.
	b.cpuBase = b.live.Usage().CPUSeconds
	return b, nil
}

// handOver gives b rec's network (lim.Network) and environment.
func (s *Service) handOver(ctx context.Context, b *box, rec store.Sandbox, lim Limits) error {
	env := userEnv(rec.Env)
	b.network = lim.Network
	if lim.Network != nil {
		if err := s.openNetwork(ctx, b, rec.ID, rec.Tenant, lim.Network); err != nil {
			return fmt.Errorf("opening the network: %w", err)
		}
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, engine.ProxyEnv())
	}
	if err := b.ag.SetEnv(ctx, env); err != nil {
		return fmt.Errorf("setting the environment: %w", err)
	}
	return nil
}

// userEnv is a sandbox's environment without the names every sandbox
// fixes (sandbox.LiveEnvFor: HOME, PATH, LANG, PWD, NODE_OPTIONS), which
// a create does not override (a command's own env may).
func userEnv(env map[string]string) map[string]string {
	out := maps.Clone(env)
	for _, kv := range sandbox.LiveEnvFor(engine.Limits{}) {
		name, _, _ := strings.Cut(kv, "=")
		delete(out, name)
	}
	return out
}

// launch starts a live sandbox named id with lim, whose agent ends it at
// expires (plus deadlineGrace) unless moved, and connects to its agent.
// Its hard lifetime is lim's maximum plus deadlineGrace plus extra (a
// pre-started sandbox's wait).
func (s *Service) launch(ctx context.Context, id string, lim Limits, driverImage string, expires time.Time, extra time.Duration) (*box, error) {
	spec := engine.LiveSpec{
		ID:    id,
		Image: driverImage,
		Limits: engine.Limits{
			MemoryBytes: lim.cgroupBytes(), CPUs: lim.CPUs, Pids: lim.Pids, FileSizeBytes: lim.FileSizeBytes,
			TmpBytes: lim.TmpMB << 20, OutputBytes: lim.OutputBytes,
			Lifetime: time.Duration(lim.MaxLifetimeS)*time.Second + deadlineGrace + extra,
			// A live sandbox has no CodeDir and returns no files; the
			// engine's defaults keep the spec complete.
			WorkdirBytes: engine.DefaultWorkdirBytes, ReturnFiles: engine.DefaultReturnFiles, ReturnBytes: engine.DefaultReturnBytes,
		},
		HomeBytes: lim.HomeMB << 20,
		Agent:     s.opts.Agent,
		Deadline:  expires.Add(deadlineGrace),
		EgressDir: s.egressDir(id),
	}
	if spec.EgressDir != "" {
		if err := os.MkdirAll(spec.EgressDir, 0o755); err != nil {
			return nil, fmt.Errorf("the egress directory: %w", err)
		}
	}
	// A pre-started sandbox (extra > 0) leaves room for a create of its
	// size; a create makes room by discarding the waiting ones.
	var spare int64
	if extra > 0 {
		spare = spec.Limits.MemoryBytes
	}
	if !s.reserveMemory(spec.Limits.MemoryBytes, spare) && (extra > 0 || !s.warm.drain() || !s.reserveMemory(spec.Limits.MemoryBytes, 0)) {
		return nil, errMemoryBudget()
	}
	live, err := s.opts.Starter.Start(ctx, spec)
	if err != nil {
		s.releaseMemory(spec.Limits.MemoryBytes)
		if spec.EgressDir != "" {
			os.RemoveAll(spec.EgressDir)
		}
		return nil, err
	}
	b := &box{id: id, live: live, ag: s.connect(live), since: s.now(), procs: map[int]*proc{}, mem: spec.Limits.MemoryBytes,
		out: rate.NewLimiter(rate.Limit(s.opts.OutputRate), max(outputBurst*s.opts.OutputRate, agent.MaxChunk))}
	if err := b.ag.Ping(ctx); err != nil {
		s.discard(b)
		return nil, fmt.Errorf("reaching the agent: %w", err)
	}
	return b, nil
}

// discard ends a live sandbox the service is done with.
func (s *Service) discard(b *box) {
	b.ending.Store(true)
	b.mu.Lock()
	for _, k := range b.contexts {
		k.end()
	}
	b.mu.Unlock()
	b.ag.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.live.Discard(ctx); err != nil {
		s.log.Error("discarding a live sandbox", "error", err)
	}
	s.closeNetwork(b.id, b)
	if !b.released.Swap(true) {
		s.releaseMemory(b.mem)
	}
}

// meter closes b's live period: adds its alive and CPU seconds to rec and
// to the tenant's metering of today (UTC; a period is counted on the day
// it closes).
func (s *Service) meter(rec *store.Sandbox, b *box) {
	u := store.SandboxUsage{AliveSeconds: max(0, s.now().Sub(b.since).Seconds()), CPUSeconds: b.cpu()}
	rec.AliveSeconds += u.AliveSeconds
	rec.CPUSeconds += u.CPUSeconds
	if b.net != nil {
		// The period ends: its connections are cut now (discard, which
		// follows, closes it again), so their bytes are all counted.
		_ = b.net.Close()
		nu := b.net.Usage()
		u.NetworkBytesIn, u.NetworkBytesOut = nu.BytesIn, nu.BytesOut
	}
	day, _ := quotaDay(s.now())
	if err := s.store.AddSandboxUsage(context.Background(), rec.Tenant, day, u); err != nil {
		s.log.Error("metering a sandbox", "sandbox_id", rec.ID, "error", err)
	}
}

// finishLocked ends rec (e.mu held): discards its live sandbox, meters
// it, records the end and removes its saved home.
func (s *Service) finishLocked(ctx context.Context, e *entry, rec store.Sandbox, reason, msg string) (store.Sandbox, error) {
	from := rec.Status
	if b := e.b; b != nil {
		b.byOwner.Store(reason == ReasonKilled || reason == ReasonExpired)
		b.ending.Store(true)
		s.meter(&rec, b)
		s.discard(b)
		e.b = nil
	}
	rec.Status, rec.Reason, rec.Message, rec.EndedAt = string(StatusEnded), reason, msg, s.now().UTC()
	rec.ArchivePath, rec.ArchiveBytes = "", 0
	if err := s.store.UpdateSandbox(ctx, rec, from); err != nil {
		return rec, err
	}
	if err := os.RemoveAll(s.sandboxDir(rec.ID)); err != nil {
		s.log.Error("removing a sandbox's saved home", "sandbox_id", rec.ID, "error", err)
	}
	// An ended sandbox needs no entry: whoever still waits on this one
	// reads it ended, as a newcomer with a fresh entry does.
	s.mu.Lock()
	if s.entries[rec.ID] == e {
		delete(s.entries, rec.ID)
	}
	s.mu.Unlock()
	return rec, nil
}

// endedByOwner says that the service is ending b because its tenant asked
// (pause, kill) or its own timeout ran out: a run cut short by that was
// the tenant's choice and stays counted. Any other end (the server
// stopping, the node failing) gives the run back.
func (b *box) endedByOwner() bool { return b.ending.Load() && b.byOwner.Load() }

// refundable says whether a run that failed with err is given back: the
// platform failed, and not because the tenant ended the sandbox.
func (b *box) refundable(err error) bool { return platformErr(err) && !b.endedByOwner() }

func (s *Service) sandboxDir(id string) string { return filepath.Join(s.opts.DataDir, "sandboxes", id) }

// pauseLocked saves rec's home and ends its live sandbox (e.mu held).
// byOwner: the tenant asked for it (or its on_timeout did), so a command
// or cell it cuts short still counts.
func (s *Service) pauseLocked(ctx context.Context, e *entry, rec store.Sandbox, byOwner bool) (store.Sandbox, error) {
	b := e.b
	if b == nil {
		return rec, execution.Errorf(execution.KindUnavailable, "the sandbox is not live on this node")
	}
	lim := parseLimits(rec)
	dir := s.sandboxDir(rec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return rec, execution.Internal(err)
	}
	final := filepath.Join(dir, "home.tar")
	n, err := saveFile(final, func(w io.Writer) (int64, error) { return b.ag.SaveHome(ctx, lim.PausedMB<<20, w) })
	if errors.Is(err, agent.ErrTooLarge) {
		return rec, execution.Errorf(execution.KindPayloadTooLarge, "the home is larger than the plan's paused storage of %d MB; the sandbox keeps running", lim.PausedMB)
	}
	if errors.Is(err, agent.ErrUnresponsive) {
		// watch ends it once this lock is let go.
		return rec, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox's agent did not answer in time (stopped or hung), so its home could not be saved and the sandbox was ended", Err: err}
	}
	if errors.Is(err, agent.ErrClosed) {
		// watch records the end once this lock is let go.
		return rec, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox stopped while its home was being saved (its agent was killed, e.g. out of memory), so it has ended and its files are lost", Err: err}
	}
	if err != nil {
		return rec, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox's home could not be saved; it keeps running", Err: err}
	}
	b.byOwner.Store(byOwner)
	b.ending.Store(true)
	s.meter(&rec, b)
	s.discard(b)
	e.b = nil
	rec.Status, rec.ArchivePath, rec.ArchiveBytes = string(StatusPaused), final, n
	if err := s.store.UpdateSandbox(context.WithoutCancel(ctx), rec, string(StatusRunning)); err != nil {
		return rec, execution.Internal(err)
	}
	return rec, nil
}

// saveFile writes path through a temporary file in its directory, synced
// and renamed into place, so a crash leaves the old file or the new one.
func saveFile(final string, write func(io.Writer) (int64, error)) (int64, error) {
	dir := filepath.Dir(final)
	f, err := os.CreateTemp(dir, ".home.tar.*")
	if err != nil {
		return 0, err
	}
	n, err := write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), final)
	}
	if err != nil {
		os.Remove(f.Name())
		return 0, err
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return 0, err
		}
	}
	return n, nil
}

// resumeLocked starts a fresh live sandbox for paused rec and restores
// its home (e.mu held). The maximum lifetime counts again from now. Its
// network is the kept one as far as p, the caller's plan now, allows it
// (withinPlan).
func (s *Service) resumeLocked(ctx context.Context, e *entry, rec store.Sandbox, p config.Plan) (store.Sandbox, error) {
	next, lim := s.withinPlan(rec, p)
	driverImage, _, _, err := s.opts.Image(imageArg(rec.Image))
	if err != nil {
		return rec, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox's image is gone; it stays paused", Err: err}
	}
	f, err := os.Open(rec.ArchivePath)
	if err != nil {
		return rec, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox's saved home is not on this node; it stays paused", Err: err}
	}
	defer f.Close()
	now := s.now().UTC()
	lifetime := time.Duration(lim.MaxLifetimeS) * time.Second
	next.StartedAt = now
	next.ExpiresAt = now.Add(min(time.Duration(rec.TimeoutS)*time.Second, lifetime))
	b, err := s.startLive(ctx, next, lim, driverImage)
	if err == nil {
		if err = b.ag.RestoreHome(ctx, f); err != nil {
			s.discard(b)
		}
	}
	if err != nil {
		var xe *execution.Error
		if errors.As(err, &xe) && xe.Kind == execution.KindOverloaded {
			return rec, xe
		}
		return rec, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox could not be resumed; it stays paused", Err: err}
	}
	next.Status, next.Node, next.ArchivePath, next.ArchiveBytes = string(StatusRunning), s.opts.NodeID, "", 0
	if err := s.store.UpdateSandbox(context.WithoutCancel(ctx), next, string(StatusPaused)); err != nil {
		s.discard(b)
		return rec, execution.Internal(err)
	}
	e.b = b
	go s.watch(rec.ID, b)
	if err := os.RemoveAll(s.sandboxDir(rec.ID)); err != nil {
		s.log.Error("removing a resumed sandbox's saved home", "sandbox_id", rec.ID, "error", err)
	}
	return next, nil
}

// withinPlan is rec, about to start again, with its network cut down
// to what p allows now (execution.NetworkWithin), and its limits: a
// plan narrowed, or an operator's narrower allowlist, reaches paused
// sandboxes too. Never refused: what is left may be no network.
func (s *Service) withinPlan(rec store.Sandbox, p config.Plan) (store.Sandbox, Limits) {
	lim := parseLimits(rec)
	nw, dropped := execution.NetworkWithin(p, lim.Network)
	if sameNetwork(nw, lim.Network) {
		return rec, lim
	}
	s.log.Info("resuming a sandbox narrows its network to what its plan allows now", "sandbox_id", rec.ID, "tenant", rec.Tenant,
		"dropped", dropped, "network_left", nw != nil)
	lim.Network = nw
	if b, err := json.Marshal(lim); err == nil {
		rec.Limits = b
	}
	return rec, lim
}

// sameNetwork says whether a and b allow the same, with the same cap.
func sameNetwork(a, b *Network) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Allow, b.Allow) && a.MaxBytes == b.MaxBytes
}

// imageArg is the name to resolve a recorded image by.
func imageArg(recorded string) string {
	if recorded == config.DefaultImage {
		return ""
	}
	return recorded
}

// record reads c's sandbox id.
func (s *Service) record(ctx context.Context, c execution.Caller, id string) (store.Sandbox, error) {
	rec, err := s.store.Sandbox(ctx, c.Key.Tenant, id)
	if errors.Is(err, store.ErrNotFound) {
		return rec, execution.Errorf(execution.KindNotFound, "no sandbox %q", id)
	}
	if err != nil {
		return rec, execution.Internal(err)
	}
	return rec, nil
}

// running returns c's sandbox id live, resuming it if it is paused.
func (s *Service) running(ctx context.Context, c execution.Caller, id string) (*box, store.Sandbox, error) {
	e, rec, err := s.lockFor(ctx, c, id)
	if err != nil {
		return nil, rec, err
	}
	defer e.mu.Unlock()
	switch Status(rec.Status) {
	case StatusPaused:
		if rec, err = s.resumeLocked(ctx, e, rec, c.Plan); err != nil {
			return nil, rec, err
		}
	case StatusEnded:
		return nil, rec, notRunning(rec)
	}
	if e.b == nil {
		return nil, rec, &execution.Error{Kind: execution.KindUnavailable, Msg: "the sandbox is held by another node; retry shortly", RetryAfter: 1}
	}
	return e.b, rec, nil
}

// Owner is the address of the node that holds c's sandbox id, when that
// is another node: the API forwards the call there (docs/SANDBOXES.md,
// "Several nodes"). The holder is the node it runs on, or for a paused
// one whose saved home this node does not see, the node that paused it.
// It is "" when the call is this node's to answer: the sandbox is live
// here, paused with its home in reach, ended, or not c's. A holder with
// no address on record is 503.
func (s *Service) Owner(ctx context.Context, c execution.Caller, id string) (string, error) {
	if e := s.knownEntry(id); e != nil && e.live() {
		return "", nil // no store read for the sandboxes of this node
	}
	if !ValidID(id) {
		return "", nil
	}
	rec, err := s.record(ctx, c, id)
	if err != nil || rec.Node == s.opts.NodeID {
		return "", nil // the call itself answers the error
	}
	switch Status(rec.Status) {
	case StatusRunning:
	case StatusPaused:
		if _, err := os.Stat(rec.ArchivePath); err == nil {
			return "", nil // any node that sees the home resumes it
		}
	default:
		return "", nil
	}
	addr, err := s.store.NodeAddress(ctx, rec.Node)
	if err != nil || addr == "" {
		return "", &execution.Error{Kind: execution.KindUnavailable, RetryAfter: 1,
			Msg: "the sandbox is held by another node, which has no address to forward the call to; retry shortly"}
	}
	return addr, nil
}

// liveOnly returns c's running sandbox id without resuming a paused one
// (its processes did not survive the pause).
func (s *Service) liveOnly(ctx context.Context, c execution.Caller, id string) (*box, error) {
	e, rec, err := s.lockFor(ctx, c, id)
	if err != nil {
		return nil, err
	}
	defer e.mu.Unlock()
	if rec.Status != string(StatusRunning) {
		return nil, notRunning(rec)
	}
	if e.b == nil {
		return nil, &execution.Error{Kind: execution.KindUnavailable, Msg: "the sandbox is held by another node; retry shortly", RetryAfter: 1}
	}
	return e.b, nil
}

func notRunning(rec store.Sandbox) *execution.Error {
	if rec.Status == string(StatusPaused) {
		return execution.Errorf(execution.KindSandboxNotRunning, "sandbox %s is paused, and its processes ended with the pause", rec.ID)
	}
	return execution.Errorf(execution.KindSandboxNotRunning, "sandbox %s has ended (%s)", rec.ID, rec.Reason)
}

// view is rec as the client sees it, with the open live period's usage.
func (s *Service) view(rec store.Sandbox, b *box) Sandbox {
	sb := Sandbox{
		ID: rec.ID, Status: Status(rec.Status), Reason: rec.Reason, Message: rec.Message, Image: rec.Image,
		ImageVersion: rec.ImageVersion, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt, OnTimeout: rec.OnTimeout,
		Limits: parseLimits(rec), Metadata: rec.Metadata, AliveSeconds: rec.AliveSeconds, CPUSeconds: rec.CPUSeconds,
		AccessToken: rec.AccessToken, LiveSince: rec.StartedAt, KeyID: rec.KeyID,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if !rec.EndedAt.IsZero() {
		t := rec.EndedAt
		sb.EndedAt = &t
	}
	if b != nil && rec.Status == string(StatusRunning) {
		u := b.live.Usage()
		sb.AliveSeconds += max(0, s.now().Sub(b.since).Seconds())
		sb.CPUSeconds += b.cpu()
		sb.PeakMemoryBytes = u.PeakMemoryBytes
		// What it was handed, which a resume may have narrowed.
		sb.Limits.Network = b.network
		if b.net != nil {
			sb.Network = b.net.Usage()
		}
	}
	return sb
}

func (s *Service) liveBox(id string) *box {
	s.mu.Lock()
	e := s.entries[id]
	s.mu.Unlock()
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.b
}

// Get returns c's sandbox.
func (s *Service) Get(ctx context.Context, c execution.Caller, id string) (Sandbox, error) {
	if !ValidID(id) {
		return Sandbox{}, execution.Errorf(execution.KindNotFound, "no sandbox %q", id)
	}
	rec, err := s.record(ctx, c, id)
	if err != nil {
		return Sandbox{}, err
	}
	return s.view(rec, s.liveBox(id)), nil
}

// ByAccessToken checks token against the E2B access token of sandbox id
// and returns the tenant and key that created it. A sandbox without a
// token (made through /v1), a wrong token and no such sandbox are all
// KindUnauthorized, so a guess learns nothing about which ids exist.
func (s *Service) ByAccessToken(ctx context.Context, id, token string) (tenant, keyID string, err error) {
	denied := execution.Errorf(execution.KindUnauthorized, "missing or wrong access token for this sandbox (send the envdAccessToken of its create or connect answer as X-Access-Token)")
	if !ValidID(id) || token == "" {
		return "", "", denied
	}
	rec, err := s.store.SandboxByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", "", denied
	}
	if err != nil {
		return "", "", execution.Internal(err)
	}
	if rec.AccessToken == "" || subtle.ConstantTimeCompare([]byte(rec.AccessToken), []byte(token)) != 1 {
		return "", "", denied
	}
	return rec.Tenant, rec.KeyID, nil
}

// List returns a page of c's sandboxes, newest first.
func (s *Service) List(ctx context.Context, c execution.Caller, r ListRequest) (Page, error) {
	limit := r.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 100)
	switch r.Status {
	case "", StatusRunning, StatusPaused, StatusEnded:
	default:
		return Page{}, execution.Errorf(execution.KindInvalidRequest, "status must be running, paused or ended")
	}
	p := store.SandboxPage{Status: string(r.Status), Limit: 100}
	if r.Cursor != "" {
		var ok bool
		if p.Before, p.BeforeID, ok = parseCursor(r.Cursor); !ok {
			return Page{}, execution.Errorf(execution.KindInvalidRequest, "invalid cursor")
		}
	}
	if len(r.Metadata) > MaxListFilters {
		return Page{}, execution.Errorf(execution.KindInvalidRequest, "a list filters on at most %d metadata pairs", MaxListFilters)
	}
	var out []store.Sandbox
	var next *store.Sandbox // the record the next page starts after
	for scanned := 0; next == nil; {
		recs, err := s.store.ListSandboxes(ctx, c.Key.Tenant, p)
		if err != nil {
			return Page{}, execution.Internal(err)
		}
		for i := range recs {
			rec := recs[i]
			if !matches(rec.Metadata, r.Metadata) {
				continue
			}
			if len(out) == limit {
				next = &out[len(out)-1]
				break
			}
			out = append(out, rec)
		}
		scanned += len(recs)
		if next != nil || len(recs) < p.Limit {
			break
		}
		last := recs[len(recs)-1]
		if scanned >= maxListScan {
			next = &last // a sparse filter: a short page, and the cursor goes on from here
			break
		}
		p.Before, p.BeforeID = last.CreatedAt, last.ID
	}
	page := Page{Sandboxes: make([]Sandbox, 0, len(out))}
	for _, rec := range out {
		page.Sandboxes = append(page.Sandboxes, s.view(rec, s.liveBox(rec.ID)))
	}
	if next != nil {
		page.Next = base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(next.CreatedAt.UnixMicro(), 10) + ":" + next.ID))
	}
	return page, nil
}

func parseCursor(c string) (time.Time, string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", false
	}
	us, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", false
	}
	return time.UnixMicro(n).UTC(), id, true
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// locked runs fn with c's sandbox id read under its entry's lock.
func (s *Service) locked(ctx context.Context, c execution.Caller, id string, fn func(e *entry, rec store.Sandbox) (Sandbox, error)) (Sandbox, error) {
	e, rec, err := s.lockFor(ctx, c, id)
	if err != nil {
		return Sandbox{}, err
	}
	defer e.mu.Unlock()
	return fn(e, rec)
}

// lockFor reads c's sandbox id and returns it with its entry locked
// (the caller unlocks). An id c cannot see gets no entry.
func (s *Service) lockFor(ctx context.Context, c execution.Caller, id string) (*entry, store.Sandbox, error) {
	if !ValidID(id) {
		return nil, store.Sandbox{}, execution.Errorf(execution.KindNotFound, "no sandbox %q", id)
	}
	// The record is read under the lock, which is what counts. An id this
	// node has no entry for is read once before as well, so that asking
	// for ids one cannot see leaves no entry behind; one it has an entry
	// for is not, which saves a store read on every command and file call.
	e := s.knownEntry(id)
	if e == nil {
		if _, err := s.record(ctx, c, id); err != nil {
			return nil, store.Sandbox{}, err
		}
		e = s.entry(id)
	}
	e.mu.Lock()
	rec, err := s.record(ctx, c, id) // again, now that nothing else moves it
	if err != nil {
		e.mu.Unlock()
		return nil, rec, err
	}
	return e, rec, nil
}

var idPattern = regexp.MustCompile(`^sbx_[0-9a-f]{32}$`)

// ValidID reports whether id looks like a sandbox id.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// Kill ends a sandbox (reason killed) and deletes its saved files; the
// record stays readable for the retention period. Killing an ended one
// returns it as it is.
func (s *Service) Kill(ctx context.Context, c execution.Caller, id string) (Sandbox, error) {
	return s.locked(ctx, c, id, func(e *entry, rec store.Sandbox) (Sandbox, error) {
		if rec.Status == string(StatusEnded) {
			return s.view(rec, nil), nil
		}
		rec, err := s.finishLocked(context.WithoutCancel(ctx), e, rec, ReasonKilled, "")
		if err != nil {
			return Sandbox{}, execution.Internal(err)
		}
		return s.view(rec, nil), nil
	})
}

// endUnresponsive ends sandbox id as error if b is still its live
// sandbox: its agent did not send a killed command's exit (stopped by the
// code, or hung), and a sandbox whose agent does not answer is of no use
// and must not hold what it holds.
func (s *Service) endUnresponsive(c execution.Caller, id string, b *box) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := s.locked(ctx, c, id, func(e *entry, rec store.Sandbox) (Sandbox, error) {
		if e.b != b || rec.Status != string(StatusRunning) {
			return Sandbox{}, nil // ended or replaced meanwhile
		}
		_, err := s.finishLocked(ctx, e, rec, ReasonError, "its agent stopped answering (stopped or hung), so it was ended")
		return Sandbox{}, err
	})
	if err != nil {
		s.log.Error("ending a sandbox whose agent stopped answering", "sandbox_id", id, "error", err)
		return
	}
	s.log.Warn("ended a sandbox whose agent stopped answering", "sandbox_id", id)
}

// SetTimeout sets expires_at to now+timeout, refused beyond the plan's
// maximum lifetime, counted from the start of the current live period
// (created_at, or the last resume).
func (s *Service) SetTimeout(ctx context.Context, c execution.Caller, id string, timeout time.Duration) (Sandbox, error) {
	if timeout <= 0 {
		return Sandbox{}, execution.Errorf(execution.KindInvalidTimeout, "timeout must be positive")
	}
	return s.locked(ctx, c, id, func(e *entry, rec store.Sandbox) (Sandbox, error) {
		return s.setTimeoutLocked(ctx, e, rec, timeout)
	})
}

func (s *Service) setTimeoutLocked(ctx context.Context, e *entry, rec store.Sandbox, timeout time.Duration) (Sandbox, error) {
	if rec.Status == string(StatusEnded) {
		return Sandbox{}, notRunning(rec)
	}
	lim := parseLimits(rec)
	now := s.now().UTC()
	exp := now.Add(timeout)
	start := rec.StartedAt
	if rec.Status == string(StatusPaused) {
		start = now // a resume starts a new period
	}
	if bound := start.Add(time.Duration(lim.MaxLifetimeS) * time.Second); exp.After(bound) {
		return Sandbox{}, execution.Errorf(execution.KindInvalidTimeout, "timeout_s goes past the plan's maximum lifetime of %d s, which ends at %s", lim.MaxLifetimeS, bound.Format(time.RFC3339))
	}
	if b := e.b; b != nil {
		if err := b.ag.SetDeadline(ctx, exp.Add(deadlineGrace)); err != nil {
			return Sandbox{}, &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox's deadline could not be moved", Err: err}
		}
	}
	rec.ExpiresAt, rec.TimeoutS = exp, int(timeout/time.Second)
	if err := s.store.UpdateSandbox(ctx, rec, rec.Status); err != nil {
		return Sandbox{}, execution.Internal(err)
	}
	return s.view(rec, e.b), nil
}

// Pause saves the home and ends the processes; pausing a paused sandbox
// returns it as it is.
func (s *Service) Pause(ctx context.Context, c execution.Caller, id string) (Sandbox, error) {
	return s.locked(ctx, c, id, func(e *entry, rec store.Sandbox) (Sandbox, error) {
		switch Status(rec.Status) {
		case StatusPaused:
			return s.view(rec, nil), nil
		case StatusEnded:
			return Sandbox{}, notRunning(rec)
		}
		rec, err := s.pauseLocked(ctx, e, rec, true)
		if err != nil {
			return Sandbox{}, err
		}
		return s.view(rec, nil), nil
	})
}

// Resume restores a paused sandbox's home into a fresh one; resuming a
// running sandbox returns it as it is.
func (s *Service) Resume(ctx context.Context, c execution.Caller, id string) (Sandbox, error) {
	b, rec, err := s.running(ctx, c, id)
	if err != nil {
		return Sandbox{}, err
	}
	return s.view(rec, b), nil
}

// Usage is c's sandbox metering today (UTC) with the open live periods,
// and how many sandboxes it holds.
func (s *Service) Usage(ctx context.Context, c execution.Caller) (Usage, error) {
	day, _ := quotaDay(s.now())
	su, err := s.store.SandboxUsage(ctx, c.Key.Tenant, day)
	if err != nil {
		return Usage{}, execution.Internal(err)
	}
	alive, cpu, in, out := su.AliveSeconds, su.CPUSeconds, su.NetworkBytesIn, su.NetworkBytesOut
	running, paused, err := s.store.CountSandboxes(ctx, c.Key.Tenant)
	if err != nil {
		return Usage{}, execution.Internal(err)
	}
	for _, e := range s.liveEntries() {
		e.mu.Lock()
		if b := e.b; b != nil && b.tenant == c.Key.Tenant {
			alive += max(0, s.now().Sub(b.since).Seconds())
			cpu += b.cpu()
			if b.net != nil {
				nu := b.net.Usage()
				in, out = in+nu.BytesIn, out+nu.BytesOut
			}
		}
		e.mu.Unlock()
	}
	return Usage{SandboxSeconds: alive, SandboxCPUSeconds: cpu, NetworkBytesIn: in, NetworkBytesOut: out, Running: running, Paused: paused}, nil
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "sbx_" + hex.EncodeToString(b)
}

// quotaDay is the quota's day (UTC) at now, and when it ends.
func quotaDay(now time.Time) (string, time.Time) {
	now = now.UTC()
	return now.Format(time.DateOnly), time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
}

// reserve counts one execution of c toward today's quota; the returned
// func gives it back.
func (s *Service) reserve(ctx context.Context, c execution.Caller) (func(), error) {
	now := s.now().UTC()
	day, midnight := quotaDay(now)
	limit := c.Plan.ExecutionsPerDay
	if _, err := s.store.ReserveExecution(ctx, c.Key.Tenant, day, limit); err != nil {
		return nil, quotaErr(err, now, midnight, limit)
	}
	return func() {
		if err := s.store.RefundExecution(context.WithoutCancel(ctx), c.Key.Tenant, day); err != nil {
			s.log.Error("refunding quota", "error", err)
		}
	}, nil
}

func quotaErr(err error, now, midnight time.Time, limit int64) error {
	if errors.Is(err, store.ErrQuotaExceeded) {
		qe := execution.Errorf(execution.KindQuotaExceeded, "daily quota of %d executions reached", limit)
		qe.RetryAfter = max(1, int(midnight.Sub(now).Seconds()))
		qe.Quota = &execution.Quota{Limit: limit, Remaining: 0, Reset: midnight}
		return qe
	}
	return execution.Internal(err)
}

// safeMsg is the client-safe message of err.
func safeMsg(err error) string {
	var xe *execution.Error
	if errors.As(err, &xe) {
		return xe.Msg
	}
	return "an internal error"
}

// Caps on a sandbox's metadata, the same on every plan: it is stored
// with each record and matched by every filtered list.
const (
	MaxMetadata      = 50  // pairs
	MaxMetadataKey   = 64  // bytes
	MaxMetadataValue = 512 // bytes
	MaxListFilters   = 10  // metadata pairs in one list's filter
	// maxListScan is how many records one list call reads at most; a
	// filter that matches few of a tenant's sandboxes then answers a
	// short (even empty) page whose cursor goes on from where it stopped.
	maxListScan = 1000
)

// checkMetadata validates a create request's metadata: keys of 1 to
// MaxMetadataKey bytes and values of at most MaxMetadataValue, valid
// UTF-8 without control characters in either.
func checkMetadata(md map[string]string) error {
	if len(md) > MaxMetadata {
		return execution.Errorf(execution.KindInvalidRequest, "metadata has %d keys; the limit is %d", len(md), MaxMetadata)
	}
	for _, k := range slices.Sorted(maps.Keys(md)) { // the first problem by key, every time
		v := md[k]
		switch {
		case k == "" || len(k) > MaxMetadataKey:
			return execution.Errorf(execution.KindInvalidRequest, "metadata key %q: a key must be 1 to %d bytes", clipKey(k), MaxMetadataKey)
		case len(v) > MaxMetadataValue:
			return execution.Errorf(execution.KindInvalidRequest, "metadata[%q]: a value must be at most %d bytes", clipKey(k), MaxMetadataValue)
		case !printable(k) || !printable(v):
			return execution.Errorf(execution.KindInvalidRequest, "metadata[%q]: keys and values must be UTF-8 text without control characters", clipKey(k))
		}
	}
	return nil
}

// printable: valid UTF-8 without control characters, nor the invisible
// ones that make a key look like another (format characters such as
// U+200B and the bidi overrides, and the line and paragraph separators).
func printable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool {
		return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
	})
}

func clipKey(k string) string {
	if len(k) <= 40 {
		return k
	}
	return strings.ToValidUTF8(k[:40], "") + "…"
}

// checkFiles validates a create request's files.
func checkFiles(files []File, homeBytes, maxFile int64) error {
	var total int64
	for _, f := range files {
		if _, err := homePath(f.Path); err != nil || f.Path == "" || path.IsAbs(f.Path) {
			return execution.Errorf(execution.KindInvalidRequest, "file path %q must be relative to the home and stay inside it", f.Path)
		}
		if int64(len(f.Content)) > maxFile {
			return execution.Errorf(execution.KindPayloadTooLarge, "file %q is larger than the plan's %d MB per file", f.Path, maxFile>>20)
		}
		total += int64(len(f.Content))
	}
	if total > homeBytes {
		return execution.Errorf(execution.KindPayloadTooLarge, "the files are larger than the sandbox's home of %d MB", homeBytes>>20)
	}
	return nil
}

func writeFiles(ctx context.Context, ag agentClient, files []File, maxFile int64) error {
	for _, f := range files {
		p, _ := homePath(f.Path)
		if _, err := ag.WriteFile(ctx, p, strings.NewReader(string(f.Content)), maxFile, f.Mode); err != nil {
			return fileErr(err, f.Path)
		}
	}
	return nil
}
