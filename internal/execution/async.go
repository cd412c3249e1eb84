package execution

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/queue"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// Async executions are accepted, stored and queued at once (202): their
// quota is reserved at acceptance, so a burst cannot go over it, and the
// request itself is stored with the row, so a queue worker on any node can
// run it. A worker waits for a sandbox slot like a sync request does (the
// same fair admission between tenants, the same per-tenant limit), then
// claims the row (queued -> running, exactly once across nodes) and runs
// it. Every accepted execution ends exactly once: run, canceled, or error
// with a reason when the platform failed or the node running it stopped;
// the quota of one that did not run to its end is refunded.

// Queue is the durable queue the service puts async work in.
type Queue interface {
	EnqueueRuns(ctx context.Context, jobs []queue.RunArgs) error
	EnqueueDelivery(ctx context.Context, d queue.DeliverArgs) error
}

// Webhooks is what webhook_url needs.
type Webhooks struct {
	Guard  *webhook.Guard
	Client *webhook.Client
	// RetryFor bounds the retries of one delivery, counted from its first
	// attempt (default 24 h); then it is failed.
	RetryFor time.Duration
}

// MaxBatch is how many executions one batch may hold.
const MaxBatch = 20

// MaxQueuedPerTenant bounds a tenant's async executions waiting to run on
// the whole service: more are refused with 429 until some have run, so
// one tenant's backlog cannot grow without bound in front of others'.
const MaxQueuedPerTenant = 5 * MaxBatch

// asyncRequest is what an async execution's row keeps to run later.
type asyncRequest struct {
	Plan  string `json:"plan"`
	Input Input  `json:"input"`
}

// Submit accepts one async execution: it is validated, its quota reserved,
// stored as queued and queued, and returned at once.
func (s *Service) Submit(ctx context.Context, c Caller, req Request) (Outcome, error) {
	if s.opts.Queue == nil {
		return Outcome{}, Errorf(KindUnavailable, "async executions are not available on this server")
	}
	p, err := s.prepare(c, req.Input)
	if err != nil {
		return Outcome{}, err
	}
	hook, err := s.checkWebhook(ctx, "webhook_url", req.Input.WebhookURL)
	if err != nil {
		return Outcome{}, err
	}
	out, err := s.idempotentOne(ctx, c, req, p.hash, func() (store.Execution, error) {
		exes, err := s.accept(ctx, c, req, []Input{req.Input}, []prepared{p}, []string{hook})
		if err != nil {
			return store.Execution{}, err
		}
		return exes[0], nil
	})
	if err != nil {
		return Outcome{}, err
	}
	return out, nil
}

// BatchOutcome is an accepted batch: its executions in the order of its
// items, accepted now or replayed.
type BatchOutcome struct {
	Executions []store.Execution
	Replay     bool
}

// SubmitBatch accepts up to MaxBatch async executions, all or none: every
// item is validated first (a refusal names its index), the quota of the
// whole batch is reserved at once, and the executions are returned in
// order. webhookURL applies to the items that name none.
//
// req.IdempotencyKey covers the whole batch: a repeat with the same items
// replays the executions first accepted, as they are now, and reserves
// nothing; a refused batch releases the key.
func (s *Service) SubmitBatch(ctx context.Context, c Caller, req Request, items []Input, webhookURL *string) (BatchOutcome, error) {
	if s.opts.Queue == nil {
		return BatchOutcome{}, Errorf(KindUnavailable, "async executions are not available on this server")
	}
	switch {
	case len(items) == 0:
		return BatchOutcome{}, Errorf(KindInvalidRequest, "executions must hold at least one execution")
	case len(items) > MaxBatch:
		return BatchOutcome{}, Errorf(KindInvalidRequest, "executions holds %d executions; a batch holds at most %d", len(items), MaxBatch)
	}
	batchHook, err := s.checkWebhook(ctx, "webhook_url", webhookURL)
	if err != nil {
		return BatchOutcome{}, err
	}
	ps := make([]prepared, len(items))
	hooks := make([]string, len(items))
	for i, in := range items {
		if ps[i], err = s.prepare(c, in); err != nil {
			var e *Error
			if errors.As(err, &e) {
				e.Msg = fmt.Sprintf("executions[%d]: %s", i, e.Msg)
			}
			return BatchOutcome{}, err
		}
		if hooks[i], err = s.checkWebhook(ctx, fmt.Sprintf("executions[%d].webhook_url", i), in.WebhookURL); err != nil {
			return BatchOutcome{}, err
		}
		if hooks[i] == "" {
			hooks[i] = batchHook
		}
	}
	exes, replay, err := s.idempotent(ctx, c, req, batchHash(ps, hooks), func() ([]store.Execution, error) {
		return s.accept(ctx, c, req, items, ps, hooks)
	})
	if err != nil {
		return BatchOutcome{}, err
	}
	return BatchOutcome{Executions: exes, Replay: replay}, nil
}

