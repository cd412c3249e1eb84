// Package queue is the durable work queue that async executions and
// webhook deliveries go through, shared by every node on one database.
//
// It is River (github.com/riverqueue/river), a job queue made for Go over
// PostgreSQL that also has a SQLite driver, rather than a queue of our own:
// it gives durable jobs, exactly one worker per job across processes (row
// locks and SKIP LOCKED on PostgreSQL, the single writer on SQLite), the
// rescue of jobs whose worker died, unique jobs, retries with a policy of
// ours, snoozing and graceful shutdown. On SQLite it shares the store's
// one-connection writer pool, which is what River's driver asks for; on
// PostgreSQL the store's pgx pool. River's tables live in the same
// database as ours and are migrated at start-up.
//
// The queue knows nothing of executions: it is opened first, so that the
// execution service can queue work, and started with Handlers that the
// service provides; the jobs carry only a tenant and an execution id. What an
// execution is, and whether it already ran, is in the store.
package queue

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/kuboprotocol/vertal2kubo/internal/logx"
)

// Queue names.
const (
	QueueExecutions = "executions"
	QueueWebhooks   = "webhooks"
)

// RunArgs is the job that runs one async execution.
type RunArgs struct {
	Tenant      string `json:"tenant"`
	ExecutionID string `json:"execution_id"`
	// Backlog is how many of Tenant's executions were queued ahead of
	// this one when it was accepted; it sets the job's priority (see
	// Priority). It is not part of the job's identity.
	Backlog int64 `json:"-"`
}

// Priority is the River priority (1 first, 4 last) of a run job with
// backlog executions of its tenant queued ahead of it. River works the
// lowest number first and, within one, the oldest: so a tenant's first
// queued execution goes before everyone's second, its second before
// everyone's third, and so on up to the fourth, after which one tenant's
// long backlog is worked in order. A tenant with one job therefore waits
// for at most one job of each other tenant, not for their batches.
func Priority(backlog int64) int { return 1 + int(min(max(backlog, 0), 3)) }

// Kind names the job in River's tables.
func (RunArgs) Kind() string { return "vertal_execution" }

// InsertOpts: one job per execution, ever (a second insert for the same
// id, as the start-up sweep makes, is dropped while the first exists).
func (RunArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueExecutions, UniqueOpts: river.UniqueOpts{ByArgs: true}, MaxAttempts: 25}
}

// DeliverArgs is the job that delivers one execution's webhook.
type DeliverArgs struct {
	Tenant      string `json:"tenant"`
	ExecutionID string `json:"execution_id"`
}

// Kind names the job in River's tables.
func (DeliverArgs) Kind() string { return "vertal_webhook" }

// InsertOpts: one delivery per execution; its attempts are River's
// retries, bounded in time by the handler (Options.RetryFor), not count.
func (DeliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueWebhooks, UniqueOpts: river.UniqueOpts{ByArgs: true}, MaxAttempts: 10000}
}

// ErrBusy, returned by Handlers.Run, means no sandbox slot was free: the
// job is snoozed and tried again shortly, using no attempt of its own.
var ErrBusy = errors.New("queue: no sandbox slot free")

// Permanent wraps an error after which a job is not retried.
func Permanent(err error) error { return river.JobCancel(err) }

// Handlers are what the jobs do; the execution service provides them.
type Handlers struct {
	// Run runs one async execution. It returns nil once the execution is
	// final (or was settled elsewhere), ErrBusy to be tried again shortly,
	// and any other error to be retried with backoff.
	Run func(ctx context.Context, tenant, id string) error
	// Deliver makes one attempt at an execution's webhook; first is when
	// the delivery job was created, attempt counts from 1. An error is
	// retried (Permanent(err) is not).
	Deliver func(ctx context.Context, tenant, id string, attempt int, first time.Time) error
}

