// Package pool keeps warm, single-use sandboxes ready in front of a
// driver, so an execution pays only for running its code.
//
// A warm sandbox is created by the driver exactly as a cold one (same
// limits, namespaces, seccomp, mounts, user), with the interpreter already
// started inside and waiting for the code (see package launcher). Run takes
// one that matches the execution's language, image and limits, hands it
// the code and stdin, and the sandbox is destroyed afterwards: it never
// serves a second execution. When none is ready Run takes the driver's
// cold path, so a dry pool is never an error.
//
// The pool refills in the background. Each (language, image, limits) has
// a target size that grows by one on every miss (up to Options.Max) and
// shrinks by one per Options.ShrinkEvery while the pool is idle or had
// spare sandboxes the whole period (down to Options.Min for the languages
// the operator configured, to zero for others). The memory all ready
// sandboxes hold together stays under Options.MemoryBytes. A sandbox that
// dies while waiting is discarded and replaced, never handed out.
package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Prestarter and Warm are the drivers' warm-sandbox seam, declared in
// package engine so that drivers need not import the pool that wraps them.
type (
	Prestarter = engine.Prestarter
	Warm       = engine.Warm
)

var (
	// ErrUnsupported means a language cannot be pre-started by this
	// driver (no launcher fits its interpreter or image); it runs cold.
	ErrUnsupported = engine.ErrUnsupported
	// ErrNotStarted means a warm sandbox could not take an execution; the
	// code did not run, so the pool runs it on the cold path instead.
	ErrNotStarted = engine.ErrNotStarted
	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("pool: closed")
)

// Defaults of the pool's own settings. Its sizes (Min, Max, MemoryBytes)
// are the server's (config.Default) and taken as given.
const (
	DefaultParallel     = 2
	DefaultShrinkEvery  = 30 * time.Second
	DefaultMaxIdle      = 10 * time.Minute
	DefaultStartTimeout = 30 * time.Second
	// guessMemoryBytes is charged to the budget for a sandbox of a kind
	// never measured yet.
	guessMemoryBytes = 64 << 20
)

