// Package postgres is the Store for several API nodes sharing one PostgreSQL
// database, through pgx.
//
// Every check-and-update the API relies on across nodes is one statement
// or one transaction that PostgreSQL serializes on a row lock: quota and
// rate-window counters are INSERT ... ON CONFLICT DO UPDATE ... WHERE, key
// creation and rotation lock the tenant's row before counting its active
// keys, and an idempotency claim is an upsert that only takes over a stale
// record. Nothing is cached, so a revoked key fails on every node at once.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/migrations"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLock is the pg_advisory_xact_lock key that serializes
// migrations when several nodes start at once ("vertal" in ASCII).
const migrationLock int64 = 0x76657274616c

// claimAttempts bounds ClaimIdempotency's retry when the record it lost to
// is released before it can be read.
const claimAttempts = 10

var errPlanRequired = errors.New("a new tenant needs a plan")

// Store is the PostgreSQL store.Store.
type Store struct {
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) a pool to the database at url and applies the
// embedded migrations. The URL may carry pgxpool settings such as
// pool_max_conns.
func Open(ctx context.Context, url string) (store.Store, error) {
	s, err := open(ctx, url)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The parse error may quote the URL, password included.
		return nil, errors.New("postgres: open: invalid database URL")
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	s := &Store{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	ms, err := migrations.Load(sub)
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Held to commit: a second node starting now waits here, then finds
		// every version recorded.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    BIGINT PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		for _, m := range ms {
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`,
				m.Version).Scan(&done); err != nil {
				return err
			}
			if done {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`,
				m.Version, m.Name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	return nil
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.NewKey) (store.Key, error) {
	var out store.Key
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		out, err = insertKey(ctx, tx, k)
		return err
	})
	if err != nil {
		return store.Key{}, fmt.Errorf("postgres: create key: %w", err)
	}
	return out, nil
}

// RotateKey implements store.Store.
func (s *Store) RotateKey(ctx context.Context, oldKeyID string, k store.NewKey) (store.Key, error) {
	var out store.Key
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Lock the tenant first, as CreateKey does, so the two never wait
		// on each other in opposite orders.
		plan, err := lockTenant(ctx, tx, k)
		if err != nil {
			if errors.Is(err, errPlanRequired) {
				return store.ErrNotFound
			}
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE api_keys SET revoked_at = $1
			WHERE id = $2 AND tenant = $3 AND revoked_at IS NULL`, ts(k.CreatedAt), oldKeyID, k.Tenant)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.ErrNotFound
		}
		out, err = insertLockedKey(ctx, tx, k, plan)
		return err
	})
	if err != nil {
		return store.Key{}, fmt.Errorf("postgres: rotate key: %w", err)
	}
	return out, nil
}

// lockTenant creates or updates the tenant row and holds its lock until the
// transaction ends, which serializes key changes of one tenant across
// nodes. It returns the tenant's plan.
func lockTenant(ctx context.Context, tx pgx.Tx, k store.NewKey) (string, error) {
	var plan string
	if k.Plan == "" {
		err := tx.QueryRow(ctx, `SELECT plan FROM tenants WHERE id = $1 FOR UPDATE`, k.Tenant).Scan(&plan)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", errPlanRequired
		}
		return plan, err
	}
	// A key creates its tenant on k.Plan but never changes the plan of an
	// existing one: only SetPlan does (issue 13). The no-op update takes
	// the row lock all the same.
	err := tx.QueryRow(ctx, `INSERT INTO tenants (id, plan, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET id = excluded.id
		RETURNING plan`, k.Tenant, k.Plan, ts(k.CreatedAt)).Scan(&plan)
	return plan, err
}

func insertKey(ctx context.Context, tx pgx.Tx, k store.NewKey) (store.Key, error) {
	plan, err := lockTenant(ctx, tx, k)
	if err != nil {
		return store.Key{}, err
	}
	return insertLockedKey(ctx, tx, k, plan)
}

// insertLockedKey counts the tenant's active keys and inserts k; the caller
// holds the tenant's row lock, so the count stays true until commit.
func insertLockedKey(ctx context.Context, tx pgx.Tx, k store.NewKey, plan string) (store.Key, error) {
	var active int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE tenant = $1 AND revoked_at IS NULL`,
		k.Tenant).Scan(&active); err != nil {
		return store.Key{}, err
	}
	if active >= store.MaxActiveKeys {
		return store.Key{}, store.ErrTooManyKeys
	}
	if _, err := tx.Exec(ctx, `INSERT INTO api_keys (id, tenant, hash, created_at) VALUES ($1, $2, $3, $4)`,
		k.ID, k.Tenant, k.Hash[:], ts(k.CreatedAt)); err != nil {
		return store.Key{}, err
	}
	return store.Key{ID: k.ID, Tenant: k.Tenant, Plan: plan, CreatedAt: ts(k.CreatedAt)}, nil
}

const keyColumns = `k.id, k.tenant, t.plan, k.created_at, k.revoked_at, k.last_used_at, t.disabled`

func scanKey(row pgx.Row) (store.Key, error) {
	var (
		k             store.Key
		revoked, used *time.Time
	)
	if err := row.Scan(&k.ID, &k.Tenant, &k.Plan, &k.CreatedAt, &revoked, &used, &k.TenantDisabled); err != nil {
		return store.Key{}, err
	}
	k.CreatedAt = k.CreatedAt.UTC()
	k.RevokedAt = optTime(revoked)
	k.LastUsedAt = optTime(used)
	return k, nil
}

// optTime reads a nullable time column; NULL is the zero time.
func optTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// KeyByHash implements store.Store.
func (s *Store) KeyByHash(ctx context.Context, hash [32]byte) (store.Key, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyColumns+`
		FROM api_keys k JOIN tenants t ON t.id = k.tenant
		WHERE k.hash = $1 AND k.revoked_at IS NULL`, hash[:]))
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Key{}, fmt.Errorf("postgres: key by hash: %w", err)
	}
	return k, nil
}