// Options configure a Queue. Zero values take the defaults.
type Options struct {
	// Workers is how many async executions this node runs at once
	// (default 1); WebhookWorkers how many deliveries (default 4).
	Workers        int
	WebhookWorkers int
	// PollInterval is how often an idle node looks for jobs (default
	// 200 ms on PostgreSQL, whose nodes are also woken by LISTEN/NOTIFY;
	// 1 s on SQLite, where every insert is this node's own and wakes it
	// at once, so the poll only finds retries and snoozes come due).
	PollInterval time.Duration
	// RescueAfter is how long a job may stay running before River hands
	// it to another node (or to this node started again), its worker
	// presumed dead (default 10 min). It must exceed the longest
	// execution and the webhook timeout; a job rescued from a live worker
	// is harmless (the run is claimed once, a delivery is repeated with
	// the same delivery id).
	RescueAfter time.Duration
	// RetryBase and RetryCap shape a webhook's backoff: base·2^(n-1)
	// capped, with jitter (defaults 10 s, 1 h).
	RetryBase, RetryCap time.Duration
	// NodeID names this node in River's tables.
	NodeID string
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.WebhookWorkers <= 0 {
		o.WebhookWorkers = 4
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 200 * time.Millisecond
	}
	if o.RescueAfter <= 0 {
		o.RescueAfter = 10 * time.Minute
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 10 * time.Second
	}
	if o.RetryCap <= 0 {
		o.RetryCap = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// River's info lines (each migration applied, "poll only mode", the
	// client started and stopped) are its bookkeeping, and on a first
	// start they came before the server's banner.
	o.Logger = slog.New(logx.DemoteInfo(o.Logger.Handler()))
	return o
}

// Queue is a started or startable River client. It queues jobs once
// open; its workers work them once started.
type Queue struct {
	insertMany func(ctx context.Context, params []river.InsertManyParams) error
	start      func(ctx context.Context) error
	stop       func(ctx context.Context) error
	h          *Handlers // what the workers call; set by Start
}

// OpenSQLite returns a Queue on the SQLite store's writer pool (one
// connection), migrating River's tables first.
func OpenSQLite(ctx context.Context, db *sql.DB, o Options) (*Queue, error) {
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second // see Options.PollInterval
	}
	// Two processes on one file (a restart overlapping the old one's exit)
	// may migrate at once; River's migrations run in several transactions
	// and SQLite has no lock to hold across them, so the one that loses
	// tries again and then finds the versions recorded.
	migrate := func(ctx context.Context, m *rivermigrate.Migrator[*sql.Tx]) error {
		var err error
		for try := range 5 {
			if _, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil); err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(try+1) * 100 * time.Millisecond):
			}
		}
		return err
	}
	return open(ctx, sqliteDriver{riversqlite.New(db)}, migrate, o)
}

// sqliteDriver is River's SQLite driver without its emulated LISTEN and
// NOTIFY. A SQLite database has one server, so no other node's inserts
// need hearing about; without a listener River wakes its own producers
// on every insert it makes (as for any driver without one), where the
// emulation wrote a notification row per insert and polled for them every
// 50 ms, half of an idle server's CPU (perf, issue 15). Jobs that become
// available later (retries, snoozes) are found by the fetch poll, as
// before.
type sqliteDriver struct{ *riversqlite.Driver }

func (sqliteDriver) SupportsListener() bool     { return false }
func (sqliteDriver) SupportsListenNotify() bool { return false }

// OpenPostgres returns a Queue on the PostgreSQL store's pool, migrating
// River's tables first.
func OpenPostgres(ctx context.Context, pool *pgxpool.Pool, o Options) (*Queue, error) {
	// Nodes starting at once would otherwise migrate side by side and
	// deadlock. River's migrations cannot share one transaction (a new
	// enum value is used in the next), so the lock is a session's, held
	// on a connection of its own while River migrates on the others.
	migrate := func(ctx context.Context, m *rivermigrate.Migrator[pgx.Tx]) error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
			return err
		}
		defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrationLock)
		_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
		return err
	}
	return open(ctx, riverpgxv5.New(pool), migrate, o)
}

// migrationLock is the pg_advisory_lock key that serializes River's
// migrations across nodes ("river" in ASCII; the store's is "vertal").
const migrationLock int64 = 0x7269766572

func open[TTx any](ctx context.Context, driver riverdriver.Driver[TTx], migrate func(context.Context, *rivermigrate.Migrator[TTx]) error, o Options) (*Queue, error) {
	o = o.withDefaults()
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	if err := migrate(ctx, migrator); err != nil {
		return nil, fmt.Errorf("queue: migrating River's tables: %w", err)
	}
	h := &Handlers{}
	workers := river.NewWorkers()
	river.AddWorker(workers, &runWorker{h: h})
	river.AddWorker(workers, &deliverWorker{h: h, base: o.RetryBase, cap: o.RetryCap,
		perTenant: max(1, o.WebhookWorkers/2), inFlight: map[string]int{}})
	c, err := river.NewClient(driver, &river.Config{
		ID:                   o.NodeID,
		Logger:               o.Logger,
		FetchPollInterval:    o.PollInterval,
		FetchCooldown:        min(o.PollInterval, 50*time.Millisecond),
		RescueStuckJobsAfter: o.RescueAfter,
		// River's rescuer hands back a stuck job only once its timeout has
		// passed, and never one without a timeout: so the timeout is the
		// rescue time. An execution is bounded by its own deadline and a
		// delivery by its HTTP timeout, both shorter; when River cancels a
		// job's context at the timeout, a running sandbox is not stopped
		// (it runs on a context of its own) and the job completes normally.
		JobTimeout: o.RescueAfter,
		Queues: map[string]river.QueueConfig{
			QueueExecutions: {MaxWorkers: o.Workers},
			QueueWebhooks:   {MaxWorkers: o.WebhookWorkers},
		},
		Workers: workers,
	})
	if err != nil {
		return nil, fmt.Errorf("queue: %w", err)
	}
	return &Queue{
		insertMany: func(ctx context.Context, params []river.InsertManyParams) error {
			_, err := c.InsertMany(ctx, params)
			return err
		},
		start: c.Start,
		stop:  c.Stop,
		h:     h,
	}, nil
}

