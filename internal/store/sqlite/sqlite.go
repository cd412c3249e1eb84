// Package sqlite is the embedded Store: one SQLite file in WAL mode,
// through the pure-Go modernc.org/sqlite driver.
//
// Writes go through a pool of exactly one connection, so writers in this
// process queue in Go instead of failing with SQLITE_BUSY, and every
// read-modify-write (quota, rate window, key limit, idempotency claim) is
// serialized. Transactions start with BEGIN IMMEDIATE and a busy timeout,
// so another process on the same file (a `vertal create-key` next to a
// running server) waits for the write lock instead of failing. Reads use a
// separate read-only pool, which WAL lets run beside the writer.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/migrations"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// readers is the size of the read-only pool.
const readers = 4

// busyTimeout is how long a connection waits for another process's lock.
const busyTimeout = 10 * time.Second

var errPlanRequired = errors.New("a new tenant needs a plan")

// Store is the SQLite store.Store.
type Store struct {
	w  *sql.DB // one connection: all writes
	r  *sql.DB // read-only connections
	st prepared
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and applies the
// embedded migrations.
func Open(ctx context.Context, path string) (store.Store, error) {
	s, err := open(ctx, path)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, path string) (*Store, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("sqlite: open: invalid database path %q", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	// Create the file ourselves so it is private: it holds key hashes and
	// user output. SQLite gives the -wal and -shm files the same mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	f.Close()

	params := fmt.Sprintf("?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)",
		busyTimeout.Milliseconds())
	w, err := sql.Open("sqlite", path+params+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxIdleTime(0)
	w.SetConnMaxLifetime(0)

	r, err := sql.Open("sqlite", path+params+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)

	s := &Store{w: w, r: r}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close closes both pools.
func (s *Store) Close() error {
	return errors.Join(s.st.close(), s.r.Close(), s.w.Close())
}

func (s *Store) migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	ms, err := migrations.Load(sub)
	if err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	// One transaction under BEGIN IMMEDIATE: a second process opening the
	// same file at the same moment waits, then sees the versions applied.
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    INTEGER PRIMARY KEY,
			name       TEXT NOT NULL,
			applied_at INTEGER NOT NULL)`); err != nil {
			return err
		}
		for _, m := range ms {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = $1`, m.Version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
				m.Version, m.Name, time.Now().UnixMicro()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	return nil
}

// tx runs fn in a write transaction and commits it if fn returns nil.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.NewKey) (store.Key, error) {
	var out store.Key
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		out, err = insertKey(ctx, tx, k)
		return err
	})
	if err != nil {
		return store.Key{}, fmt.Errorf("sqlite: create key: %w", err)
	}
	return out, nil
}