// RevokeKey implements store.Store.
func (s *Store) RevokeKey(ctx context.Context, keyID string, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL`,
		ts(at), keyID)
	if err == nil && tag.RowsAffected() == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("postgres: revoke key: %w", err)
	}
	return nil
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]store.Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+`
		FROM api_keys k JOIN tenants t ON t.id = k.tenant
		WHERE $1 = '' OR k.tenant = $1
		ORDER BY k.created_at, k.id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("postgres: list keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Key, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("postgres: list keys: %w", err)
	}
	return keys, nil
}

// ReserveExecution implements store.Store.
func (s *Store) ReserveExecution(ctx context.Context, tenant, day string, limit int64) (int64, error) {
	if err := checkDay(day); err != nil {
		return 0, fmt.Errorf("postgres: reserve execution: %w", err)
	}
	if limit < 1 {
		return 0, fmt.Errorf("postgres: reserve execution: %w", store.ErrQuotaExceeded)
	}
	// Concurrent callers queue on the row lock and each re-checks the
	// WHERE against the committed count, so no node can overshoot.
	var used int64
	err := s.pool.QueryRow(ctx, `INSERT INTO usage_days (tenant, day, executions) VALUES ($1, $2, 1)
		ON CONFLICT (tenant, day) DO UPDATE SET executions = usage_days.executions + 1
		WHERE usage_days.executions < $3
		RETURNING executions`, tenant, day, limit).Scan(&used)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrQuotaExceeded
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: reserve execution: %w", err)
	}
	return used, nil
}

