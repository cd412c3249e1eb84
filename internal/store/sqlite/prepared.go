package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlstore"
)

// The statements every synchronous execution runs, prepared once when the
// store opens. modernc.org/sqlite compiles the SQL text again on every
// query that is not prepared; on the execution path that parser was the
// largest part of the store's CPU (about 0.9 ms per execution, measured
// with perf on the API's hot path, issue 15). database/sql's Stmt keeps
// the compiled statement per connection and is safe for concurrent use;
// Tx.StmtContext reuses it on the transaction's connection.
//
// They are prepared eagerly, not on first use: the writer pool has one
// connection, and preparing on the pool from inside a transaction would
// wait for the connection that transaction holds.
const (
	qKeyByHash = `SELECT ` + keyColumns + `
		FROM api_keys k JOIN tenants t ON t.id = k.tenant
		WHERE k.hash = $1 AND k.revoked_at IS NULL`
	qCountRequest = `INSERT INTO rate_windows (tenant, window_start, requests) VALUES ($1, $2, 1)
		ON CONFLICT (tenant, window_start) DO UPDATE SET requests = requests + 1
		RETURNING requests`
	// One statement: the row is created at 1 or incremented only while
	// below the limit, so no interleaving can overshoot.
	qReserveExecution = `INSERT INTO usage_days (tenant, day, executions) VALUES ($1, $2, 1)
		ON CONFLICT (tenant, day) DO UPDATE SET executions = executions + 1
		WHERE usage_days.executions < $3
		RETURNING executions`
	qExecutionState = `SELECT tenant, status FROM executions WHERE id = $1`
	qStartExecution = `UPDATE executions SET status = $1, started_at = $2 WHERE id = $3`
	qAddUsage       = `INSERT INTO usage_days (tenant, day, sandbox_seconds, cpu_seconds) VALUES ($1, $2, $3, $4)
			ON CONFLICT (tenant, day) DO UPDATE SET
				sandbox_seconds = sandbox_seconds + excluded.sandbox_seconds,
				cpu_seconds = cpu_seconds + excluded.cpu_seconds`
)

// prepared are the hot statements, on the pool each runs on.
type prepared struct {
	keyByHash       *sql.Stmt // reader
	countRequest    *sql.Stmt // writer
	reserve         *sql.Stmt // writer
	executionState  *sql.Stmt // writer, in transactions
	insertExecution *sql.Stmt // writer, in transactions
	updateExecution *sql.Stmt // writer, in transactions
	startExecution  *sql.Stmt // writer, in transactions
	addUsage        *sql.Stmt // writer, in transactions
}

func (s *Store) prepare(ctx context.Context) error {
	var errs []error
	prep := func(db *sql.DB, q string) *sql.Stmt {
		st, err := db.PrepareContext(ctx, q)
		errs = append(errs, err)
		return st
	}
	s.st = prepared{
		keyByHash:       prep(s.r, qKeyByHash),
		countRequest:    prep(s.w, qCountRequest),
		reserve:         prep(s.w, qReserveExecution),
		executionState:  prep(s.w, qExecutionState),
		insertExecution: prep(s.w, sqlstore.InsertExecution),
		updateExecution: prep(s.w, sqlstore.UpdateExecution),
		startExecution:  prep(s.w, qStartExecution),
		addUsage:        prep(s.w, qAddUsage),
	}
	if err := errors.Join(errs...); err != nil {
		s.st.close()
		return fmt.Errorf("sqlite: preparing statements: %w", err)
	}
	return nil
}

func (p prepared) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{p.keyByHash, p.countRequest, p.reserve, p.executionState,
		p.insertExecution, p.updateExecution, p.startExecution, p.addUsage} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}