// batchHash identifies a batch for Idempotency-Key: each item's request
// hash with the webhook it resolved to, in order. It is the hash of JSON
// under a "batch" name, so it never equals a single request's hash (the
// hash of its canonical fields), and a key used for one is a conflict for
// the other.
func batchHash(ps []prepared, hooks []string) string {
	type item struct {
		Hash    string `json:"hash"`
		Webhook string `json:"webhook_url,omitempty"`
	}
	b := struct {
		Batch []item `json:"batch"`
	}{make([]item, len(ps))}
	for i, p := range ps {
		b.Batch[i] = item{p.hash, hooks[i]}
	}
	canon, _ := json.Marshal(b)
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

// checkWebhook validates a webhook_url (nil or "" is none) against the
// address policy, and returns it.
func (s *Service) checkWebhook(ctx context.Context, field string, u *string) (string, error) {
	if u == nil || *u == "" {
		return "", nil
	}
	if s.opts.Webhooks == nil {
		return "", Errorf(KindInvalidRequest, "%s: webhooks are not available on this server", field)
	}
	if _, err := s.opts.Webhooks.Guard.CheckURL(ctx, *u); err != nil {
		var we *webhook.Error
		if errors.As(err, &we) {
			return "", &Error{Kind: KindInvalidRequest, Msg: field + ": " + we.Msg, Err: err}
		}
		return "", &Error{Kind: KindInvalidRequest, Msg: field + ": the URL was refused", Err: err}
	}
	return *u, nil
}

// accept reserves the quota of the executions, stores them queued and
// queues them. On error nothing is left stored, queued or counted.
func (s *Service) accept(ctx context.Context, c Caller, req Request, items []Input, ps []prepared, hooks []string) ([]store.Execution, error) {
	tenant := c.Key.Tenant
	bg := context.WithoutCancel(ctx)
	now := s.now().UTC()
	day, midnight := quotaDay(now)
	limit := c.Plan.ExecutionsPerDay
	n := int64(len(items))
	backlog, err := s.store.CountQueuedAsync(ctx, tenant)
	if err != nil {
		return nil, Internal(err)
	}
	if backlog+n > MaxQueuedPerTenant {
		e := Errorf(KindRateLimited, "%d of your async executions are waiting to run; at most %d may wait, retry when some have run", backlog, MaxQueuedPerTenant)
		e.RetryAfter = 5
		return nil, e
	}
	used, err := s.store.ReserveExecutions(ctx, tenant, day, n, limit)
	if errors.Is(err, store.ErrQuotaExceeded) {
		e := Errorf(KindQuotaExceeded, "daily quota of %d executions reached", limit)
		if n > 1 {
			e = Errorf(KindQuotaExceeded, "the batch of %d does not fit in the daily quota of %d executions (%d left)", n, limit, max(0, limit-used))
		}
		e.RetryAfter = secondsUntil(now, midnight)
		e.Quota = &Quota{Limit: limit, Remaining: max(0, limit-used), Reset: midnight}
		return nil, e
	}
	if err != nil {
		return nil, Internal(err)
	}
	refund := func() {
		if err := s.store.RefundExecutions(bg, tenant, day, n); err != nil {
			s.log.Error("refunding quota", "request_id", req.RequestID, "error", err)
		}
	}
	exes := make([]store.Execution, len(items))
	jobs := make([]queue.RunArgs, len(items))
	for i, in := range items {
		body, err := json.Marshal(asyncRequest{Plan: c.Key.Plan, Input: in})
		if err != nil {
			refund()
			return nil, Internal(err)
		}
		exes[i] = store.Execution{
			ID: newID(), Tenant: tenant, KeyID: c.Key.ID, RequestID: req.RequestID,
			Language: ps[i].spec.Language.Name, Image: ps[i].image, ImageVersion: ps[i].imageBuild,
			Status: store.StatusQueued, CreatedAt: now, Async: true, Request: body,
		}
		if hooks[i] != "" {
			exes[i].Webhook = &store.Webhook{URL: hooks[i], DeliveryID: newDeliveryID(), State: store.WebhookPending}
		}
		jobs[i] = queue.RunArgs{Tenant: tenant, ExecutionID: exes[i].ID, Backlog: backlog + int64(i)}
	}
	if err := s.store.CreateExecutions(ctx, exes); err != nil {
		refund()
		return nil, unavailable(fmt.Errorf("storing %d accepted executions: %w", n, err))
	}
	if err := s.opts.Queue.EnqueueRuns(bg, jobs); err != nil {
		for _, e := range exes {
			if derr := s.store.DeleteExecution(bg, tenant, e.ID); derr != nil {
				s.log.Error("deleting execution that could not be queued", "execution_id", e.ID, "error", derr)
			}
		}
		refund()
		return nil, unavailable(err)
	}
	if req.Accepted != nil {
		req.Accepted(exes[0].ID)
	}
	if req.Quota != nil {
		req.Quota(Quota{Limit: limit, Remaining: max(0, limit-used), Reset: midnight})
	}
	return exes, nil
}

func newDeliveryID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "dlv_" + hex.EncodeToString(b)
}