// Options configure a Pool. The sizes (Min, Max, MemoryBytes) and Limits
// are taken as given: the server's come from package config, where their
// defaults live. Other zero values take the pool's defaults. To add a
// setting: add a field here, with its default in withDefaults or, if the
// operator sets it, in config (a --pool-* flag).
type Options struct {
	// Min is how many sandboxes each language in Languages keeps ready
	// even when idle (--pool-min); at most Max.
	Min int
	// Max bounds the sandboxes ready or starting for one language and
	// set of limits (--pool-max). A server started with --pool-max 0
	// does not build a pool at all.
	Max int
	// MemoryBytes bounds the memory all waiting sandboxes hold together,
	// as measured in their cgroups (--pool-memory-mb).
	MemoryBytes int64
	// Languages are pre-started from New on, with Limits (normally the
	// pool plan's, config.Plan.Limits, every field set; Lifetime is the
	// pool's own, below). Other languages and limits get a pool of their
	// own when traffic asks for them, and lose it when idle.
	Languages []engine.Language
	Limits    engine.Limits
	// Parallel bounds how many sandboxes are being pre-started at once;
	// each one costs a CPU for tens of milliseconds, at a low CPU weight
	// where the driver can set one. Default 2.
	Parallel int
	// ShrinkEvery is the period after which an idle pool gives back one
	// sandbox. Default 30s.
	ShrinkEvery time.Duration
	// MaxIdle is how long a sandbox may wait before it is replaced by a
	// fresh one, so a rebuilt image or changed host reaches warm
	// sandboxes too. Default 10m.
	MaxIdle time.Duration
	// Lifetime is every warm sandbox's own deadline (engine.Limits.Lifetime),
	// counted from its pre-start: it must cover MaxIdle plus the longest
	// timeout an execution may then have. Default MaxIdle + 1 h.
	Lifetime time.Duration
	// WaitReady is how long Run may wait for a sandbox being pre-started
	// when none is ready, before it takes the cold path. Default 0: never
	// wait. Tests use it to run everything warm.
	WaitReady time.Duration
	// StartTimeout bounds one pre-start. Default 30s.
	StartTimeout time.Duration
	// Logger receives pre-start failures; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	o.Min = max(0, min(o.Min, o.Max))
	if o.Parallel <= 0 {
		o.Parallel = DefaultParallel
	}
	if o.ShrinkEvery <= 0 {
		o.ShrinkEvery = DefaultShrinkEvery
	}
	if o.MaxIdle <= 0 {
		o.MaxIdle = DefaultMaxIdle
	}
	if o.Lifetime <= 0 {
		o.Lifetime = o.MaxIdle + time.Hour
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Pool is an engine.Driver that runs executions in warm sandboxes when it
// has one ready and on the base driver's cold path otherwise.
type Pool struct {
	base engine.Driver
	pre  Prestarter
	opts Options
	log  *slog.Logger

	ctx    context.Context // ends at Close: pre-starts in flight stop
	cancel context.CancelFunc
	kick   chan struct{} // wakes the refill loop
	loop   sync.WaitGroup
	bg     sync.WaitGroup // pre-starts, watchers and discards in flight

	mu       sync.Mutex
	closed   bool
	buckets  map[key]*bucket
	starting int           // pre-starts in flight, all buckets
	changed  chan struct{} // closed and replaced when a pre-start ends
}

// key says which executions a warm sandbox can serve.
type key struct {
	name, image, file, command string
	limits                     engine.Limits
}

func keyOf(lang engine.Language, l engine.Limits) key {
	// The output cap is applied by the host as it reads, not by the
	// sandbox: any warm sandbox serves any cap.
	l.OutputBytes, l.ReturnFiles, l.ReturnBytes, l.Lifetime = 0, 0, 0, 0
	return key{name: lang.Name, image: lang.Image, file: lang.File, command: strings.Join(lang.Command, "\x00"), limits: l}
}

// imageRoot is the directory an image path resolves to now: an image
// directory's rootfs is a link to its current version (internal/image),
// switched by a rebuild. "" for what is not a path (a Docker image) or
// cannot be resolved.
func imageRoot(image string) string {
	if !filepath.IsAbs(image) {
		return ""
	}
	r, err := filepath.EvalSymlinks(image)
	if err != nil {
		return ""
	}
	return r
}

// bucket is the pool of one key.
type bucket struct {
	lang       engine.Language
	limits     engine.Limits
	configured bool // in Options.Languages: keeps Min when idle

	ready    []*entry // oldest first
	starting int
	inUse    int
	target   int
	memGuess int64 // last measured memory of one sandbox

	// Since the last shrink tick.
	requests, tickMisses int
	lowWater             int // fewest ready sandboxes seen

	unsupported  bool
	failures     int
	backoffUntil time.Time

	hits, misses, crashed uint64
	bypassed              uint64 // ran cold because of env, args or egress
	outdated              uint64 // dropped: started on an image version no longer current
}

type entry struct {
	w       Warm
	mem     int64
	created time.Time
	root    string        // imageRoot of its image when it was pre-started
	taken   chan struct{} // closed when Run took it or the pool dropped it
}

// New returns a pool in front of base, pre-starting with pre. It starts
// the background refill; Close stops it.
func New(base engine.Driver, pre Prestarter, opts Options) *Pool {
	opts = opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		base: base, pre: pre, opts: opts, log: opts.Logger,
		ctx: ctx, cancel: cancel,
		kick:    make(chan struct{}, 1),
		buckets: map[key]*bucket{},
		changed: make(chan struct{}),
	}
	for _, lang := range opts.Languages {
		b := p.bucketLocked(lang, opts.Limits)
		b.configured = true
		b.target = opts.Min
		b.lowWater = opts.Min
	}
	p.loop.Add(1)
	go p.refillLoop()
	p.poke()
	return p
}

var _ engine.Driver = (*Pool)(nil)

// Name is the base driver's: the pool changes when a sandbox is created,
// not what it is.
func (p *Pool) Name() string { return p.base.Name() }

// Reap delegates to the base driver, whose leftovers include warm
// sandboxes of a server that was killed.
func (p *Pool) Reap(ctx context.Context) (int, error) { return p.base.Reap(ctx) }

// Run executes spec in a warm sandbox if one is ready, else on the cold
// path.
func (p *Pool) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	if err := spec.Validate(); err != nil {
		return engine.Result{}, fmt.Errorf("pool: %w", err)
	}

	root := imageRoot(spec.Language.Image)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return engine.Result{}, ErrClosed
	}
	b := p.bucketLocked(spec.Language, spec.Limits)
	b.requests++
	// A launcher starts with the cold path's fixed environment and command
	// line, so a request with env or args runs cold, and so does one with
	// egress: a pre-started sandbox has no egress mount and its program
	// no relay. It is not a miss that would grow the pool.
	if len(spec.Env) > 0 || len(spec.Args) > 0 || spec.EgressDir != "" {
		b.bypassed++
		p.mu.Unlock()
		return p.base.Run(ctx, spec)
	}
	if b.unsupported {
		b.misses++
		p.mu.Unlock()
		return p.base.Run(ctx, spec)
	}
	e := p.takeLocked(b, root)
	if e == nil {
		b.tickMisses++
		if b.target < p.opts.Max {
			b.target++
		}
		p.poke()
		if p.opts.WaitReady > 0 {
			e = p.waitLocked(ctx, b, root)
		}
	}
	if e == nil {
		b.misses++
		p.mu.Unlock()
		return p.base.Run(ctx, spec)
	}
	b.hits++
	b.inUse++
	p.mu.Unlock()

	// The refill and the teardown wait until the code has run: on a small
	// host, creating a sandbox next to the execution would slow it down
	// more than a few milliseconds' later start costs the pool.
	res, err := e.w.Exec(ctx, spec)
	p.mu.Lock()
	b.inUse--
	if errors.Is(err, ErrNotStarted) {
		b.hits--
		b.misses++
		b.crashed++
	}
	p.mu.Unlock()
	p.poke()
	p.discard(e.w)
	if errors.Is(err, ErrNotStarted) {
		p.log.Warn("pool: warm sandbox could not take the execution; running it cold", "language", spec.Language.Name, "err", err)
		return p.base.Run(ctx, spec)
	}
	return res, err
}

