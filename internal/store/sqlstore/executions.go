package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// executionColumns is the order in which scanExecution reads a row.
const executionColumns = `id, tenant, key_id, request_id, language, status, stdout, stderr,
	exit_code, duration_ms, truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes,
	created_at, started_at, finished_at, cancel_requested, purged, files, files_truncated,
	async, request, owner, reason, webhook_url, webhook_delivery_id, webhook_state,
	webhook_attempts, webhook_last_status, webhook_last_error, image, image_version, network`

const qExecution = `SELECT ` + executionColumns + ` FROM executions WHERE id = $1`

// qInsertExecution and qUpdateExecution write every column a caller sets,
// with executionArgs; $1 is the id in both. cancel_requested and purged
// are the store's own and are left alone.
const (
	qInsertExecution = `INSERT INTO executions (id, tenant, key_id, request_id, language, status,
		stdout, stderr, exit_code, duration_ms, truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes,
		created_at, started_at, finished_at, files, files_truncated, async, request, owner, reason,
		webhook_url, webhook_delivery_id, webhook_state, webhook_attempts, webhook_last_status, webhook_last_error,
		image, image_version, network)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
		$21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32)`
	qUpdateExecution = `UPDATE executions SET tenant = $2, key_id = $3, request_id = $4, language = $5, status = $6,
		stdout = $7, stderr = $8, exit_code = $9, duration_ms = $10, truncated = $11, sandbox_seconds = $12,
		cpu_seconds = $13, peak_memory_bytes = $14, created_at = $15, started_at = $16, finished_at = $17,
		files = $18, files_truncated = $19, async = $20, request = $21, owner = $22, reason = $23,
		webhook_url = $24, webhook_delivery_id = $25, webhook_state = $26, webhook_attempts = $27,
		webhook_last_status = $28, webhook_last_error = $29, image = $30, image_version = $31, network = $32
		WHERE id = $1`
)

// webhookArgs are the webhook_ columns of w in executionColumns' order. A
// nil w is a NULL webhook_url, which is how a scan tells "no webhook".
func webhookArgs(w *store.Webhook) []any {
	if w == nil {
		return []any{nil, "", "", 0, 0, ""}
	}
	return []any{w.URL, w.DeliveryID, w.State, w.Attempts, w.LastStatus, w.LastError}
}

// executionArgs are the arguments of qInsertExecution and qUpdateExecution.
func (s *Store) executionArgs(e store.Execution) ([]any, error) {
	files, err := marshalFiles(e.Files)
	if err != nil {
		return nil, err
	}
	args := []any{e.ID, e.Tenant, e.KeyID, e.RequestID, e.Language, e.Status,
		[]byte(e.Stdout), []byte(e.Stderr), e.ExitCode, e.DurationMS, e.Truncated,
		e.SandboxSeconds, e.CPUSeconds, e.PeakMemoryBytes, s.at(e.CreatedAt), s.nullAt(e.StartedAt),
		s.nullAt(e.FinishedAt), files, e.FilesTruncated, e.Async, e.Request, e.Owner, e.Reason}
	args = append(args, webhookArgs(e.Webhook)...)
	return append(args, e.Image, e.ImageVersion, e.Network), nil
}

func scanExecution(row scanner) (store.Execution, error) {
	var (
		e              store.Execution
		stdout, stderr []byte
		files          []byte
		webhookURL     sql.NullString
		w              store.Webhook
	)
	err := row.Scan(&e.ID, &e.Tenant, &e.KeyID, &e.RequestID, &e.Language, &e.Status, &stdout, &stderr,
		&e.ExitCode, &e.DurationMS, &e.Truncated, &e.SandboxSeconds, &e.CPUSeconds, &e.PeakMemoryBytes,
		tm(&e.CreatedAt), tm(&e.StartedAt), tm(&e.FinishedAt), &e.CancelRequested, &e.Purged, &files, &e.FilesTruncated,
		&e.Async, &e.Request, &e.Owner, &e.Reason, &webhookURL, &w.DeliveryID, &w.State,
		&w.Attempts, &w.LastStatus, &w.LastError, &e.Image, &e.ImageVersion, &e.Network)
	if err != nil {
		return store.Execution{}, notFound(err)
	}
	e.Stdout, e.Stderr = string(stdout), string(stderr)
	if e.Files, err = unmarshalFiles(files); err != nil {
		return store.Execution{}, err
	}
	if webhookURL.Valid {
		w.URL = webhookURL.String
		e.Webhook = &w
	}
	return e, nil
}

// executionState returns the tenant and status of execution id, locking
// its row until the transaction ends (see Dialect.ForUpdate), so
// check-and-update steps on one execution never interleave, across nodes
// too. ErrNotFound if there is none.
func (s *Store) executionState(ctx context.Context, c conn, id string) (tenant, status string, err error) {
	err = c.row(ctx, s.lockExecution, id).Scan(&tenant, &status)
	return tenant, status, notFound(err)
}

