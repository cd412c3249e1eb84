package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Options configure an Engine. Every field must be set: the defaults are
// config's (config.Default, Config.QueueSize), and New only checks them.
type Options struct {
	// MaxConcurrent is the number of sandboxes that may run at once.
	MaxConcurrent int
	// QueueTimeout bounds how long a caller waits for a free slot.
	QueueTimeout time.Duration
	// MaxQueue bounds how many callers may wait; when it is full, callers
	// get ErrBusy at once.
	MaxQueue int
}

// validate refuses Options with a field unset or out of range.
func (o Options) validate() error {
	switch {
	case o.MaxConcurrent < 1:
		return fmt.Errorf("engine: max concurrent %d is below 1", o.MaxConcurrent)
	case o.MaxQueue < 1:
		return fmt.Errorf("engine: max queue %d is below 1", o.MaxQueue)
	case o.QueueTimeout <= 0:
		return fmt.Errorf("engine: queue timeout %v is not positive", o.QueueTimeout)
	}
	return nil
}

// Engine bounds how many sandboxes run at once in front of a Driver, and
// shares the slots fairly between tenants (see Admit): a tenant holds at
// most its own limit of slots and of queue places, and never more queue
// places than its fair part of the node's while other tenants want them;
// a freed slot goes to the waiting tenant that holds the fewest (round-
// robin among equals), so no tenant, however busy, starves another.
type Engine struct {
	driver Driver
	opts   Options

	mu      sync.Mutex
	running int
	waiting int
	tenants map[string]*tenantSlots
	// turn lists the tenants with waiters; among those holding the fewest
	// slots, the first gets the next free one and moves to the back.
	turn []string
}

// tenantSlots is one tenant's share: slots held and callers waiting.
type tenantSlots struct {
	limit   int // slots it may hold; 0 means only the engine's limit applies
	running int
	queue   []*waiter
}

type waiter struct {
	ready   chan struct{} // closed when a slot is handed over or the place is taken back
	granted bool
	evicted bool // its place went to a tenant below its fair share: ErrBusy
}

// New returns an Engine over d, or an error if opts is incomplete: it
// takes the queue options as given and fills nothing in.
func New(d Driver, opts Options) (*Engine, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &Engine{driver: d, opts: opts, tenants: map[string]*tenantSlots{}}, nil
}

// Driver returns the driver the engine runs on.
func (e *Engine) Driver() Driver { return e.driver }

// Stats is a snapshot for metrics and `vertal doctor`.
type Stats struct {
	MaxConcurrent int
	Running       int
	Waiting       int
}

// Stats reports slot usage.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Stats{MaxConcurrent: e.opts.MaxConcurrent, Running: e.running, Waiting: e.waiting}
}

// Admission asks for a slot on behalf of one tenant.
type Admission struct {
	// Tenant shares its Limit between all its callers.
	Tenant string
	// Limit is how many slots Tenant may hold at once (its plan's
	// max_concurrent); it may also hold 4×Limit queue places (the
	// engine's MaxQueue per slot, at least 1), and never more than its
	// fair part of the engine's queue (see Admit). Zero: no limit of its
	// own.
	Limit int
	// Queued, if set, is called once when the caller has to wait, before
	// it waits. An error from it gives the place up and is returned.
	Queued func() error
}

// queueFactor is how many queue places a tenant gets per slot of its limit.
func (e *Engine) queueFactor() int { return max(1, e.opts.MaxQueue/e.opts.MaxConcurrent) }

// Acquire waits for a sandbox slot with no per-tenant limit; see Admit.
func (e *Engine) Acquire(ctx context.Context) (release func(), err error) {
	return e.Admit(ctx, Admission{})
}

// Admit waits for a sandbox slot for a.Tenant. It returns ErrBusy when the
// queue (the engine's, or the tenant's share of it) is full or
// QueueTimeout passes, and ctx.Err() when ctx ends first (the caller
// leaves the queue). The returned release must be called; a second call
// does nothing.
//
// The plan's share may exceed what the node has (a pro plan's 4 slots and
// 16 queue places on a 2-slot node), so while several tenants are active
// (running or waiting) each may hold at most MaxQueue/active queue places
// (at least one). A newcomer that finds the queue full while it is below
// that share takes the place of the newest waiter of the tenant furthest
// above it, which gets ErrBusy: the heavy tenant is refused first, and
// the newcomer, holding the fewest slots, gets the next free one.
func (e *Engine) Admit(ctx context.Context, a Admission) (release func(), err error) {
	e.mu.Lock()
	ts := e.tenants[a.Tenant]
	if ts == nil {
		ts = &tenantSlots{}
		e.tenants[a.Tenant] = ts
	}
	ts.limit = a.Limit
	// Every slot that is free has no waiter that may take it (dispatch
	// runs whenever one frees up), so a newcomer within its share takes
	// it without jumping anyone's turn.
	if e.running < e.opts.MaxConcurrent && ts.mayRun() {
		e.grant(ts)
		e.mu.Unlock()
		return e.releaser(a.Tenant), nil
	}
	fair := e.fairQueue()
	if (ts.limit > 0 && len(ts.queue) >= ts.limit*e.queueFactor()) || len(ts.queue) >= fair ||
		(e.waiting >= e.opts.MaxQueue && !e.evictAbove(fair)) {
		e.forget(a.Tenant, ts)
		e.mu.Unlock()
		return nil, ErrBusy
	}
	w := &waiter{ready: make(chan struct{})}
	ts.queue = append(ts.queue, w)
	if !slices.Contains(e.turn, a.Tenant) {
		e.turn = append(e.turn, a.Tenant)
	}
	e.waiting++
	e.mu.Unlock()

	if a.Queued != nil {
		if err := a.Queued(); err != nil {
			if e.leave(a.Tenant, w) {
				e.releaser(a.Tenant)()
			}
			return nil, err
		}
	}
	t := time.NewTimer(e.opts.QueueTimeout)
	defer t.Stop()
	select {
	case <-w.ready:
		if w.evicted {
			return nil, ErrBusy
		}
		return e.releaser(a.Tenant), nil
	case <-t.C:
		if e.leave(a.Tenant, w) {
			return e.releaser(a.Tenant), nil // handed a slot as the wait ended
		}
		return nil, ErrBusy
	case <-ctx.Done():
		if e.leave(a.Tenant, w) {
			e.releaser(a.Tenant)()
		}
		return nil, ctx.Err()
	}
}