// takeLocked pops the oldest ready sandbox that is still alive and was
// started on the image as root resolves now. Dead ones are dropped and
// replaced; so are those of an image version no longer current (an image
// rebuilt or updated since: its sandboxes keep the old tree mounted).
func (p *Pool) takeLocked(b *bucket, root string) *entry {
	for len(b.ready) > 0 {
		e := b.ready[0]
		b.ready = b.ready[1:]
		close(e.taken)
		select {
		case <-e.w.Done():
			b.crashed++
			p.discard(e.w)
			continue
		default:
		}
		if e.root != root {
			b.outdated++
			p.discard(e.w)
			continue
		}
		b.lowWater = min(b.lowWater, len(b.ready))
		return e
	}
	b.lowWater = 0
	return nil
}

// waitLocked waits up to Options.WaitReady for a sandbox of b while one
// is being, or can be, pre-started.
func (p *Pool) waitLocked(ctx context.Context, b *bucket, root string) *entry {
	deadline := time.NewTimer(p.opts.WaitReady)
	defer deadline.Stop()
	for !p.closed {
		p.fillLocked()
		if e := p.takeLocked(b, root); e != nil {
			return e
		}
		if b.starting == 0 && (b.unsupported || len(b.ready) >= b.target || p.starting < p.opts.Parallel) {
			// Nothing started, and nothing will: the memory budget,
			// a backoff or the target stands in the way.
			return nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			p.mu.Lock()
			return nil
		case <-ctx.Done():
			p.mu.Lock()
			return nil
		}
		p.mu.Lock()
	}
	return nil
}

