package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// ReserveExecution implements store.Quota.
func (s *Store) ReserveExecution(ctx context.Context, tenant, day string, limit int64) (int64, error) {
	if err := checkDay(day); err != nil {
		return 0, s.errf("reserve execution", err)
	}
	if limit < 1 {
		return 0, s.errf("reserve execution", store.ErrQuotaExceeded)
	}
	var used int64
	err := s.writer().row(ctx, qReserveExecution, tenant, day, limit).Scan(&used)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrQuotaExceeded
	}
	if err != nil {
		return 0, s.errf("reserve execution", err)
	}
	return used, nil
}

// RefundExecution implements store.Quota.
func (s *Store) RefundExecution(ctx context.Context, tenant, day string) error {
	if err := checkDay(day); err != nil {
		return s.errf("refund execution", err)
	}
	if _, err := s.writer().exec(ctx, `UPDATE usage_days SET executions = executions - 1
		WHERE tenant = $1 AND day = $2 AND executions > 0`, tenant, day); err != nil {
		return s.errf("refund execution", err)
	}
	return nil
}

// ReserveExecutions implements store.Quota. Like ReserveExecution it is
// one statement: the row is created at n or raised by n only while n more
// fit, so a batch is counted whole or not at all.
func (s *Store) ReserveExecutions(ctx context.Context, tenant, day string, n, limit int64) (int64, error) {
	if err := checkDay(day); err != nil {
		return 0, s.errf("reserve executions", err)
	}
	if n < 1 {
		return 0, s.errf("reserve executions", fmt.Errorf("invalid count %d", n))
	}
	if n > limit {
		return 0, s.errf("reserve executions", store.ErrQuotaExceeded)
	}
	var used int64
	err := s.writer().row(ctx, `INSERT INTO usage_days (tenant, day, executions) VALUES ($1, $2, $3)
		ON CONFLICT (tenant, day) DO UPDATE SET executions = usage_days.executions + $3
		WHERE usage_days.executions <= $4 - $3
		RETURNING executions`, tenant, day, n, limit).Scan(&used)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrQuotaExceeded
	}
	if err != nil {
		return 0, s.errf("reserve executions", err)
	}
	return used, nil
}

// RefundExecutions implements store.Quota.
func (s *Store) RefundExecutions(ctx context.Context, tenant, day string, n int64) error {
	if err := checkDay(day); err != nil {
		return s.errf("refund executions", err)
	}
	if n < 0 {
		return s.errf("refund executions", fmt.Errorf("invalid count %d", n))
	}
	if _, err := s.writer().exec(ctx, `UPDATE usage_days SET executions = CASE WHEN executions > $3 THEN executions - $3 ELSE 0 END
		WHERE tenant = $1 AND day = $2`, tenant, day, n); err != nil {
		return s.errf("refund executions", err)
	}
	return nil
}

// CountRequest implements store.Quota.
func (s *Store) CountRequest(ctx context.Context, tenant string, window time.Time) (int64, error) {
	var n int64
	if err := s.writer().row(ctx, qCountRequest, tenant, s.at(window)).Scan(&n); err != nil {
		return 0, s.errf("count request", err)
	}
	return n, nil
}

// Usage implements store.Quota.
func (s *Store) Usage(ctx context.Context, tenant, day string) (store.DayUsage, error) {
	if err := checkDay(day); err != nil {
		return store.DayUsage{}, s.errf("usage", err)
	}
	var u store.DayUsage
	err := s.reader().row(ctx, `SELECT executions, sandbox_seconds, cpu_seconds, network_bytes_in, network_bytes_out
		FROM usage_days WHERE tenant = $1 AND day = $2`, tenant, day).Scan(&u.Executions, &u.SandboxSeconds, &u.CPUSeconds, &u.NetworkBytesIn, &u.NetworkBytesOut)
	if errors.Is(err, sql.ErrNoRows) {
		return store.DayUsage{}, nil
	}
	if err != nil {
		return store.DayUsage{}, s.errf("usage", err)
	}
	return u, nil
}