// RotateKey implements store.Store.
func (s *Store) RotateKey(ctx context.Context, oldKeyID string, k store.NewKey) (store.Key, error) {
	var out store.Key
	err := s.tx(ctx, func(tx *sql.Tx) error {
		// The old key must be this tenant's and still active.
		res, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = $1
			WHERE id = $2 AND tenant = $3 AND revoked_at IS NULL`,
			micros(k.CreatedAt), oldKeyID, k.Tenant)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return store.ErrNotFound
		}
		out, err = insertKey(ctx, tx, k)
		return err
	})
	if err != nil {
		return store.Key{}, fmt.Errorf("sqlite: rotate key: %w", err)
	}
	return out, nil
}

// insertKey upserts the tenant, checks the active-key limit and inserts k.
// The caller's write transaction makes the count and the insert atomic.
func insertKey(ctx context.Context, tx *sql.Tx, k store.NewKey) (store.Key, error) {
	var plan string
	if k.Plan == "" {
		err := tx.QueryRowContext(ctx, `SELECT plan FROM tenants WHERE id = $1`, k.Tenant).Scan(&plan)
		if errors.Is(err, sql.ErrNoRows) {
			return store.Key{}, errPlanRequired
		}
		if err != nil {
			return store.Key{}, err
		}
	} else {
		// A key creates its tenant on k.Plan but never changes the plan
		// of an existing one: only SetPlan does (issue 13).
		if err := tx.QueryRowContext(ctx, `INSERT INTO tenants (id, plan, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO UPDATE SET id = excluded.id
			RETURNING plan`,
			k.Tenant, k.Plan, micros(k.CreatedAt)).Scan(&plan); err != nil {
			return store.Key{}, err
		}
	}
	var active int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM api_keys WHERE tenant = $1 AND revoked_at IS NULL`,
		k.Tenant).Scan(&active); err != nil {
		return store.Key{}, err
	}
	if active >= store.MaxActiveKeys {
		return store.Key{}, store.ErrTooManyKeys
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, tenant, hash, created_at) VALUES ($1, $2, $3, $4)`,
		k.ID, k.Tenant, k.Hash[:], micros(k.CreatedAt)); err != nil {
		return store.Key{}, err
	}
	return store.Key{ID: k.ID, Tenant: k.Tenant, Plan: plan, CreatedAt: fromMicros(micros(k.CreatedAt))}, nil
}

const keyColumns = `k.id, k.tenant, t.plan, k.created_at, k.revoked_at, k.last_used_at, t.disabled`

func scanKey(row interface{ Scan(...any) error }) (store.Key, error) {
	var (
		k             store.Key
		created       int64
		revoked, used sql.NullInt64
	)
	if err := row.Scan(&k.ID, &k.Tenant, &k.Plan, &created, &revoked, &used, &k.TenantDisabled); err != nil {
		return store.Key{}, err
	}
	k.CreatedAt = fromMicros(created)
	k.RevokedAt = optMicros(revoked)
	k.LastUsedAt = optMicros(used)
	return k, nil
}

// optMicros reads a nullable time column; NULL is the zero time.
func optMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMicros(v.Int64)
}

// KeyByHash implements store.Store.
func (s *Store) KeyByHash(ctx context.Context, hash [32]byte) (store.Key, error) {
	k, err := scanKey(s.st.keyByHash.QueryRowContext(ctx, hash[:]))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Key{}, fmt.Errorf("sqlite: key by hash: %w", err)
	}
	return k, nil
}

// RevokeKey implements store.Store.
func (s *Store) RevokeKey(ctx context.Context, keyID string, at time.Time) error {
	res, err := s.w.ExecContext(ctx, `UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL`,
		micros(at), keyID)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = store.ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("sqlite: revoke key: %w", err)
	}
	return nil
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]store.Key, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+keyColumns+`
		FROM api_keys k JOIN tenants t ON t.id = k.tenant
		WHERE $1 = '' OR k.tenant = $1
		ORDER BY k.created_at, k.id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("sqlite: list keys: %w", err)
	}
	defer rows.Close()
	var keys []store.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: list keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: list keys: %w", err)
	}
	return keys, nil
}

// ReserveExecution implements store.Store.
func (s *Store) ReserveExecution(ctx context.Context, tenant, day string, limit int64) (int64, error) {
	if err := checkDay(day); err != nil {
		return 0, fmt.Errorf("sqlite: reserve execution: %w", err)
	}
	if limit < 1 {
		return 0, fmt.Errorf("sqlite: reserve execution: %w", store.ErrQuotaExceeded)
	}
	var used int64
	err := s.st.reserve.QueryRowContext(ctx, tenant, day, limit).Scan(&used)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrQuotaExceeded
	}
	if err != nil {
		return 0, fmt.Errorf("sqlite: reserve execution: %w", err)
	}
	return used, nil
}