// RefundExecution implements store.Store.
func (s *Store) RefundExecution(ctx context.Context, tenant, day string) error {
	if err := checkDay(day); err != nil {
		return fmt.Errorf("postgres: refund execution: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE usage_days SET executions = executions - 1
		WHERE tenant = $1 AND day = $2 AND executions > 0`, tenant, day); err != nil {
		return fmt.Errorf("postgres: refund execution: %w", err)
	}
	return nil
}

// ReserveExecutions implements store.Store. Like ReserveExecution it is
// one statement that waits on the row lock and re-checks the WHERE against
// the committed count: a batch is counted whole or not at all.
func (s *Store) ReserveExecutions(ctx context.Context, tenant, day string, n, limit int64) (int64, error) {
	if err := checkDay(day); err != nil {
		return 0, fmt.Errorf("postgres: reserve executions: %w", err)
	}
	if n < 1 {
		return 0, fmt.Errorf("postgres: reserve executions: invalid count %d", n)
	}
	if n > limit {
		return 0, fmt.Errorf("postgres: reserve executions: %w", store.ErrQuotaExceeded)
	}
	var used int64
	err := s.pool.QueryRow(ctx, `INSERT INTO usage_days (tenant, day, executions) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, day) DO UPDATE SET executions = usage_days.executions + $3
		WHERE usage_days.executions <= $4 - $3
		RETURNING executions`, tenant, day, n, limit).Scan(&used)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrQuotaExceeded
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: reserve executions: %w", err)
	}
	return used, nil
}

// RefundExecutions implements store.Store.
func (s *Store) RefundExecutions(ctx context.Context, tenant, day string, n int64) error {
	if err := checkDay(day); err != nil {
		return fmt.Errorf("postgres: refund executions: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("postgres: refund executions: invalid count %d", n)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE usage_days SET executions = GREATEST(executions - $3, 0)
		WHERE tenant = $1 AND day = $2`, tenant, day, n); err != nil {
		return fmt.Errorf("postgres: refund executions: %w", err)
	}
	return nil
}

// CountRequest implements store.Store.
func (s *Store) CountRequest(ctx context.Context, tenant string, window time.Time) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `INSERT INTO rate_windows (tenant, window_start, requests) VALUES ($1, $2, 1)
		ON CONFLICT (tenant, window_start) DO UPDATE SET requests = rate_windows.requests + 1
		RETURNING requests`, tenant, ts(window)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("postgres: count request: %w", err)
	}
	return n, nil
}

// executionArgs are sqlstore.ExecutionArgs with this store's times.
func executionArgs(e store.Execution) ([]any, error) {
	return sqlstore.ExecutionArgs(e, func(t time.Time) any { return ts(t) })
}

func scanExecution(row pgx.Row) (store.Execution, error) {
	var (
		e                 store.Execution
		stdout, stderr    []byte
		files             []byte
		started, finished *time.Time
		webhookURL        *string
		w                 store.Webhook
	)
	err := row.Scan(&e.ID, &e.Tenant, &e.KeyID, &e.RequestID, &e.Language, &e.Status, &stdout, &stderr,
		&e.ExitCode, &e.DurationMS, &e.Truncated, &e.SandboxSeconds, &e.CPUSeconds, &e.PeakMemoryBytes,
		&e.CreatedAt, &started, &finished, &e.CancelRequested, &e.Purged, &files, &e.FilesTruncated,
		&e.Async, &e.Request, &e.Owner, &e.Reason, &webhookURL, &w.DeliveryID, &w.State,
		&w.Attempts, &w.LastStatus, &w.LastError, &e.Image, &e.ImageVersion)
	if errors.Is(err, pgx.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Execution{}, err
	}
	e.Stdout, e.Stderr = string(stdout), string(stderr)
	if e.Files, err = store.UnmarshalFiles(files); err != nil {
		return store.Execution{}, err
	}
	e.CreatedAt = e.CreatedAt.UTC()
	if started != nil {
		e.StartedAt = started.UTC()
	}
	if finished != nil {
		e.FinishedAt = finished.UTC()
	}
	if webhookURL != nil {
		w.URL = *webhookURL
		e.Webhook = &w
	}
	return e, nil
}

// queryExecutions runs a SELECT of sqlstore.ExecutionColumns.
func (s *Store) queryExecutions(ctx context.Context, query string, args ...any) ([]store.Execution, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Execution, error) { return scanExecution(r) })
}