func (ts *tenantSlots) mayRun() bool { return ts.limit <= 0 || ts.running < ts.limit }

// fairQueue is how many queue places each active tenant (one that runs or
// waits, the caller's own included) may hold: an equal part of the
// engine's queue, at least one. The caller holds e.mu.
func (e *Engine) fairQueue() int { return max(1, e.opts.MaxQueue/len(e.tenants)) }

// evictAbove frees one queue place for a tenant within its fair share:
// the newest waiter of the tenant holding the most places, if that is
// more than fair, is refused. It reports whether a place was freed. The
// caller holds e.mu.
func (e *Engine) evictAbove(fair int) bool {
	var victim string
	most := fair
	for _, tenant := range e.turn {
		if n := len(e.tenants[tenant].queue); n > most {
			victim, most = tenant, n
		}
	}
	if most == fair {
		return false
	}
	ts := e.tenants[victim]
	w := ts.queue[len(ts.queue)-1]
	ts.queue = ts.queue[:len(ts.queue)-1]
	e.waiting--
	w.evicted = true
	close(w.ready)
	e.forget(victim, ts)
	return true
}

// grant counts a slot as taken by ts. The caller holds e.mu.
func (e *Engine) grant(ts *tenantSlots) {
	ts.running++
	e.running++
}

// leave takes w out of the queue. It reports whether w had already been
// handed a slot, which the caller then owns.
func (e *Engine) leave(tenant string, w *waiter) (granted bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w.granted {
		return true
	}
	if w.evicted {
		return false // already out of the queue
	}
	ts := e.tenants[tenant]
	ts.queue = slices.DeleteFunc(ts.queue, func(x *waiter) bool { return x == w })
	e.waiting--
	e.forget(tenant, ts)
	return false
}

// forget drops the state of a tenant that holds and waits for nothing.
// The caller holds e.mu.
func (e *Engine) forget(tenant string, ts *tenantSlots) {
	if len(ts.queue) == 0 {
		e.turn = slices.DeleteFunc(e.turn, func(t string) bool { return t == tenant })
		if ts.running == 0 {
			delete(e.tenants, tenant)
		}
	}
}

// dispatch hands free slots to waiters: each goes to the waiting tenant
// that holds the fewest slots and may take one more, the earliest in turn
// among equals, which then moves to the back. The caller holds e.mu.
func (e *Engine) dispatch() {
	for e.running < e.opts.MaxConcurrent {
		i := -1
		for j, t := range e.turn {
			ts := e.tenants[t]
			if ts.mayRun() && (i < 0 || ts.running < e.tenants[e.turn[i]].running) {
				i = j
			}
		}
		if i < 0 {
			return
		}
		tenant := e.turn[i]
		ts := e.tenants[tenant]
		w := ts.queue[0]
		ts.queue = ts.queue[1:]
		e.waiting--
		e.grant(ts)
		w.granted = true
		close(w.ready)
		e.turn = slices.Delete(e.turn, i, i+1)
		if len(ts.queue) > 0 {
			e.turn = append(e.turn, tenant)
		}
	}
}

func (e *Engine) releaser(tenant string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			ts := e.tenants[tenant]
			ts.running--
			e.running--
			e.forget(tenant, ts)
			e.dispatch()
		})
	}
}

// Execute runs spec, as given, on the driver without taking a slot; the
// caller must hold one from Acquire or Admit.
func (e *Engine) Execute(ctx context.Context, spec Spec) (Result, error) {
	return e.driver.Run(ctx, spec)
}

// Run takes a slot, executes spec and gives the slot back.
func (e *Engine) Run(ctx context.Context, spec Spec) (Result, error) {
	release, err := e.Acquire(ctx)
	if err != nil {
		return Result{}, err
	}
	defer release()
	return e.Execute(ctx, spec)
}