// RunQueued runs one async execution for the queue: it waits for a
// sandbox slot (queue.ErrBusy when none comes in time), claims the row so
// that no other worker runs it, runs it and stores the outcome. An
// execution already final, or claimed by another worker, is left alone.
func (s *Service) RunQueued(ctx context.Context, tenant, id string) error {
	exe, err := s.store.Execution(ctx, tenant, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil // never stored whole (see accept): nothing to run
	}
	if err != nil {
		return err
	}
	if store.Final(exe.Status) {
		s.deliver(ctx, exe) // in case the delivery was not queued (the unique job drops a repeat)
		return nil
	}
	if exe.Status != store.StatusQueued {
		return nil // running on some node; a stopped node's is settled by the heartbeat sweep
	}
	bg := context.WithoutCancel(ctx)
	var ar asyncRequest
	if err := json.Unmarshal(exe.Request, &ar); err != nil {
		return s.abortQueued(bg, exe, "the stored request could not be read")
	}
	plan, ok := s.plans[ar.Plan]
	if !ok {
		return s.abortQueued(bg, exe, fmt.Sprintf("plan %q no longer exists", ar.Plan))
	}
	c := Caller{Key: store.Key{ID: exe.KeyID, Tenant: tenant, Plan: ar.Plan}, Plan: plan}
	p, err := s.prepare(c, ar.Input)
	if err != nil {
		return s.abortQueued(bg, exe, "the request is no longer valid: "+err.Error())
	}
	// The build current when it was accepted may have been replaced while
	// it waited: the result names the one it is about to run on.
	exe.ImageVersion = p.imageBuild
	en := &asyncEntry{}
	at := s.newAttempt(exe, p, plan.MaxConcurrent, en)
	at.track() // its row is stored: Cancel and Attach find it here from now on
	_, _ = at.run(ctx)
	return en.retry
}

// asyncEntry brings in an async execution for a queue worker (RunQueued).
// Its row was stored queued and its quota reserved at Submit; with a slot
// held, the worker claims the row, exactly once across nodes. One that
// ends without a result of its own is aborted in the store with a reason,
// refunded, and its webhook queued. retry is what the queue gets.
type asyncEntry struct {
	claimed bool
	retry   error // nil: the job is done; queue.ErrBusy or another error: try it again
}

func (*asyncEntry) queued(context.Context, *attempt) error { return nil }

func (e *asyncEntry) enter(ctx context.Context, at *attempt) error {
	exe := &at.exe
	exe.Owner, exe.Status, exe.StartedAt = at.s.opts.NodeID, store.StatusRunning, at.s.now().UTC()
	if err := at.s.store.ClaimExecution(ctx, exe.Tenant, exe.ID, exe.Owner, exe.StartedAt); err != nil {
		return err
	}
	e.claimed = true
	return nil
}

func (e *asyncEntry) leave(ctx context.Context, at *attempt, why leaving, err error) (store.Execution, error) {
	s, exe := at.s, at.exe
	switch why {
	case refused:
		switch {
		case errors.Is(err, store.ErrNotQueued), errors.Is(err, store.ErrFinished):
			// Canceled or claimed elsewhere meanwhile: left alone.
		case errors.Is(err, engine.ErrBusy):
			e.retry = queue.ErrBusy
		default:
			e.retry = err // the node is stopping, or the store failed: the job is tried again
		}
		return store.Execution{}, nil
	case canceled:
		if !e.claimed {
			return s.cancelQueued(ctx, exe)
		}
		return s.abort(ctx, exe, store.StatusCanceled, "canceled before it started", store.StatusRunning)
	case failed:
		s.log.Error("async execution failed in the sandbox", "execution_id", exe.ID, "error", err)
		return s.abort(ctx, exe, statusError, "the sandbox failed to run the code; it was not counted against your quota", store.StatusRunning)
	default: // unsaved
		s.log.Error("storing an async result; it is settled as an error", "execution_id", exe.ID, "error", err)
		return s.abort(ctx, exe, statusError, "the result could not be stored; it was not counted against your quota", store.StatusRunning)
	}
}

// cancelQueued ends an async execution that was canceled before it
// claimed a slot: it never ran, so its quota is refunded.
func (s *Service) cancelQueued(ctx context.Context, exe store.Execution) (store.Execution, error) {
	e, err := s.abort(ctx, exe, store.StatusCanceled, "canceled while queued", store.StatusQueued)
	if err == nil {
		s.metrics.ObserveExecution(e.Language, e.Status, 0)
	}
	return e, err
}