// lockExecution locks execution id's row for the transaction, checks that
// it belongs to tenant and has not finished, and returns its status. A
// second transaction waits on the lock and then reads the first one's
// committed row, so check-and-update steps on one execution never
// interleave, across nodes too.
func lockExecution(ctx context.Context, tx pgx.Tx, tenant, id string) (string, error) {
	var owner, status string
	err := tx.QueryRow(ctx, `SELECT tenant, status FROM executions WHERE id = $1 FOR UPDATE`, id).Scan(&owner, &status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", store.ErrNotFound
	case err != nil:
		return "", err
	case owner != tenant:
		return "", store.ErrNotFound
	case store.Final(status):
		return status, store.ErrFinished
	}
	return status, nil
}

// createExecution inserts an accepted execution in tx.
func createExecution(ctx context.Context, tx pgx.Tx, e store.Execution) error {
	if store.Final(e.Status) {
		return fmt.Errorf("execution %s: status %q is final", e.ID, e.Status)
	}
	e.FinishedAt = time.Time{}
	args, err := executionArgs(e)
	if err != nil {
		return err
	}
	if _, err = tx.Exec(ctx, sqlstore.InsertExecution, args...); err != nil {
		return err
	}
	if e.IdempotencyKey != "" {
		_, err = tx.Exec(ctx, sqlstore.PendIdempotency, e.ID, e.Tenant, e.IdempotencyKey)
	}
	return err
}

// CreateExecution implements store.Store.
func (s *Store) CreateExecution(ctx context.Context, e store.Execution) error {
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return createExecution(ctx, tx, e) }); err != nil {
		return fmt.Errorf("postgres: create execution: %w", err)
	}
	return nil
}

// CreateExecutions implements store.Store.
func (s *Store) CreateExecutions(ctx context.Context, es []store.Execution) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, e := range es {
			if err := createExecution(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: create executions: %w", err)
	}
	return nil
}

// StartExecution implements store.Store.
func (s *Store) StartExecution(ctx context.Context, tenant, id string, at time.Time) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := lockExecution(ctx, tx, tenant, id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE executions SET status = $1, started_at = $2 WHERE id = $3`, store.StatusRunning, ts(at), id)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: start execution: %w", err)
	}
	return nil
}

// ClaimExecution implements store.Store. Claimers on several nodes queue
// on the row lock; the first moves the row to running and every later one
// reads running and gets ErrNotQueued.
func (s *Store) ClaimExecution(ctx context.Context, tenant, id, owner string, at time.Time) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		status, err := lockExecution(ctx, tx, tenant, id)
		if err != nil {
			return err
		}
		if status != store.StatusQueued {
			return store.ErrNotQueued
		}
		_, err = tx.Exec(ctx, `UPDATE executions SET status = $1, started_at = $2, owner = $3 WHERE id = $4`,
			store.StatusRunning, ts(at), owner, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: claim execution: %w", err)
	}
	return nil
}

// AbortExecution implements store.Store.
func (s *Store) AbortExecution(ctx context.Context, tenant, id, status, reason string, from []string, at time.Time) (store.Execution, error) {
	if !store.Final(status) {
		return store.Execution{}, fmt.Errorf("postgres: abort execution: status %q is not final", status)
	}
	var e store.Execution
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		current, err := lockExecution(ctx, tx, tenant, id)
		if err == nil && !slices.Contains(from, current) {
			err = store.ErrNotQueued
		}
		if err == nil {
			_, err = tx.Exec(ctx, `UPDATE executions SET status = $1, reason = $2, finished_at = $3 WHERE id = $4`,
				status, reason, ts(at), id)
		}
		if err == nil {
			_, err = tx.Exec(ctx, sqlstore.SettleIdempotency, id, tenant)
		}
		if err != nil && !errors.Is(err, store.ErrFinished) && !errors.Is(err, store.ErrNotQueued) {
			return err
		}
		var rerr error
		e, rerr = scanExecution(tx.QueryRow(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions WHERE id = $1`, id))
		if rerr != nil {
			return rerr
		}
		return err // a refusal rolls back a transaction that only read
	})
	if errors.Is(err, store.ErrFinished) || errors.Is(err, store.ErrNotQueued) {
		return e, fmt.Errorf("postgres: abort execution: %w", err)
	}
	if err != nil {
		return store.Execution{}, fmt.Errorf("postgres: abort execution: %w", err)
	}
	return e, nil
}

