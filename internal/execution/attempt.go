package execution

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// An attempt is one execution's way through this node, from the wait for
// a sandbox slot to its stored outcome. Sync executions (Run) and async
// ones (RunQueued) take the same steps, in this order:
//
//   - admit: wait for a slot, fairly among tenants and within the
//     tenant's limit; a cancel ends the wait.
//   - enter: the entry's own step, with the slot held. A sync execution
//     reserves its quota now and is stored running; an async one claims
//     the row Submit stored queued, whose quota was reserved then.
//   - start: unless a cancel came meanwhile, followers see it start.
//   - execute: run the spec; only a cancel, or the timeout plus
//     runMargin, ends it early (never the caller's context).
//   - classify: the program's result, and whether a cancel ended it.
//   - save: store the outcome, unless another node settled the
//     execution meanwhile (nodes.go): then that outcome stands.
//
// An execution that gets no result of its own (refused a slot, canceled
// before it ran, failed by the platform, or not stored) leaves through
// its entry: a sync one answers its caller, an async one is aborted in the
// store with its quota refunded. A command in a long-lived sandbox is
// meant to be an attempt too, with an entry of its own.
type attempt struct {
	s     *Service
	entry entry
	exe   store.Execution // as stored; its outcome once it has one
	spec  engine.Spec
	net   *Network        // what the sandbox may reach; nil for none
	limit int             // the tenant's sandboxes at once (the plan's MaxConcurrent)
	act   *active         // what Cancel and Attach find while it is here
	onRun func(id string) // called as the sandbox is about to run; may be nil

	tracked bool // act is in s.active
	ran     bool // the sandbox ran (its quota is spent)
}

// entry is how an execution comes to its slot and how it leaves without a
// result of its own.
type entry interface {
	// queued is called when the execution has to wait for a slot, before
	// it waits; an error gives the place up.
	queued(ctx context.Context, at *attempt) error
	// enter is called with the slot held, before the sandbox starts. An
	// error leaves through leave(refused).
	enter(ctx context.Context, at *attempt) error
	// leave ends the execution for the reason given (err says more, for
	// refused, failed and unsaved) and returns its outcome.
	leave(ctx context.Context, at *attempt, why leaving, err error) (store.Execution, error)
}

// leaving is why an execution ends without a result of its own.
type leaving int

const (
	refused  leaving = iota // no slot, or enter failed
	canceled                // canceled before its sandbox started
	failed                  // the platform failed to run it
	unsaved                 // its outcome could not be stored
)

func (s *Service) newAttempt(exe store.Execution, p prepared, limit int, en entry) *attempt {
	act := &active{tenant: exe.Tenant, events: newEventLog(), done: make(chan struct{})}
	spec := p.spec
	spec.ID = exe.ID
	spec.Output = act.events.output
	if p.network != nil {
		// prepare refused a network without Egress and Agent.
		spec.EgressDir = s.opts.Egress.Dir(exe.ID)
		spec.Agent = s.opts.Agent
	}
	return &attempt{s: s, entry: en, exe: exe, spec: spec, net: p.network, limit: limit, act: act}
}

// track makes the stored execution visible to Cancel and Attach on this
// node, and has it look for a cancel recorded by another node.
func (at *attempt) track() {
	at.tracked = true
	at.s.track(at.exe.ID, at.act)
	go at.s.pollCancel(at.exe.Tenant, at.exe.ID, at.act)
}

// run takes the attempt through every step and returns its outcome.
func (at *attempt) run(ctx context.Context) (out store.Execution, err error) {
	bg := context.WithoutCancel(ctx)
	defer func() { at.finish(out, err) }()
	release, err := at.admit(ctx)
	if err != nil {
		if at.act.isCanceled() || at.exe.CancelRequested {
			// Canceled while waiting (an async one perhaps before a
			// worker took it): it never ran.
			return at.entry.leave(bg, at, canceled, nil)
		}
		return at.entry.leave(bg, at, refused, err)
	}
	defer release()
	if err := at.entry.enter(ctx, at); err != nil {
		return at.entry.leave(bg, at, refused, err)
	}
	at.start()
	if at.act.isCanceled() {
		// Canceled between the slot and the start: nothing ran.
		return at.entry.leave(bg, at, canceled, nil)
	}
	res, runErr, wasCanceled := at.execute(bg, release)
	if runErr != nil && !wasCanceled {
		at.s.metrics.ObserveExecution(at.exe.Language, string(engine.StatusError), 0)
		return at.entry.leave(bg, at, failed, runErr)
	}
	at.classify(res, runErr, wasCanceled)
	return at.save(bg)
}

