package engine

import (
	"context"
	"sync/atomic"
	"time"
)

// Options configure an Engine.
type Options struct {
	// MaxConcurrent is the number of sandboxes that may run at once.
	MaxConcurrent int
	// QueueTimeout bounds how long a caller waits for a free slot.
	QueueTimeout time.Duration
	// MaxQueue bounds how many callers may wait; when it is full, callers
	// get ErrBusy at once. Zero means 4×MaxConcurrent.
	MaxQueue int
}

// Engine bounds how many sandboxes run at once in front of a Driver.
type Engine struct {
	driver  Driver
	slots   chan struct{}
	opts    Options
	waiting atomic.Int64
	running atomic.Int64
}

// New returns an Engine over d.
func New(d Driver, opts Options) *Engine {
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 2
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = 4 * opts.MaxConcurrent
	}
	if opts.QueueTimeout <= 0 {
		opts.QueueTimeout = 30 * time.Second
	}
	return &Engine{driver: d, slots: make(chan struct{}, opts.MaxConcurrent), opts: opts}
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
	return Stats{MaxConcurrent: e.opts.MaxConcurrent, Running: int(e.running.Load()), Waiting: int(e.waiting.Load())}
}

// Acquire waits for a sandbox slot. It returns ErrBusy when the queue is
// full or QueueTimeout passes, and ctx.Err() when ctx ends first (the
// caller leaves the queue). The returned release must be called once.
func (e *Engine) Acquire(ctx context.Context) (release func(), err error) {
	select {
	case e.slots <- struct{}{}:
		return e.releaser(), nil
	default:
	}
	if int(e.waiting.Add(1)) > e.opts.MaxQueue {
		e.waiting.Add(-1)
		return nil, ErrBusy
	}
	defer e.waiting.Add(-1)
	t := time.NewTimer(e.opts.QueueTimeout)
	defer t.Stop()
	select {
	case e.slots <- struct{}{}:
		return e.releaser(), nil
	case <-t.C:
		return nil, ErrBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *Engine) releaser() func() {
	e.running.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			e.running.Add(-1)
			<-e.slots
		}
	}
}

// Execute runs spec on the driver without taking a slot; the caller must
// hold one from Acquire.
func (e *Engine) Execute(ctx context.Context, spec Spec) (Result, error) {
	if spec.Timeout <= 0 {
		spec.Timeout = DefaultTimeout
	}
	spec.Limits = spec.Limits.WithDefaults()
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