// RefundExecution implements store.Store.
func (s *Store) RefundExecution(ctx context.Context, tenant, day string) error {
	if err := checkDay(day); err != nil {
		return fmt.Errorf("sqlite: refund execution: %w", err)
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE usage_days SET executions = executions - 1
		WHERE tenant = $1 AND day = $2 AND executions > 0`, tenant, day); err != nil {
		return fmt.Errorf("sqlite: refund execution: %w", err)
	}
	return nil
}

// ReserveExecutions implements store.Store. Like ReserveExecution it is
// one statement: the row is created at n or raised by n only while n more
// fit, so a batch is counted whole or not at all.
func (s *Store) ReserveExecutions(ctx context.Context, tenant, day string, n, limit int64) (int64, error) {
	if err := checkDay(day); err != nil {
		return 0, fmt.Errorf("sqlite: reserve executions: %w", err)
	}
	if n < 1 {
		return 0, fmt.Errorf("sqlite: reserve executions: invalid count %d", n)
	}
	if n > limit {
		return 0, fmt.Errorf("sqlite: reserve executions: %w", store.ErrQuotaExceeded)
	}
	var used int64
	err := s.w.QueryRowContext(ctx, `INSERT INTO usage_days (tenant, day, executions) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, day) DO UPDATE SET executions = executions + $3
		WHERE usage_days.executions <= $4 - $3
		RETURNING executions`, tenant, day, n, limit).Scan(&used)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrQuotaExceeded
	}
	if err != nil {
		return 0, fmt.Errorf("sqlite: reserve executions: %w", err)
	}
	return used, nil
}

// RefundExecutions implements store.Store.
func (s *Store) RefundExecutions(ctx context.Context, tenant, day string, n int64) error {
	if err := checkDay(day); err != nil {
		return fmt.Errorf("sqlite: refund executions: %w", err)
	}
	if n < 0 {
		return fmt.Errorf("sqlite: refund executions: invalid count %d", n)
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE usage_days SET executions = max(executions - $3, 0)
		WHERE tenant = $1 AND day = $2`, tenant, day, n); err != nil {
		return fmt.Errorf("sqlite: refund executions: %w", err)
	}
	return nil
}

// CountRequest implements store.Store.
func (s *Store) CountRequest(ctx context.Context, tenant string, window time.Time) (int64, error) {
	var n int64
	err := s.st.countRequest.QueryRowContext(ctx, tenant, micros(window)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sqlite: count request: %w", err)
	}
	return n, nil
}

// executionArgs are sqlstore.ExecutionArgs with this store's times.
func executionArgs(e store.Execution) ([]any, error) {
	return sqlstore.ExecutionArgs(e, func(t time.Time) any { return micros(t) })
}

func scanExecution(row interface{ Scan(...any) error }) (store.Execution, error) {
	var (
		e                 store.Execution
		stdout, stderr    []byte
		files             []byte
		created           int64
		started, finished sql.NullInt64
		webhookURL        sql.NullString
		w                 store.Webhook
	)
	err := row.Scan(&e.ID, &e.Tenant, &e.KeyID, &e.RequestID, &e.Language, &e.Status, &stdout, &stderr,
		&e.ExitCode, &e.DurationMS, &e.Truncated, &e.SandboxSeconds, &e.CPUSeconds, &e.PeakMemoryBytes,
		&created, &started, &finished, &e.CancelRequested, &e.Purged, &files, &e.FilesTruncated,
		&e.Async, &e.Request, &e.Owner, &e.Reason, &webhookURL, &w.DeliveryID, &w.State,
		&w.Attempts, &w.LastStatus, &w.LastError, &e.Image, &e.ImageVersion)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Execution{}, err
	}
	e.Stdout, e.Stderr = string(stdout), string(stderr)
	if e.Files, err = store.UnmarshalFiles(files); err != nil {
		return store.Execution{}, err
	}
	e.CreatedAt = fromMicros(created)
	if started.Valid {
		e.StartedAt = fromMicros(started.Int64)
	}
	if finished.Valid {
		e.FinishedAt = fromMicros(finished.Int64)
	}
	if webhookURL.Valid {
		w.URL = webhookURL.String
		e.Webhook = &w
	}
	return e, nil
}

