package execution

import (
	"context"
	"errors"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/queue"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Nodes and what a stopped one leaves. Every execution a node accepts
// (sync) or claims (async) carries its NodeID. A node sends a heartbeat
// every NodeTimeout/6; one that sent none for NodeTimeout is taken for
// stopped, and the first node to see it settles its unfinished
// executions: each ends as error with a reason, and its quota is refunded
// if it was reserved (every async one, and a sync one that was running).
// A node that restarts (same NodeID) settles its own at once. The store
// makes the settling exactly-once (AbortExecution has one winner), and a
// result that the stopped node still tries to save after that is dropped
// in favour of the settled one.
//
// Async executions still queued have no owner: their queue jobs stay,
// and any node runs them. A sweep also queues again every queued async
// execution older than a minute (a crash between storing and queueing;
// the queue drops a job it already has).

// DefaultNodeTimeout is how long a node may go silent before it is
// taken for stopped.
const DefaultNodeTimeout = 60 * time.Second

// Start settles what an earlier run of this node left unfinished, then
// sends heartbeats and settles stopped nodes until ctx ends. It returns
// once the first settling is done.
func (s *Service) Start(ctx context.Context) error {
	timeout := s.opts.NodeTimeout
	if timeout <= 0 {
		timeout = DefaultNodeTimeout
	}
	if err := s.Beat(ctx); err != nil {
		return Internal(err)
	}
	s.settle(ctx, s.opts.NodeID, "the server restarted while it was unfinished")
	s.requeue(ctx)
	go func() {
		beat := time.NewTicker(max(timeout/6, 10*time.Millisecond))
		defer beat.Stop()
		sweeps := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
			}
			if err := s.Beat(ctx); err != nil {
				s.log.Warn("heartbeat", "error", err)
				continue
			}
			stale, err := s.store.StaleNodes(ctx, s.now().UTC().Add(-timeout))
			if err != nil {
				s.log.Warn("looking for stopped nodes", "error", err)
				continue
			}
			for _, n := range stale {
				if n == s.opts.NodeID {
					continue
				}
				s.log.Warn("node stopped sending heartbeats; settling its executions", "node", n)
				s.settle(ctx, n, "the node running it stopped")
				if s.opts.NodeStopped != nil {
					s.opts.NodeStopped(ctx, n)
				}
				if err := s.store.ForgetNode(ctx, n); err != nil {
					s.log.Warn("forgetting a stopped node", "node", n, "error", err)
				}
			}
			if sweeps++; sweeps%6 == 0 {
				s.requeue(ctx)
			}
		}
	}()
	return nil
}

// Beat sends one heartbeat now, with the node's address
// (Options.NodeAddress).
func (s *Service) Beat(ctx context.Context) error {
	return s.store.Heartbeat(ctx, s.opts.NodeID, s.opts.NodeAddress, s.now().UTC())
}

// settle ends every unfinished execution owned by node as error.
func (s *Service) settle(ctx context.Context, node, reason string) {
	owned, err := s.store.OwnedExecutions(ctx, node)
	if err != nil {
		s.log.Error("listing executions to settle", "node", node, "error", err)
		return
	}
	for _, e := range owned {
		if a := s.lookup(e.ID); a != nil && node == s.opts.NodeID {
			continue // running here right now
		}
		reserved := e.Async || e.Status == store.StatusRunning
		got, err := s.store.AbortExecution(ctx, e.Tenant, e.ID, statusError, reason,
			[]string{store.StatusQueued, store.StatusRunning}, s.now().UTC())
		if errors.Is(err, store.ErrFinished) || errors.Is(err, store.ErrNotQueued) {
			continue // settled by another node, or finished meanwhile
		}
		if err != nil {
			s.log.Error("settling an execution", "execution_id", e.ID, "error", err)
			continue
		}
		s.log.Warn("settled an unfinished execution", "execution_id", e.ID, "node", node, "was", e.Status)
		s.metrics.ObserveExecution(got.Language, got.Status, 0)
		if reserved {
			s.refundOne(ctx, got)
		}
		s.deliver(ctx, got)
	}
}

// requeue queues again the async executions still queued after a minute.
func (s *Service) requeue(ctx context.Context) {
	if s.opts.Queue == nil {
		return
	}
	qs, err := s.store.QueuedAsync(ctx, s.now().UTC().Add(-time.Minute), 1000)
	if err != nil || len(qs) == 0 {
		return
	}
	jobs := make([]queue.RunArgs, len(qs))
	for i, e := range qs {
		jobs[i] = queue.RunArgs{Tenant: e.Tenant, ExecutionID: e.ID}
	}
	if err := s.opts.Queue.EnqueueRuns(ctx, jobs); err != nil {
		s.log.Warn("queueing waiting executions again", "error", err)
	}
}