// unfinished checks that execution id of tenant exists and has not
// finished, and returns its status, holding its row (executionState).
func (s *Store) unfinished(ctx context.Context, c conn, tenant, id string) (string, error) {
	owner, status, err := s.executionState(ctx, c, id)
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

// createExecution inserts an accepted execution in a transaction.
func (s *Store) createExecution(ctx context.Context, c conn, e store.Execution) error {
	if store.Final(e.Status) {
		return fmt.Errorf("execution %s: status %q is final", e.ID, e.Status)
	}
	e.FinishedAt = time.Time{}
	args, err := s.executionArgs(e)
	if err != nil {
		return err
	}
	if _, err = c.exec(ctx, qInsertExecution, args...); err != nil {
		return err
	}
	if e.IdempotencyKey != "" {
		// The running claim of the key now names this execution as
		// pending; a completed claim is left alone.
		_, err = c.exec(ctx, `UPDATE idempotency SET pending_id = $1
			WHERE tenant = $2 AND idem_key = $3 AND execution_id = ''`, e.ID, e.Tenant, e.IdempotencyKey)
	}
	return err
}

// CreateExecution implements store.Executions.
func (s *Store) CreateExecution(ctx context.Context, e store.Execution) error {
	if err := s.tx(ctx, func(c conn) error { return s.createExecution(ctx, c, e) }); err != nil {
		return s.errf("create execution", err)
	}
	return nil
}

// CreateExecutions implements store.Executions.
func (s *Store) CreateExecutions(ctx context.Context, es []store.Execution) error {
	err := s.tx(ctx, func(c conn) error {
		for _, e := range es {
			if err := s.createExecution(ctx, c, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.errf("create executions", err)
	}
	return nil
}

// StartExecution implements store.Executions.
func (s *Store) StartExecution(ctx context.Context, tenant, id string, at time.Time) error {
	err := s.tx(ctx, func(c conn) error {
		if _, err := s.unfinished(ctx, c, tenant, id); err != nil {
			return err
		}
		_, err := c.exec(ctx, qStartExecution, store.StatusRunning, s.at(at), id)
		return err
	})
	if err != nil {
		return s.errf("start execution", err)
	}
	return nil
}

// ClaimExecution implements store.Executions. Claimers queue on the row
// (executionState); the first moves it to running and every later one
// reads running and gets ErrNotQueued.
func (s *Store) ClaimExecution(ctx context.Context, tenant, id, owner string, at time.Time) error {
	err := s.tx(ctx, func(c conn) error {
		status, err := s.unfinished(ctx, c, tenant, id)
		if err != nil {
			return err
		}
		if status != store.StatusQueued {
			return store.ErrNotQueued
		}
		_, err = c.exec(ctx, `UPDATE executions SET status = $1, started_at = $2, owner = $3 WHERE id = $4`,
			store.StatusRunning, s.at(at), owner, id)
		return err
	})
	if err != nil {
		return s.errf("claim execution", err)
	}
	return nil
}

// AbortExecution implements store.Executions.
func (s *Store) AbortExecution(ctx context.Context, tenant, id, status, reason string, from []string, at time.Time) (store.Execution, error) {
	if !store.Final(status) {
		return store.Execution{}, s.errf("abort execution", fmt.Errorf("status %q is not final", status))
	}
	var e store.Execution
	err := s.tx(ctx, func(c conn) error {
		current, err := s.unfinished(ctx, c, tenant, id)
		if err == nil && !slices.Contains(from, current) {
			err = store.ErrNotQueued
		}
		if err == nil {
			_, err = c.exec(ctx, `UPDATE executions SET status = $1, reason = $2, finished_at = $3 WHERE id = $4`,
				status, reason, s.at(at), id)
		}
		if err == nil {
			// Complete the running claim that names this execution as
			// pending, so a retry replays it.
			_, err = c.exec(ctx, `UPDATE idempotency SET execution_id = $1
				WHERE tenant = $2 AND pending_id = $1 AND execution_id = ''`, id, tenant)
		}
		if err != nil && !errors.Is(err, store.ErrFinished) && !errors.Is(err, store.ErrNotQueued) {
			return err
		}
		var rerr error
		e, rerr = scanExecution(c.row(ctx, qExecution, id))
		return cmp.Or(rerr, err) // a refusal rolls back a transaction that only read
	})
	if errors.Is(err, store.ErrFinished) || errors.Is(err, store.ErrNotQueued) {
		return e, s.errf("abort execution", err)
	}
	if err != nil {
		return store.Execution{}, s.errf("abort execution", err)
	}
	return e, nil
}

// OwnedExecutions implements store.Executions.
func (s *Store) OwnedExecutions(ctx context.Context, owner string) ([]store.Execution, error) {
	es, err := queryAll(ctx, s.reader(), scanExecution, `SELECT `+executionColumns+` FROM executions
		WHERE owner = $1 AND status IN ('queued', 'running') ORDER BY id`, owner)
	if err != nil {
		return nil, s.errf("owned executions", err)
	}
	return es, nil
}

// QueuedAsync implements store.Executions.
func (s *Store) QueuedAsync(ctx context.Context, before time.Time, limit int) ([]store.Execution, error) {
	if limit < 1 {
		return nil, nil
	}
	es, err := queryAll(ctx, s.reader(), scanExecution, `SELECT `+executionColumns+` FROM executions
		WHERE async = `+s.d.True+` AND status = 'queued' AND created_at < $1 ORDER BY created_at, id LIMIT $2`, s.at(before), limit)
	if err != nil {
		return nil, s.errf("queued async", err)
	}
	return es, nil
}

// CountQueuedAsync implements store.Executions.
func (s *Store) CountQueuedAsync(ctx context.Context, tenant string) (int64, error) {
	var n int64
	if err := s.reader().row(ctx, `SELECT count(*) FROM executions
		WHERE tenant = $1 AND async = `+s.d.True+` AND status = 'queued'`, tenant).Scan(&n); err != nil {
		return 0, s.errf("count queued async", err)
	}
	return n, nil
}

// UpdateWebhook implements store.Executions. It changes no row of an
// execution without a webhook.
func (s *Store) UpdateWebhook(ctx context.Context, tenant, id string, w store.Webhook) error {
	args := append(webhookArgs(&w), id, tenant)
	if err := s.writer().one(ctx, store.ErrNotFound, `UPDATE executions SET webhook_url = $1, webhook_delivery_id = $2,
		webhook_state = $3, webhook_attempts = $4, webhook_last_status = $5, webhook_last_error = $6
		WHERE id = $7 AND tenant = $8 AND webhook_url IS NOT NULL`, args...); err != nil {
		return s.errf("update webhook", err)
	}
	return nil
}

// SaveExecution implements store.Executions.
func (s *Store) SaveExecution(ctx context.Context, e store.Execution) error {
	if !store.Final(e.Status) {
		return s.errf("save execution", fmt.Errorf("status %q is not final", e.Status))
	}
	args, err := s.executionArgs(e)
	if err != nil {
		return s.errf("save execution", err)
	}
	err = s.tx(ctx, func(c conn) error {
		owner, status, err := s.executionState(ctx, c, e.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			_, err = c.exec(ctx, qInsertExecution, args...)
		case err != nil:
		case owner != e.Tenant || store.Final(status):
			err = fmt.Errorf("execution %s exists", e.ID)
		default:
			_, err = c.exec(ctx, qUpdateExecution, args...)
		}
		if err != nil {
			return err
		}
		in, out := e.NetworkBytes()
		_, err = c.exec(ctx, qAddUsage, e.Tenant, e.CreatedAt.UTC().Format(time.DateOnly), e.SandboxSeconds, e.CPUSeconds, in, out)
		return err
	})
	if err != nil {
		return s.errf("save execution", err)
	}
	return nil
}

// DeleteExecution implements store.Executions.
func (s *Store) DeleteExecution(ctx context.Context, tenant, id string) error {
	err := s.tx(ctx, func(c conn) error {
		if _, err := s.unfinished(ctx, c, tenant, id); err != nil {
			return err
		}
		_, err := c.exec(ctx, `DELETE FROM executions WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return s.errf("delete execution", err)
	}
	return nil
}

// RequestCancel implements store.Executions.
func (s *Store) RequestCancel(ctx context.Context, tenant, id string) (store.Execution, error) {
	var e store.Execution
	err := s.tx(ctx, func(c conn) error {
		_, err := s.unfinished(ctx, c, tenant, id)
		if err == nil {
			_, err = c.exec(ctx, `UPDATE executions SET cancel_requested = `+s.d.True+` WHERE id = $1`, id)
		}
		if err != nil && !errors.Is(err, store.ErrFinished) {
			return err
		}
		var rerr error
		e, rerr = scanExecution(c.row(ctx, qExecution, id))
		return cmp.Or(rerr, err) // ErrFinished rolls back a transaction that only read
	})
	if errors.Is(err, store.ErrFinished) {
		return e, s.errf("request cancel", err)
	}
	if err != nil {
		return store.Execution{}, s.errf("request cancel", err)
	}
	return e, nil
}

// Execution implements store.Executions.
func (s *Store) Execution(ctx context.Context, tenant, id string) (store.Execution, error) {
	e, err := scanExecution(s.reader().row(ctx, qExecution+` AND tenant = $2`, id, tenant))
	if err != nil {
		return store.Execution{}, s.errf("execution", err)
	}
	return e, nil
}

// Purge implements store.Executions.
func (s *Store) Purge(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.tx(ctx, func(c conn) error {
		t := s.at(before)
		var err error
		n, err = c.affected(ctx, `UPDATE executions SET stdout = `+s.d.EmptyBytes+`, stderr = `+s.d.EmptyBytes+`,
			files = NULL, request = NULL, purged = `+s.d.True+`
			WHERE created_at < $1 AND purged = `+s.d.False, t)
		if err != nil {
			return err
		}
		if _, err := c.exec(ctx, `DELETE FROM idempotency WHERE created_at < $1`, t); err != nil {
			return err
		}
		_, err = c.exec(ctx, `DELETE FROM rate_windows WHERE window_start < $1`, t)
		return err
	})
	if err != nil {
		return 0, s.errf("purge", err)
	}
	return n, nil
}
