package execution

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// active is an execution accepted on this node that has not finished.
type active struct {
	tenant   string
	events   *eventLog // what Attach follows while it runs here
	mu       sync.Mutex
	cancel   context.CancelFunc // ends the current phase: the wait for a slot, then the run
	canceled bool
	done     chan struct{} // closed when Run has stored its outcome (or given up)
}

// setCancel makes f end the current phase; if a cancel already came, now.
func (a *active) setCancel(f context.CancelFunc) {
	a.mu.Lock()
	a.cancel = f
	canceled := a.canceled
	a.mu.Unlock()
	if canceled {
		f()
	}
}

func (a *active) requestCancel() {
	a.mu.Lock()
	a.canceled = true
	f := a.cancel
	a.mu.Unlock()
	if f != nil {
		f()
	}
}

func (a *active) isCanceled() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.canceled
}

func (s *Service) track(id string, a *active) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active[id] = a
}

func (s *Service) untrack(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.active, id)
}

func (s *Service) lookup(id string) *active {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active[id]
}

// pollCancel looks in the store every CancelPoll for a cancel recorded by
// another node (with PostgreSQL, the node that answers the cancel is often
// not the one running the execution), until the execution is done.
func (s *Service) pollCancel(tenant, id string, a *active) {
	t := time.NewTicker(s.opts.CancelPoll)
	defer t.Stop()
	for {
		select {
		case <-a.done:
			return
		case <-t.C:
		}
		e, err := s.store.Execution(context.Background(), tenant, id)
		if err != nil {
			continue // a store hiccup; look again at the next tick
		}
		if e.CancelRequested {
			a.requestCancel()
			return
		}
	}
}

// Cancel ends tenant's execution id as canceled: a queued one without
// running, a running one by killing its sandbox (the driver removes it when
// the run's context ends). When this node runs it, Cancel waits for the
// canceled execution to be stored and returns it; when another node does,
// the cancel is recorded and that node ends it within CancelPoll, so the
// execution returned may still be running. A finished execution is
// KindExecutionFinished.
func (s *Service) Cancel(ctx context.Context, c Caller, id string) (store.Execution, error) {
	if !ValidID(id) {
		return store.Execution{}, Errorf(KindNotFound, "execution not found")
	}
	e, err := s.store.RequestCancel(ctx, c.Key.Tenant, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Execution{}, Errorf(KindNotFound, "execution not found")
	case errors.Is(err, store.ErrFinished):
		return store.Execution{}, Errorf(KindExecutionFinished, "execution %s has already finished with status %s", id, e.Status)
	case err != nil:
		return store.Execution{}, Internal(err)
	}
	a := s.lookup(id)
	if a == nil && e.Async && e.Status == store.StatusQueued {
		// Waiting in the queue, on no node: end it here. If a worker
		// claimed it meanwhile, that worker sees the cancel instead.
		got, err := s.cancelQueued(context.WithoutCancel(ctx), e)
		if err == nil {
			return got, nil
		}
		if !errors.Is(err, store.ErrNotQueued) && !errors.Is(err, store.ErrFinished) {
			return store.Execution{}, Internal(err)
		}
	}
	if a == nil {
		return e, nil
	}
	a.requestCancel()
	t := time.NewTimer(cancelWait)
	defer t.Stop()
	select {
	case <-a.done:
	case <-t.C:
	case <-ctx.Done():
		return store.Execution{}, ctx.Err()
	}
	if got, err := s.store.Execution(ctx, c.Key.Tenant, id); err == nil {
		e = got
	}
	return e, nil
}