func (p *Pool) bucketLocked(lang engine.Language, l engine.Limits) *bucket {
	k := keyOf(lang, l)
	b := p.buckets[k]
	if b == nil {
		b = &bucket{lang: lang, limits: l}
		p.buckets[k] = b
	}
	return b
}

// poke wakes the refill loop without blocking.
func (p *Pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// refillLoop starts pre-starts while buckets are below target and shrinks
// idle buckets every ShrinkEvery.
func (p *Pool) refillLoop() {
	defer p.loop.Done()
	tick := time.NewTicker(p.opts.ShrinkEvery)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
			p.shrink()
		case <-retry.C:
		}
		if wait := p.fill(); wait > 0 {
			retry.Reset(wait)
		}
	}
}

// fill starts the pre-starts the buckets need, within Parallel and the
// memory budget. It returns when to look again if a bucket is in backoff.
func (p *Pool) fill() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fillLocked()
}

func (p *Pool) fillLocked() time.Duration {
	if p.closed {
		return 0
	}
	now := p.opts.Now()
	var retry time.Duration
	// Fill the emptiest buckets first, so one language's burst does not
	// starve the others of pre-start capacity.
	bs := p.sortedBucketsLocked()
	slices.SortStableFunc(bs, func(a, b *bucket) int {
		return (len(a.ready) + a.starting) - (len(b.ready) + b.starting)
	})
	for progress := true; progress; {
		progress = false
		for _, b := range bs {
			if p.starting >= p.opts.Parallel {
				return retry
			}
			if b.unsupported || len(b.ready)+b.starting >= b.target {
				continue
			}
			if now.Before(b.backoffUntil) {
				if d := b.backoffUntil.Sub(now); retry == 0 || d < retry {
					retry = d
				}
				continue
			}
			if p.memoryLocked()+b.guess() > p.opts.MemoryBytes {
				continue
			}
			p.startLocked(b)
			progress = true
		}
	}
	return retry
}

func (b *bucket) guess() int64 {
	if b.memGuess > 0 {
		return b.memGuess
	}
	return guessMemoryBytes
}

// memoryLocked is what waiting and starting sandboxes hold or will hold.
func (p *Pool) memoryLocked() int64 {
	var sum int64
	for _, b := range p.buckets {
		for _, e := range b.ready {
			sum += e.mem
		}
		sum += int64(b.starting) * b.guess()
	}
	return sum
}

func (p *Pool) startLocked(b *bucket) {
	b.starting++
	p.starting++
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		ctx, cancel := context.WithTimeout(p.ctx, p.opts.StartTimeout)
		limits := b.limits
		limits.Lifetime = p.opts.Lifetime
		// Resolved before the driver resolves it: a switch in between
		// marks a new sandbox old (and wastes it), never the reverse.
		root := imageRoot(b.lang.Image)
		w, err := p.pre.Prestart(ctx, b.lang, limits)
		cancel()
		p.mu.Lock()
		b.starting--
		p.starting--
		close(p.changed)
		p.changed = make(chan struct{})
		if err != nil {
			p.prestartFailedLocked(b, err)
			p.mu.Unlock()
			p.poke()
			return
		}
		b.failures = 0
		if p.closed || len(b.ready) >= b.target {
			p.mu.Unlock()
			p.discard(w)
			return
		}
		e := &entry{w: w, mem: w.MemoryBytes(), created: p.opts.Now(), root: root, taken: make(chan struct{})}
		if e.mem > 0 {
			b.memGuess = e.mem
		} else {
			e.mem = b.guess()
		}
		b.ready = append(b.ready, e)
		p.bg.Add(1)
		go p.watch(b, e)
		p.mu.Unlock()
		p.poke()
	}()
}