// queryExecutions runs a SELECT of sqlstore.ExecutionColumns on the read pool.
func (s *Store) queryExecutions(ctx context.Context, query string, args ...any) ([]store.Execution, error) {
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Execution
	for rows.Next() {
		e, err := scanExecution(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// executionState returns the tenant and status of execution id;
// ErrNotFound if there is none.
func (s *Store) executionState(ctx context.Context, tx *sql.Tx, id string) (tenant, status string, err error) {
	err = tx.StmtContext(ctx, s.st.executionState).QueryRowContext(ctx, id).Scan(&tenant, &status)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	return tenant, status, err
}

// unfinished checks that execution id of tenant exists and has not
// finished, and returns its status.
func (s *Store) unfinished(ctx context.Context, tx *sql.Tx, tenant, id string) (string, error) {
	owner, status, err := s.executionState(ctx, tx, id)
	switch {
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
func (s *Store) createExecution(ctx context.Context, tx *sql.Tx, e store.Execution) error {
	if store.Final(e.Status) {
		return fmt.Errorf("execution %s: status %q is final", e.ID, e.Status)
	}
	e.FinishedAt = time.Time{}
	args, err := executionArgs(e)
	if err != nil {
		return err
	}
	if _, err = tx.StmtContext(ctx, s.st.insertExecution).ExecContext(ctx, args...); err != nil {
		return err
	}
	if e.IdempotencyKey != "" {
		_, err = tx.ExecContext(ctx, sqlstore.PendIdempotency, e.ID, e.Tenant, e.IdempotencyKey)
	}
	return err
}

// CreateExecution implements store.Store.
func (s *Store) CreateExecution(ctx context.Context, e store.Execution) error {
	if err := s.tx(ctx, func(tx *sql.Tx) error { return s.createExecution(ctx, tx, e) }); err != nil {
		return fmt.Errorf("sqlite: create execution: %w", err)
	}
	return nil
}

// CreateExecutions implements store.Store.
func (s *Store) CreateExecutions(ctx context.Context, es []store.Execution) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		for _, e := range es {
			if err := s.createExecution(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlite: create executions: %w", err)
	}
	return nil
}

// StartExecution implements store.Store.
func (s *Store) StartExecution(ctx context.Context, tenant, id string, at time.Time) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.unfinished(ctx, tx, tenant, id); err != nil {
			return err
		}
		_, err := tx.StmtContext(ctx, s.st.startExecution).ExecContext(ctx, store.StatusRunning, micros(at), id)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: start execution: %w", err)
	}
	return nil
}

// ClaimExecution implements store.Store. The write transaction holds
// SQLite's one write lock from the check to the update.
func (s *Store) ClaimExecution(ctx context.Context, tenant, id, owner string, at time.Time) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		status, err := s.unfinished(ctx, tx, tenant, id)
		if err != nil {
			return err
		}
		if status != store.StatusQueued {
			return store.ErrNotQueued
		}
		_, err = tx.ExecContext(ctx, `UPDATE executions SET status = $1, started_at = $2, owner = $3 WHERE id = $4`,
			store.StatusRunning, micros(at), owner, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: claim execution: %w", err)
	}
	return nil
}

// AbortExecution implements store.Store.
func (s *Store) AbortExecution(ctx context.Context, tenant, id, status, reason string, from []string, at time.Time) (store.Execution, error) {
	if !store.Final(status) {
		return store.Execution{}, fmt.Errorf("sqlite: abort execution: status %q is not final", status)
	}
	var e store.Execution
	err := s.tx(ctx, func(tx *sql.Tx) error {
		current, err := s.unfinished(ctx, tx, tenant, id)
		if err == nil && !slices.Contains(from, current) {
			err = store.ErrNotQueued
		}
		if err == nil {
			_, err = tx.ExecContext(ctx, `UPDATE executions SET status = $1, reason = $2, finished_at = $3 WHERE id = $4`,
				status, reason, micros(at), id)
		}
		if err == nil {
			_, err = tx.ExecContext(ctx, sqlstore.SettleIdempotency, id, tenant)
		}
		if err != nil && !errors.Is(err, store.ErrFinished) && !errors.Is(err, store.ErrNotQueued) {
			return err
		}
		var rerr error
		e, rerr = scanExecution(tx.QueryRowContext(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions WHERE id = $1`, id))
		return cmp.Or(rerr, err)
	})
	if errors.Is(err, store.ErrFinished) || errors.Is(err, store.ErrNotQueued) {
		return e, fmt.Errorf("sqlite: abort execution: %w", err)
	}
	if err != nil {
		return store.Execution{}, fmt.Errorf("sqlite: abort execution: %w", err)
	}
	return e, nil
}

// OwnedExecutions implements store.Store.
func (s *Store) OwnedExecutions(ctx context.Context, owner string) ([]store.Execution, error) {
	es, err := s.queryExecutions(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions
		WHERE owner = $1 AND status IN ('queued', 'running') ORDER BY id`, owner)
	if err != nil {
		return nil, fmt.Errorf("sqlite: owned executions: %w", err)
	}
	return es, nil
}

// QueuedAsync implements store.Store.
func (s *Store) QueuedAsync(ctx context.Context, before time.Time, limit int) ([]store.Execution, error) {
	if limit < 1 {
		return nil, nil
	}
	es, err := s.queryExecutions(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions
		WHERE async = 1 AND status = 'queued' AND created_at < $1 ORDER BY created_at, id LIMIT $2`, micros(before), limit)
	if err != nil {
		return nil, fmt.Errorf("sqlite: queued async: %w", err)
	}
	return es, nil
}

// CountQueuedAsync implements store.Store.
func (s *Store) CountQueuedAsync(ctx context.Context, tenant string) (int64, error) {
	var n int64
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM executions WHERE tenant = $1 AND async = 1 AND status = 'queued'`, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlite: count queued async: %w", err)
	}
	return n, nil
}

// UpdateWebhook implements store.Store.
func (s *Store) UpdateWebhook(ctx context.Context, tenant, id string, w store.Webhook) error {
	args := append(sqlstore.WebhookArgs(&w), id, tenant)
	res, err := s.w.ExecContext(ctx, sqlstore.UpdateWebhook, args...)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = store.ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("sqlite: update webhook: %w", err)
	}
	return nil
}

// SaveExecution implements store.Store.
func (s *Store) SaveExecution(ctx context.Context, e store.Execution) error {
	if !store.Final(e.Status) {
		return fmt.Errorf("sqlite: save execution: status %q is not final", e.Status)
	}
	args, err := executionArgs(e)
	if err != nil {
		return fmt.Errorf("sqlite: save execution: %w", err)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		owner, status, err := s.executionState(ctx, tx, e.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			_, err = tx.StmtContext(ctx, s.st.insertExecution).ExecContext(ctx, args...)
		case err != nil:
		case owner != e.Tenant || store.Final(status):
			err = fmt.Errorf("execution %s exists", e.ID)
		default:
			_, err = tx.StmtContext(ctx, s.st.updateExecution).ExecContext(ctx, args...)
		}
		if err != nil {
			return err
		}
		_, err = tx.StmtContext(ctx, s.st.addUsage).ExecContext(ctx,
			e.Tenant, e.CreatedAt.UTC().Format(time.DateOnly), e.SandboxSeconds, e.CPUSeconds)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: save execution: %w", err)
	}
	return nil
}

// DeleteExecution implements store.Store.
func (s *Store) DeleteExecution(ctx context.Context, tenant, id string) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.unfinished(ctx, tx, tenant, id); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM executions WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: delete execution: %w", err)
	}
	return nil
}

// RequestCancel implements store.Store.
func (s *Store) RequestCancel(ctx context.Context, tenant, id string) (store.Execution, error) {
	var e store.Execution
	err := s.tx(ctx, func(tx *sql.Tx) error {
		_, err := s.unfinished(ctx, tx, tenant, id)
		if err == nil {
			_, err = tx.ExecContext(ctx, `UPDATE executions SET cancel_requested = 1 WHERE id = $1`, id)
		}
		if err != nil && !errors.Is(err, store.ErrFinished) {
			return err
		}
		var rerr error
		e, rerr = scanExecution(tx.QueryRowContext(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions WHERE id = $1`, id))
		return cmp.Or(rerr, err)
	})
	if errors.Is(err, store.ErrFinished) {
		return e, fmt.Errorf("sqlite: request cancel: %w", err)
	}
	if err != nil {
		return store.Execution{}, fmt.Errorf("sqlite: request cancel: %w", err)
	}
	return e, nil
}

// Execution implements store.Store.
func (s *Store) Execution(ctx context.Context, tenant, id string) (store.Execution, error) {
	e, err := scanExecution(s.r.QueryRowContext(ctx, `SELECT `+sqlstore.ExecutionColumns+` FROM executions WHERE id = $1 AND tenant = $2`, id, tenant))
	if err != nil {
		return store.Execution{}, fmt.Errorf("sqlite: execution: %w", err)
	}
	return e, nil
}

// Usage implements store.Store.
func (s *Store) Usage(ctx context.Context, tenant, day string) (store.DayUsage, error) {
	if err := checkDay(day); err != nil {
		return store.DayUsage{}, fmt.Errorf("sqlite: usage: %w", err)
	}
	var u store.DayUsage
	err := s.r.QueryRowContext(ctx, `SELECT executions, sandbox_seconds, cpu_seconds
		FROM usage_days WHERE tenant = $1 AND day = $2`, tenant, day).Scan(&u.Executions, &u.SandboxSeconds, &u.CPUSeconds)
	if errors.Is(err, sql.ErrNoRows) {
		return store.DayUsage{}, nil
	}
	if err != nil {
		return store.DayUsage{}, fmt.Errorf("sqlite: usage: %w", err)
	}
	return u, nil
}

// Purge implements store.Store.
func (s *Store) Purge(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		t := micros(before)
		res, err := tx.ExecContext(ctx, `UPDATE executions SET stdout = x'', stderr = x'', files = NULL, request = NULL, purged = 1
			WHERE created_at < $1 AND purged = 0`, t)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE created_at < $1`, t); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM rate_windows WHERE window_start < $1`, t)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sqlite: purge: %w", err)
	}
	return n, nil
}

// ClaimIdempotency implements store.Store.
func (s *Store) ClaimIdempotency(ctx context.Context, tenant, key, bodyHash string, now, staleBefore, abandonedBefore time.Time) (store.Idempotency, bool, error) {
	var (
		rec     store.Idempotency
		claimed bool
	)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		// Insert, or take over a stale or abandoned record; a live one is
		// left alone and the statement returns nothing.
		var created int64
		err := tx.QueryRowContext(ctx, `INSERT INTO idempotency (tenant, idem_key, body_hash, execution_id, created_at)
			VALUES ($1, $2, $3, '', $4)
			ON CONFLICT (tenant, idem_key) DO UPDATE SET
				body_hash = excluded.body_hash, execution_id = '', pending_id = '', created_at = excluded.created_at
			WHERE idempotency.created_at < $5 OR (idempotency.execution_id = '' AND idempotency.created_at < $6)
			RETURNING tenant, idem_key, body_hash, execution_id, created_at`,
			tenant, key, bodyHash, micros(now), micros(staleBefore), micros(abandonedBefore)).Scan(
			&rec.Tenant, &rec.Key, &rec.BodyHash, &rec.ExecutionID, &created)
		if err == nil {
			claimed = true
			rec.CreatedAt = fromMicros(created)
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		err = tx.QueryRowContext(ctx, `SELECT tenant, idem_key, body_hash, execution_id, created_at
			FROM idempotency WHERE tenant = $1 AND idem_key = $2`, tenant, key).Scan(
			&rec.Tenant, &rec.Key, &rec.BodyHash, &rec.ExecutionID, &created)
		rec.CreatedAt = fromMicros(created)
		return err
	})
	if err != nil {
		return store.Idempotency{}, false, fmt.Errorf("sqlite: claim idempotency: %w", err)
	}
	return rec, claimed, nil
}

// CompleteIdempotency implements store.Store.
func (s *Store) CompleteIdempotency(ctx context.Context, tenant, key, executionID string) error {
	res, err := s.w.ExecContext(ctx, `UPDATE idempotency SET execution_id = $1 WHERE tenant = $2 AND idem_key = $3`,
		executionID, tenant, key)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n == 0 {
			err = store.ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("sqlite: complete idempotency: %w", err)
	}
	return nil
}

// ReleaseIdempotency implements store.Store.
func (s *Store) ReleaseIdempotency(ctx context.Context, tenant, key string) error {
	// A completed record is never dropped: its result must keep replaying.
	if _, err := s.w.ExecContext(ctx, `DELETE FROM idempotency WHERE tenant = $1 AND idem_key = $2 AND execution_id = ''`,
		tenant, key); err != nil {
		return fmt.Errorf("sqlite: release idempotency: %w", err)
	}
	return nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, node string, at time.Time) error {
	if _, err := s.w.ExecContext(ctx, `INSERT INTO nodes (id, seen_at) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at`, node, micros(at)); err != nil {
		return fmt.Errorf("sqlite: heartbeat: %w", err)
	}
	return nil
}

// StaleNodes implements store.Store.
func (s *Store) StaleNodes(ctx context.Context, before time.Time) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id FROM nodes WHERE seen_at < $1 ORDER BY id`, micros(before))
	if err != nil {
		return nil, fmt.Errorf("sqlite: stale nodes: %w", err)
	}
	defer rows.Close()
	var nodes []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("sqlite: stale nodes: %w", err)
		}
		nodes = append(nodes, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: stale nodes: %w", err)
	}
	return nodes, nil
}

// ForgetNode implements store.Store.
func (s *Store) ForgetNode(ctx context.Context, node string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM nodes WHERE id = $1`, node); err != nil {
		return fmt.Errorf("sqlite: forget node: %w", err)
	}
	return nil
}

// WebhookSecret implements store.Store. create is called only when no
// secret is found; of two callers inserting at once the first insert wins
// (ON CONFLICT DO NOTHING) and both read it back.
func (s *Store) WebhookSecret(ctx context.Context, tenant string, create func() string, at time.Time) (string, time.Time, error) {
	secret, created, err := webhookSecret(ctx, s.r, tenant)
	if errors.Is(err, sql.ErrNoRows) {
		err = s.tx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)
				ON CONFLICT (tenant) DO NOTHING`, tenant, create(), micros(at)); err != nil {
				return err
			}
			var err error
			secret, created, err = webhookSecret(ctx, tx, tenant)
			return err
		})
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("sqlite: webhook secret: %w", err)
	}
	return secret, created, nil
}

func webhookSecret(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, tenant string) (string, time.Time, error) {
	var (
		secret  string
		created int64
	)
	err := q.QueryRowContext(ctx, `SELECT secret, created_at FROM webhook_secrets WHERE tenant = $1`, tenant).Scan(&secret, &created)
	return secret, fromMicros(created), err
}

// RotateWebhookSecret implements store.Store.
func (s *Store) RotateWebhookSecret(ctx context.Context, tenant, secret string, at time.Time) error {
	if _, err := s.w.ExecContext(ctx, `INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (tenant) DO UPDATE SET secret = excluded.secret, created_at = excluded.created_at`,
		tenant, secret, micros(at)); err != nil {
		return fmt.Errorf("sqlite: rotate webhook secret: %w", err)
	}
	return nil
}

// micros is how times are stored: Unix microseconds, the precision
// PostgreSQL keeps, so both stores return the same instants.
func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

func checkDay(day string) error {
	if t, err := time.Parse(time.DateOnly, day); err != nil || t.Format(time.DateOnly) != day {
		return fmt.Errorf("invalid day %q", day)
	}
	return nil
}