// OwnedExecutions implements store.Store.
func (s *Store) OwnedExecutions(ctx context.Context, owner string) ([]store.Execution, error) {
	es, err := s.queryExecutions(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions
		WHERE owner = $1 AND status IN ('queued', 'running') ORDER BY id`, owner)
	if err != nil {
		return nil, fmt.Errorf("postgres: owned executions: %w", err)
	}
	return es, nil
}

// QueuedAsync implements store.Store.
func (s *Store) QueuedAsync(ctx context.Context, before time.Time, limit int) ([]store.Execution, error) {
	if limit < 1 {
		return nil, nil
	}
	es, err := s.queryExecutions(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions
		WHERE async AND status = 'queued' AND created_at < $1 ORDER BY created_at, id LIMIT $2`, ts(before), limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: queued async: %w", err)
	}
	return es, nil
}

// CountQueuedAsync implements store.Store.
func (s *Store) CountQueuedAsync(ctx context.Context, tenant string) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM executions WHERE tenant = $1 AND async AND status = 'queued'`, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("postgres: count queued async: %w", err)
	}
	return n, nil
}

// UpdateWebhook implements store.Store.
func (s *Store) UpdateWebhook(ctx context.Context, tenant, id string, w store.Webhook) error {
	args := append(sqlstore.WebhookArgs(&w), id, tenant)
	tag, err := s.pool.Exec(ctx, sqlstore.UpdateWebhook, args...)
	if err == nil && tag.RowsAffected() == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("postgres: update webhook: %w", err)
	}
	return nil
}

// SaveExecution implements store.Store.
func (s *Store) SaveExecution(ctx context.Context, e store.Execution) error {
	if !store.Final(e.Status) {
		return fmt.Errorf("postgres: save execution: status %q is not final", e.Status)
	}
	args, err := executionArgs(e)
	if err != nil {
		return fmt.Errorf("postgres: save execution: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := lockExecution(ctx, tx, e.Tenant, e.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			// An INSERT: a row of another tenant with this id makes it fail.
			_, err = tx.Exec(ctx, sqlstore.InsertExecution, args...)
		case errors.Is(err, store.ErrFinished):
			err = fmt.Errorf("execution %s exists", e.ID)
		case err == nil:
			_, err = tx.Exec(ctx, sqlstore.UpdateExecution, args...)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO usage_days (tenant, day, sandbox_seconds, cpu_seconds) VALUES ($1, $2, $3, $4)
			ON CONFLICT (tenant, day) DO UPDATE SET
				sandbox_seconds = usage_days.sandbox_seconds + excluded.sandbox_seconds,
				cpu_seconds = usage_days.cpu_seconds + excluded.cpu_seconds`,
			e.Tenant, e.CreatedAt.UTC().Format(time.DateOnly), e.SandboxSeconds, e.CPUSeconds)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: save execution: %w", err)
	}
	return nil
}

// DeleteExecution implements store.Store.
func (s *Store) DeleteExecution(ctx context.Context, tenant, id string) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := lockExecution(ctx, tx, tenant, id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM executions WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: delete execution: %w", err)
	}
	return nil
}