// admit waits for a sandbox slot; the wait ends when ctx does or the
// execution is canceled.
func (at *attempt) admit(ctx context.Context) (release func(), err error) {
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	at.act.setCancel(stopWait)
	return at.s.engine.Admit(waitCtx, engine.Admission{
		Tenant: at.exe.Tenant,
		Limit:  at.limit,
		Queued: func() error { return at.entry.queued(ctx, at) },
	})
}

// start lets the followers see the execution start (from then on they
// follow it live), unless it was canceled.
func (at *attempt) start() {
	if at.act.isCanceled() {
		return
	}
	at.act.events.start(at.exe)
	if at.onRun != nil {
		at.onRun(at.exe.ID)
	}
}

// execute runs the spec in the slot the attempt holds (release gives it
// back as soon as the sandbox is gone). It reports the platform's error,
// if any, and whether a cancel ended the run.
func (at *attempt) execute(bg context.Context, release func()) (engine.Result, error, bool) {
	at.ran = true
	runCtx, stopRun := context.WithTimeout(bg, at.spec.Timeout+runMargin)
	defer stopRun()
	at.act.setCancel(stopRun)
	box, err := at.openNetwork()
	if err != nil {
		release()
		return engine.Result{}, err, at.act.isCanceled()
	}
	res, err := at.s.engine.Execute(runCtx, at.spec)
	release()
	at.closeNetwork(box)
	if err == nil && res.Status == engine.StatusError {
		err = errors.New("driver reported a platform error")
	}
	return res, err, at.act.isCanceled()
}

// openNetwork starts the proxy of an execution with a network, on the
// socket its sandbox will find at engine.EgressSocket; nil without one.
func (at *attempt) openNetwork() (*egress.Box, error) {
	if at.net == nil {
		return nil, nil
	}
	pol, err := egress.Parse(at.net.Allow, at.net.MaxBytes)
	if err != nil {
		return nil, fmt.Errorf("the execution's network: %w", err)
	}
	box, err := at.s.opts.Egress.Open(at.exe.ID, pol, at.s.log.With("execution_id", at.exe.ID, "tenant", at.exe.Tenant))
	if err != nil {
		return nil, fmt.Errorf("opening the execution's network: %w", err)
	}
	return box, nil
}

// closeNetwork cuts what the sandbox left open and records its traffic
// with the execution (NetworkRecord).
func (at *attempt) closeNetwork(box *egress.Box) {
	if box == nil {
		return
	}
	if err := box.Close(); err != nil {
		at.s.log.Error("removing an execution's egress directory", "execution_id", at.exe.ID, "error", err)
	}
	b, err := json.Marshal(NetworkRecord{Allow: at.net.Allow, Usage: *box.Usage()})
	if err != nil {
		at.s.log.Error("recording an execution's network", "execution_id", at.exe.ID, "error", err)
		return
	}
	at.exe.Network = string(b)
}

// classify records what the run did. A canceled execution whose sandbox
// started counts, with what it used.
func (at *attempt) classify(res engine.Result, runErr error, wasCanceled bool) {
	if runErr == nil {
		fillResult(&at.exe, res)
	}
	if wasCanceled {
		at.exe.Status = store.StatusCanceled
	}
	at.exe.FinishedAt = at.s.now().UTC()
	at.s.metrics.ObserveExecution(at.exe.Language, at.exe.Status, res.Duration)
}

// save stores the final at.exe and queues its webhook, if it has one. If
// the store refuses it and another node has settled the execution
// meanwhile (taking this one for stopped), that outcome stands, refund
// included; otherwise the execution leaves unsaved.
func (at *attempt) save(ctx context.Context) (store.Execution, error) {
	s, exe := at.s, at.exe
	err := s.store.SaveExecution(ctx, exe)
	if err == nil {
		s.deliver(ctx, exe)
		return exe, nil
	}
	if cur, gerr := s.store.Execution(ctx, exe.Tenant, exe.ID); gerr == nil && store.Final(cur.Status) {
		s.log.Warn("execution was settled elsewhere while it ran here", "execution_id", exe.ID, "status", cur.Status)
		return cur, nil
	}
	return at.entry.leave(ctx, at, unsaved, err)
}

// finish ends the followers' log with the outcome, before the log is
// dropped (later followers replay from the store), and lets Cancel know
// that the outcome is stored.
func (at *attempt) finish(out store.Execution, err error) {
	at.act.events.finish(out, err)
	if at.tracked {
		at.s.untrack(at.exe.ID)
	}
	close(at.act.done)
}