// prestartFailedLocked stops pre-starting what cannot be, and backs off
// from what failed (1s, 2s, 4s, ... up to a minute).
func (p *Pool) prestartFailedLocked(b *bucket, err error) {
	if p.closed {
		return
	}
	if errors.Is(err, ErrUnsupported) {
		b.unsupported = true
		b.target = 0
		p.log.Info("pool: language runs cold only", "language", b.lang.Name, "reason", err)
		return
	}
	b.failures++
	d := time.Second << min(b.failures-1, 6)
	b.backoffUntil = p.opts.Now().Add(min(d, time.Minute))
	p.log.Warn("pool: pre-start failed", "language", b.lang.Name, "failures", b.failures, "err", err)
}

// watch replaces a ready sandbox that dies while it waits.
func (p *Pool) watch(b *bucket, e *entry) {
	defer p.bg.Done()
	select {
	case <-e.taken:
		return
	case <-e.w.Done():
	}
	p.mu.Lock()
	i := slices.Index(b.ready, e)
	if i < 0 {
		p.mu.Unlock()
		return // taken meanwhile; Run saw it dead and counted it
	}
	b.ready = slices.Delete(b.ready, i, i+1)
	close(e.taken)
	b.crashed++
	b.lowWater = min(b.lowWater, len(b.ready))
	p.mu.Unlock()
	p.log.Warn("pool: a waiting sandbox died; replacing it", "language", b.lang.Name)
	p.discard(e.w)
	p.poke()
}

// shrink gives back one sandbox from each bucket that was idle, or had a
// spare sandbox the whole period without a miss, replaces sandboxes that
// waited longer than MaxIdle, and forgets idle buckets nobody configured.
func (p *Pool) shrink() {
	p.mu.Lock()
	var drop []Warm
	now := p.opts.Now()
	for k, b := range p.buckets {
		b.ready = slices.DeleteFunc(b.ready, func(e *entry) bool {
			if now.Sub(e.created) <= p.opts.MaxIdle {
				return false
			}
			close(e.taken)
			drop = append(drop, e.w)
			return true
		})
		floor := 0
		if b.configured {
			floor = p.opts.Min
		}
		if b.unsupported {
			floor = 0
		}
		idle := b.requests == 0
		spare := b.tickMisses == 0 && b.lowWater >= 2
		if (idle || spare) && b.target > floor {
			b.target--
		}
		for len(b.ready) > b.target {
			e := b.ready[0]
			b.ready = b.ready[1:]
			close(e.taken)
			drop = append(drop, e.w)
		}
		b.requests, b.tickMisses, b.lowWater = 0, 0, len(b.ready)
		if !b.configured && idle && b.target == 0 && len(b.ready) == 0 && b.starting == 0 && b.inUse == 0 && !b.unsupported {
			delete(p.buckets, k)
		}
	}
	p.mu.Unlock()
	for _, w := range drop {
		p.discard(w)
	}
	p.poke()
}

// discard destroys w in the background: the caller has its result, and
// the sandbox's processes are already gone or being killed.
func (p *Pool) discard(w Warm) {
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.Discard(ctx); err != nil {
			p.log.Error("pool: discarding a sandbox failed; Reap will retry at start-up", "err", err)
		}
	}()
}

// Close stops refilling, destroys every waiting sandbox and waits for
// pre-starts and discards in flight. Executions must have finished.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var drop []Warm
	for _, b := range p.buckets {
		for _, e := range b.ready {
			close(e.taken)
			drop = append(drop, e.w)
		}
		b.ready = nil
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	p.cancel()
	p.loop.Wait()
	for _, w := range drop {
		p.discard(w)
	}
	p.bg.Wait()
	return nil
}