// RequestCancel implements store.Store.
func (s *Store) RequestCancel(ctx context.Context, tenant, id string) (store.Execution, error) {
	var e store.Execution
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := lockExecution(ctx, tx, tenant, id)
		if err == nil {
			_, err = tx.Exec(ctx, `UPDATE executions SET cancel_requested = true WHERE id = $1`, id)
		}
		if err != nil && !errors.Is(err, store.ErrFinished) {
			return err
		}
		var rerr error
		e, rerr = scanExecution(tx.QueryRow(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions WHERE id = $1`, id))
		if rerr != nil {
			return rerr
		}
		return err // ErrFinished rolls back a transaction that only read
	})
	if errors.Is(err, store.ErrFinished) {
		return e, fmt.Errorf("postgres: request cancel: %w", err)
	}
	if err != nil {
		return store.Execution{}, fmt.Errorf("postgres: request cancel: %w", err)
	}
	return e, nil
}

// Execution implements store.Store.
func (s *Store) Execution(ctx context.Context, tenant, id string) (store.Execution, error) {
	e, err := scanExecution(s.pool.QueryRow(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions WHERE id = $1 AND tenant = $2`, id, tenant))
	if err != nil {
		return store.Execution{}, fmt.Errorf("postgres: execution: %w", err)
	}
	return e, nil
}

// Usage implements store.Store.
func (s *Store) Usage(ctx context.Context, tenant, day string) (store.DayUsage, error) {
	if err := checkDay(day); err != nil {
		return store.DayUsage{}, fmt.Errorf("postgres: usage: %w", err)
	}
	var u store.DayUsage
	err := s.pool.QueryRow(ctx, `SELECT executions, sandbox_seconds, cpu_seconds
		FROM usage_days WHERE tenant = $1 AND day = $2`, tenant, day).Scan(&u.Executions, &u.SandboxSeconds, &u.CPUSeconds)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.DayUsage{}, nil
	}
	if err != nil {
		return store.DayUsage{}, fmt.Errorf("postgres: usage: %w", err)
	}
	return u, nil
}

// Purge implements store.Store.
func (s *Store) Purge(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		t := ts(before)
		tag, err := tx.Exec(ctx, `UPDATE executions SET stdout = '', stderr = '', files = NULL, request = NULL, purged = true
			WHERE created_at < $1 AND NOT purged`, t)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		if _, err := tx.Exec(ctx, `DELETE FROM idempotency WHERE created_at < $1`, t); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM rate_windows WHERE window_start < $1`, t)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("postgres: purge: %w", err)
	}
	return n, nil
}

// ClaimIdempotency implements store.Store.
func (s *Store) ClaimIdempotency(ctx context.Context, tenant, key, bodyHash string, now, staleBefore, abandonedBefore time.Time) (store.Idempotency, bool, error) {
	for range claimAttempts {
		// Insert, or take over a stale or abandoned record; a live record
		// is left alone and the statement returns nothing. Parallel
		// claimers queue on the row lock, and the WHERE is re-checked
		// against the winner's row.
		rec, err := scanIdempotency(s.pool.QueryRow(ctx, `INSERT INTO idempotency (tenant, idem_key, body_hash, execution_id, created_at)
			VALUES ($1, $2, $3, '', $4)
			ON CONFLICT (tenant, idem_key) DO UPDATE SET
				body_hash = excluded.body_hash, execution_id = '', pending_id = '', created_at = excluded.created_at
			WHERE idempotency.created_at < $5 OR (idempotency.execution_id = '' AND idempotency.created_at < $6)
			RETURNING tenant, idem_key, body_hash, execution_id, created_at`,
			tenant, key, bodyHash, ts(now), ts(staleBefore), ts(abandonedBefore)))
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return store.Idempotency{}, false, fmt.Errorf("postgres: claim idempotency: %w", err)
		}
		rec, err = scanIdempotency(s.pool.QueryRow(ctx, `SELECT tenant, idem_key, body_hash, execution_id, created_at
			FROM idempotency WHERE tenant = $1 AND idem_key = $2`, tenant, key))
		if err == nil {
			return rec, false, nil
		}
		// ErrNoRows: the holder released it in between; claim again.
		if !errors.Is(err, pgx.ErrNoRows) {
			return store.Idempotency{}, false, fmt.Errorf("postgres: claim idempotency: %w", err)
		}
	}
	return store.Idempotency{}, false, errors.New("postgres: claim idempotency: record keeps changing, try again")
}

func scanIdempotency(row pgx.Row) (store.Idempotency, error) {
	var rec store.Idempotency
	if err := row.Scan(&rec.Tenant, &rec.Key, &rec.BodyHash, &rec.ExecutionID, &rec.CreatedAt); err != nil {
		return store.Idempotency{}, err
	}
	rec.CreatedAt = rec.CreatedAt.UTC()
	return rec, nil
}

// CompleteIdempotency implements store.Store.
func (s *Store) CompleteIdempotency(ctx context.Context, tenant, key, executionID string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE idempotency SET execution_id = $1 WHERE tenant = $2 AND idem_key = $3`,
		executionID, tenant, key)
	if err == nil && tag.RowsAffected() == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("postgres: complete idempotency: %w", err)
	}
	return nil
}