// abortQueued ends a queued async execution that cannot run as an error.
func (s *Service) abortQueued(ctx context.Context, exe store.Execution, reason string) error {
	_, err := s.abort(ctx, exe, statusError, reason, store.StatusQueued)
	if errors.Is(err, store.ErrNotQueued) || errors.Is(err, store.ErrFinished) {
		return nil
	}
	return err
}

// abort ends an async execution that did not run to its end as status,
// with reason, if it is still in one of the states from. Its quota,
// reserved at Submit, is refunded and its webhook queued.
func (s *Service) abort(ctx context.Context, exe store.Execution, status, reason string, from ...string) (store.Execution, error) {
	e, err := s.store.AbortExecution(ctx, exe.Tenant, exe.ID, status, reason, from, s.now().UTC())
	if err != nil {
		return store.Execution{}, err
	}
	s.refundOne(ctx, e)
	s.deliver(ctx, e)
	return e, nil
}

// refundOne gives back the quota reserved for e on the day it was
// accepted.
func (s *Service) refundOne(ctx context.Context, e store.Execution) {
	if err := s.store.RefundExecution(ctx, e.Tenant, e.CreatedAt.UTC().Format(time.DateOnly)); err != nil {
		s.log.Error("refunding quota", "execution_id", e.ID, "error", err)
	}
}

// deliver queues the webhook delivery of a final execution that has one.
func (s *Service) deliver(ctx context.Context, e store.Execution) {
	if e.Webhook == nil || e.Webhook.State != store.WebhookPending || s.opts.Queue == nil {
		return
	}
	if err := s.opts.Queue.EnqueueDelivery(context.WithoutCancel(ctx), queue.DeliverArgs{Tenant: e.Tenant, ExecutionID: e.ID}); err != nil {
		s.log.Error("queueing a webhook delivery", "execution_id", e.ID, "error", err)
	}
}

// DeliverWebhook makes one attempt at an execution's webhook for the
// queue, and records its outcome. An error means: try again later (with
// backoff); the delivery is failed once RetryFor has passed since first.
func (s *Service) DeliverWebhook(ctx context.Context, tenant, id string, attempt int, first time.Time) error {
	e, err := s.store.Execution(ctx, tenant, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if e.Webhook == nil || e.Webhook.State != store.WebhookPending || !store.Final(e.Status) || s.opts.Webhooks == nil {
		return nil
	}
	secret, _, err := s.store.WebhookSecret(ctx, tenant, newWebhookSecret, s.now().UTC())
	if err != nil {
		return err
	}
	body, err := s.opts.Render(e)
	if err != nil {
		return queue.Permanent(err)
	}
	status, derr := s.opts.Webhooks.Client.Deliver(ctx, e.Webhook.URL, e.Webhook.DeliveryID, []byte(secret), body)
	w := *e.Webhook
	w.Attempts, w.LastStatus, w.LastError = attempt, status, ""
	retryFor := s.opts.Webhooks.RetryFor
	if retryFor <= 0 {
		retryFor = 24 * time.Hour
	}
	switch {
	case derr == nil:
		w.State = store.WebhookDelivered
	case errors.Is(derr, webhook.ErrInvalidURL) || s.now().Sub(first) >= retryFor:
		w.State, w.LastError = store.WebhookFailed, derr.Error()
	default:
		w.LastError = derr.Error()
	}
	if err := s.store.UpdateWebhook(context.WithoutCancel(ctx), tenant, id, w); err != nil {
		return err
	}
	switch w.State {
	case store.WebhookDelivered:
		return nil
	case store.WebhookFailed:
		return queue.Permanent(derr)
	}
	return derr
}

// newWebhookSecret makes a tenant's signing secret: whsec_ and 64 hex.
func newWebhookSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + hex.EncodeToString(b)
}

// WebhookSecret returns the caller's signing secret, made on first use.
func (s *Service) WebhookSecret(ctx context.Context, c Caller) (string, time.Time, error) {
	secret, created, err := s.store.WebhookSecret(ctx, c.Key.Tenant, newWebhookSecret, s.now().UTC())
	if err != nil {
		return "", time.Time{}, Internal(err)
	}
	return secret, created, nil
}

// RotateWebhookSecret replaces the caller's signing secret; deliveries
// from now on are signed with the new one.
func (s *Service) RotateWebhookSecret(ctx context.Context, c Caller) (string, time.Time, error) {
	secret, at := newWebhookSecret(), s.now().UTC()
	if err := s.store.RotateWebhookSecret(ctx, c.Key.Tenant, secret, at); err != nil {
		return "", time.Time{}, Internal(err)
	}
	return secret, at, nil
}

// statusError is the final status of an execution the platform failed.
const statusError = string(engine.StatusError)
