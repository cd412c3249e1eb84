package execution

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// IdempotencyTTL is how long an Idempotency-Key is remembered.
const IdempotencyTTL = 24 * time.Hour

// abandonMargin is the slack past the longest a request can hold a claim,
// for store writes and clock skew between nodes.
const abandonMargin = time.Minute

// idempotencyWait bounds how long a request waits for an earlier one with
// the same key: long enough for that one to queue and run to its longest
// timeout, so a client retrying a slow request gets its result.
func (s *Service) idempotencyWait(c Caller) time.Duration {
	if s.opts.IdempotencyWait > 0 {
		return s.opts.IdempotencyWait
	}
	return time.Duration(c.Plan.MaxTimeoutS)*time.Second + s.opts.QueueTimeout + 15*time.Second
}

// ClaimAbandonAfter is the age at which a claim that is still running
// counts as abandoned: no request holds one longer than the wait for a
// slot plus the longest timeout of any plan (not the caller's, which may
// have changed since) plus runMargin. Only a request whose process died
// leaves one behind; without this its key would answer 409 for a day.
func (s *Service) ClaimAbandonAfter() time.Duration {
	maxT := 0
	for _, p := range s.plans {
		maxT = max(maxT, p.MaxTimeoutS)
	}
	return s.opts.QueueTimeout + time.Duration(maxT)*time.Second + runMargin + abandonMargin
}

// A key's record holds the ids of what its request accepted: one for a
// single request, a batch's in item order joined by idSep (an id is exe_
// and hex, so it never holds one). A single request and a batch never
// share a hash (see batchHash), so neither replays the other.
const idSep = ","

// joinIDs is the record's ExecutionID for exes.
func joinIDs(exes []store.Execution) string {
	ids := make([]string, len(exes))
	for i, e := range exes {
		ids[i] = e.ID
	}
	return strings.Join(ids, idSep)
}

// splitIDs is the ids a completed record holds, in order.
func splitIDs(executionID string) []string { return strings.Split(executionID, idSep) }

// claimIdempotency claims key for this request. It returns (nil, nil) when
// this request now owns the key and must run, or the stored executions to
// replay (one for a single request, a batch's in order) as they are now.
// While another request with the same key and body is running it waits,
// looking at the store with a growing pause; if that request gives its
// claim up (it ran nothing), this one claims the key and runs.
func (s *Service) claimIdempotency(ctx context.Context, c Caller, key, hash string) ([]store.Execution, error) {
	deadline := s.now().Add(s.idempotencyWait(c))
	pause := 10 * time.Millisecond
	for {
		now := s.now()
		rec, claimed, err := s.store.ClaimIdempotency(ctx, c.Key.Tenant, key, hash, now, now.Add(-IdempotencyTTL), now.Add(-s.ClaimAbandonAfter()))
		if err != nil {
			return nil, Internal(err)
		}
		if claimed {
			return nil, nil
		}
		if rec.BodyHash != hash {
			return nil, Errorf(KindIdempotencyConflict, "this Idempotency-Key was already used with a different request body")
		}
		if rec.ExecutionID != "" {
			ids := splitIDs(rec.ExecutionID)
			exes := make([]store.Execution, len(ids))
			for i, id := range ids {
				e, err := s.store.Execution(ctx, c.Key.Tenant, id)
				if errors.Is(err, store.ErrNotFound) {
					return nil, Internal(errors.New("idempotency record points at missing execution " + id))
				}
				if err != nil {
					return nil, Internal(err)
				}
				exes[i] = e
			}
			return exes, nil
		}
		if !now.Before(deadline) {
			e := Errorf(KindIdempotencyInProgress, "a request with this Idempotency-Key is still running; retry later")
			e.RetryAfter = 1
			return nil, e
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, s.opts.IdempotencyPoll)
	}
}

// idempotent runs do under req's Idempotency-Key, if it has one: the key is
// claimed first (what an earlier request with the same key and body
// accepted is returned as a replay, without calling do), completed with
// the executions do stored, or released when do failed so a retry may run.
// A failure to complete is logged, not returned: the executions are
// stored, and a retry waits for the claim to be abandoned rather than
// running the code twice. do returns one execution for a single request,
// a batch's in order.
func (s *Service) idempotent(ctx context.Context, c Caller, req Request, hash string, do func() ([]store.Execution, error)) (exes []store.Execution, replay bool, err error) {
	if req.IdempotencyKey == "" {
		exes, err := do()
		return exes, false, err
	}
	replayed, err := s.claimIdempotency(ctx, c, req.IdempotencyKey, hash)
	if err != nil {
		return nil, false, err
	}
	if replayed != nil {
		s.metrics.ObserveReplay()
		if req.Accepted != nil {
			req.Accepted(replayed[0].ID)
		}
		return replayed, true, nil
	}
	exes, err = do()
	bg := context.WithoutCancel(ctx)
	if err == nil {
		if cerr := s.store.CompleteIdempotency(bg, c.Key.Tenant, req.IdempotencyKey, joinIDs(exes)); cerr != nil {
			s.log.Error("completing idempotency key", "request_id", req.RequestID, "error", cerr)
		}
	} else if rerr := s.store.ReleaseIdempotency(bg, c.Key.Tenant, req.IdempotencyKey); rerr != nil {
		s.log.Error("releasing idempotency key", "request_id", req.RequestID, "error", rerr)
	}
	return exes, false, err
}

// idempotentOne is idempotent for a request of one execution.
func (s *Service) idempotentOne(ctx context.Context, c Caller, req Request, hash string, do func() (store.Execution, error)) (Outcome, error) {
	exes, replay, err := s.idempotent(ctx, c, req, hash, func() ([]store.Execution, error) {
		exe, err := do()
		return []store.Execution{exe}, err
	})
	if len(exes) != 1 {
		if err == nil {
			err = Internal(fmt.Errorf("idempotency record of a single request holds %d executions", len(exes)))
		}
		return Outcome{}, err
	}
	return Outcome{Execution: exes[0], Replay: replay}, err
}