// ReleaseIdempotency implements store.Store.
func (s *Store) ReleaseIdempotency(ctx context.Context, tenant, key string) error {
	// A completed record is never dropped: its result must keep replaying.
	if _, err := s.pool.Exec(ctx, `DELETE FROM idempotency WHERE tenant = $1 AND idem_key = $2 AND execution_id = ''`,
		tenant, key); err != nil {
		return fmt.Errorf("postgres: release idempotency: %w", err)
	}
	return nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, node string, at time.Time) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO nodes (id, seen_at) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at`, node, ts(at)); err != nil {
		return fmt.Errorf("postgres: heartbeat: %w", err)
	}
	return nil
}

// StaleNodes implements store.Store.
func (s *Store) StaleNodes(ctx context.Context, before time.Time) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM nodes WHERE seen_at < $1 ORDER BY id`, ts(before))
	if err != nil {
		return nil, fmt.Errorf("postgres: stale nodes: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("postgres: stale nodes: %w", err)
	}
	return nodes, nil
}

// ForgetNode implements store.Store.
func (s *Store) ForgetNode(ctx context.Context, node string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM nodes WHERE id = $1`, node); err != nil {
		return fmt.Errorf("postgres: forget node: %w", err)
	}
	return nil
}

// WebhookSecret implements store.Store. create is called only when no
// secret is found; of nodes inserting at once the first insert wins (ON
// CONFLICT DO NOTHING waits for it to commit) and all read it back.
func (s *Store) WebhookSecret(ctx context.Context, tenant string, create func() string, at time.Time) (string, time.Time, error) {
	const read = `SELECT secret, created_at FROM webhook_secrets WHERE tenant = $1`
	var (
		secret  string
		created time.Time
	)
	err := s.pool.QueryRow(ctx, read, tenant).Scan(&secret, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = s.pool.Exec(ctx, `INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (tenant) DO NOTHING`, tenant, create(), ts(at))
		if err == nil {
			err = s.pool.QueryRow(ctx, read, tenant).Scan(&secret, &created)
		}
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("postgres: webhook secret: %w", err)
	}
	return secret, created.UTC(), nil
}

// RotateWebhookSecret implements store.Store.
func (s *Store) RotateWebhookSecret(ctx context.Context, tenant, secret string, at time.Time) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (tenant) DO UPDATE SET secret = excluded.secret, created_at = excluded.created_at`,
		tenant, secret, ts(at)); err != nil {
		return fmt.Errorf("postgres: rotate webhook secret: %w", err)
	}
	return nil
}

// ts is a time as PostgreSQL keeps it: microseconds, in UTC. Truncating
// here (PostgreSQL would round) makes both stores return the same instant.
func ts(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

func checkDay(day string) error {
	if t, err := time.Parse(time.DateOnly, day); err != nil || t.Format(time.DateOnly) != day {
		return fmt.Errorf("invalid day %q", day)
	}
	return nil
}