// EnqueueRuns adds one run job per execution, all or none.
func (q *Queue) EnqueueRuns(ctx context.Context, jobs []RunArgs) error {
	params := make([]river.InsertManyParams, len(jobs))
	for i, j := range jobs {
		params[i] = river.InsertManyParams{Args: j, InsertOpts: &river.InsertOpts{Priority: Priority(j.Backlog)}}
	}
	if err := q.insertMany(ctx, params); err != nil {
		return fmt.Errorf("queue: enqueueing %d executions: %w", len(jobs), err)
	}
	return nil
}

// EnqueueDelivery adds the webhook delivery of one execution.
func (q *Queue) EnqueueDelivery(ctx context.Context, d DeliverArgs) error {
	if err := q.insertMany(ctx, []river.InsertManyParams{{Args: d}}); err != nil {
		return fmt.Errorf("queue: enqueueing a webhook delivery: %w", err)
	}
	return nil
}

// Start starts working jobs with h; Stop stops fetching new ones and
// waits for those running (until ctx ends).
func (q *Queue) Start(ctx context.Context, h Handlers) error {
	if h.Run == nil || h.Deliver == nil {
		return errors.New("queue: Handlers.Run and Handlers.Deliver are required")
	}
	*q.h = h // before River starts the workers that read it
	return q.start(ctx)
}

func (q *Queue) Stop(ctx context.Context) error { return q.stop(ctx) }

type runWorker struct {
	river.WorkerDefaults[RunArgs]
	h *Handlers
}

func (w *runWorker) Work(ctx context.Context, job *river.Job[RunArgs]) error {
	err := w.h.Run(ctx, job.Args.Tenant, job.Args.ExecutionID)
	if errors.Is(err, ErrBusy) {
		return river.JobSnooze(time.Second)
	}
	return err
}

type deliverWorker struct {
	river.WorkerDefaults[DeliverArgs]
	h         *Handlers
	base, cap time.Duration

	// perTenant bounds one tenant's deliveries in flight on this node
	// (half the webhook workers, at least one), so a tenant whose
	// receiver hangs or fails holds at most that many workers and the
	// others keep delivering. A job over the bound is snoozed, which
	// River does not count as an attempt; it comes back after the jobs
	// of other tenants that were waiting.
	perTenant int
	mu        sync.Mutex
	inFlight  map[string]int
}

// tenantSnooze is how long a delivery over its tenant's bound waits.
const tenantSnooze = 2 * time.Second

func (w *deliverWorker) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	tenant := job.Args.Tenant
	w.mu.Lock()
	if w.inFlight[tenant] >= w.perTenant {
		w.mu.Unlock()
		return river.JobSnooze(tenantSnooze)
	}
	w.inFlight[tenant]++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		if w.inFlight[tenant]--; w.inFlight[tenant] == 0 {
			delete(w.inFlight, tenant)
		}
		w.mu.Unlock()
	}()
	return w.h.Deliver(ctx, tenant, job.Args.ExecutionID, job.Attempt, job.CreatedAt)
}

// NextRetry is exponential backoff with jitter: base·2^(n-1), capped, then
// somewhere in its upper half, so receivers that failed together are not
// all retried at the same moment.
func (w *deliverWorker) NextRetry(job *river.Job[DeliverArgs]) time.Time {
	return time.Now().Add(Backoff(job.Attempt, w.base, w.cap))
}

// Backoff is the wait after the attempt-th failed attempt.
func Backoff(attempt int, base, cap time.Duration) time.Duration {
	d := base
	for i := 1; i < attempt && d < cap; i++ {
		d *= 2
	}
	d = min(d, cap)
	return d/2 + rand.N(d/2+1)
}