// Stats is the state of the pool for one language, summed over images
// and limits.
type Stats struct {
	Language string
	Ready    int // waiting for an execution
	Starting int // being pre-started
	InUse    int // running an execution
	Target   int // what the pool is filling towards
	// Hits ran warm; Misses ran cold (none ready, or the language
	// cannot be pre-started); Crashed counts warm
	// sandboxes that died before they could serve and were replaced.
	Hits, Misses, Crashed uint64
	// Bypassed ran cold because they asked for env or args, which a
	// launcher (started with the cold path's fixed environment and
	// command line) cannot take, or for egress, which a pre-started
	// sandbox has no mount for; they are not misses.
	Bypassed uint64
	// Outdated counts warm sandboxes dropped unused because their image
	// was rebuilt or updated after they started.
	Outdated uint64
	// MemoryBytes is what the ready sandboxes hold.
	MemoryBytes int64
}

// Stats reports the pool per language, sorted by language.
func (p *Pool) Stats() []Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	by := map[string]*Stats{}
	for _, b := range p.buckets {
		s := by[b.lang.Name]
		if s == nil {
			s = &Stats{Language: b.lang.Name}
			by[b.lang.Name] = s
		}
		s.Ready += len(b.ready)
		s.Starting += b.starting
		s.InUse += b.inUse
		s.Target += b.target
		s.Hits += b.hits
		s.Misses += b.misses
		s.Crashed += b.crashed
		s.Bypassed += b.bypassed
		s.Outdated += b.outdated
		for _, e := range b.ready {
			s.MemoryBytes += e.mem
		}
	}
	out := make([]Stats, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Stats) int { return strings.Compare(a.Language, b.Language) })
	return out
}

func (p *Pool) sortedBucketsLocked() []*bucket {
	bs := make([]*bucket, 0, len(p.buckets))
	for _, b := range p.buckets {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, func(a, b *bucket) int { return strings.Compare(a.lang.Name, b.lang.Name) })
	return bs
}

// WriteMetrics writes the pool's series in the Prometheus text format
// (it satisfies the API server's MetricsWriter).
func (p *Pool) WriteMetrics(w io.Writer) {
	stats := p.Stats()
	series := []struct {
		name, typ, help string
		val             func(Stats) any
	}{
		{"vertal_pool_ready", "gauge", "Warm sandboxes waiting for an execution.", func(s Stats) any { return s.Ready }},
		{"vertal_pool_starting", "gauge", "Warm sandboxes being pre-started.", func(s Stats) any { return s.Starting }},
		{"vertal_pool_in_use", "gauge", "Warm sandboxes running an execution.", func(s Stats) any { return s.InUse }},
		{"vertal_pool_target", "gauge", "Warm sandboxes the pool is filling towards.", func(s Stats) any { return s.Target }},
		{"vertal_pool_memory_bytes", "gauge", "Memory held by waiting warm sandboxes.", func(s Stats) any { return s.MemoryBytes }},
		{"vertal_pool_hits_total", "counter", "Executions that ran in a warm sandbox.", func(s Stats) any { return s.Hits }},
		{"vertal_pool_misses_total", "counter", "Executions that took the cold path (no warm sandbox ready, or the language cannot be pre-started).", func(s Stats) any { return s.Misses }},
		{"vertal_pool_bypassed_total", "counter", "Executions with env, args or egress, which always take the cold path.", func(s Stats) any { return s.Bypassed }},
		{"vertal_pool_crashed_total", "counter", "Warm sandboxes that died before serving and were replaced.", func(s Stats) any { return s.Crashed }},
		{"vertal_pool_outdated_total", "counter", "Warm sandboxes dropped unused because their image was rebuilt or updated since they started.", func(s Stats) any { return s.Outdated }},
	}
	for _, m := range series {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.typ)
		for _, s := range stats {
			fmt.Fprintf(w, "%s{language=%q} %v\n", m.name, s.Language, m.val(s))
		}
	}
}
