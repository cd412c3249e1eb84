package sqlstore

import (
	"context"
	"database/sql"
	"errors"
)

// The statements every synchronous execution runs. Where the dialect asks
// (SQLite), they are prepared once when the store opens: modernc.org/sqlite
// compiles the SQL text again on every query that is not prepared, and on
// the execution path that parser was the largest part of the store's CPU
// (about 0.9 ms per execution, measured with perf on the API's hot path,
// issue 15). database/sql's Stmt keeps the compiled statement per
// connection and is safe for concurrent use; Tx.StmtContext reuses it on
// the transaction's connection.
//
// They are prepared eagerly, not on first use: SQLite's writer pool has
// one connection, and preparing on the pool from inside a transaction
// would wait for the connection that transaction holds.
const (
	qKeyByHash = `SELECT ` + keyColumns + `
		FROM api_keys k JOIN tenants t ON t.id = k.tenant
		WHERE k.hash = $1 AND k.revoked_at IS NULL`
	qCountRequest = `INSERT INTO rate_windows (tenant, window_start, requests) VALUES ($1, $2, 1)
		ON CONFLICT (tenant, window_start) DO UPDATE SET requests = rate_windows.requests + 1
		RETURNING requests`
	// One statement: the row is created at 1 or incremented only while
	// below the limit. Concurrent callers queue on the row (PostgreSQL's
	// row lock, SQLite's one writer) and each re-checks the WHERE against
	// the committed count, so no interleaving can overshoot.
	qReserveExecution = `INSERT INTO usage_days (tenant, day, executions) VALUES ($1, $2, 1)
		ON CONFLICT (tenant, day) DO UPDATE SET executions = usage_days.executions + 1
		WHERE usage_days.executions < $3
		RETURNING executions`
	// Every request about one sandbox (a command, a file) reads its
	// record, under the sandbox's lock, before it does anything else.
	qSandbox        = `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE tenant = $1 AND id = $2`
	qExecutionState = `SELECT tenant, status FROM executions WHERE id = $1`
	qStartExecution = `UPDATE executions SET status = $1, started_at = $2 WHERE id = $3`
	qAddUsage       = `INSERT INTO usage_days (tenant, day, sandbox_seconds, cpu_seconds, network_bytes_in, network_bytes_out)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (tenant, day) DO UPDATE SET
			sandbox_seconds = usage_days.sandbox_seconds + excluded.sandbox_seconds,
			cpu_seconds = usage_days.cpu_seconds + excluded.cpu_seconds,
			network_bytes_in = usage_days.network_bytes_in + excluded.network_bytes_in,
			network_bytes_out = usage_days.network_bytes_out + excluded.network_bytes_out`
)

// prepare prepares the hot statements, each on the pool it runs on.
func (s *Store) prepare(ctx context.Context) error {
	s.hot = map[string]*sql.Stmt{}
	var errs []error
	for q, db := range map[string]*sql.DB{
		qKeyByHash:        s.r,
		qSandbox:          s.r,
		qCountRequest:     s.w,
		qReserveExecution: s.w,
		s.lockExecution:   s.w,
		qInsertExecution:  s.w,
		qUpdateExecution:  s.w,
		qStartExecution:   s.w,
		qAddUsage:         s.w,
	} {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.hot[q] = st
	}
	if err := errors.Join(errs...); err != nil {
		for _, st := range s.hot {
			st.Close()
		}
		s.hot = nil
		return s.errf("preparing statements", err)
	}
	return nil
}
