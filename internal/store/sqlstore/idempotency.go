package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// claimAttempts bounds ClaimIdempotency's retry when the record it lost to
// is released before it can be read.
const claimAttempts = 10

// ClaimIdempotency implements store.Idempotencies.
func (s *Store) ClaimIdempotency(ctx context.Context, tenant, key, bodyHash string, now, staleBefore, abandonedBefore time.Time) (store.Idempotency, bool, error) {
	w := s.writer()
	for range claimAttempts {
		// Insert, or take over a stale or abandoned record; a live record
		// is left alone and the statement returns nothing. Parallel
		// claimers queue on the row, and the WHERE is re-checked against
		// the winner's row.
		rec, err := scanIdempotency(w.row(ctx, `INSERT INTO idempotency (tenant, idem_key, body_hash, execution_id, created_at)
			VALUES ($1, $2, $3, '', $4)
			ON CONFLICT (tenant, idem_key) DO UPDATE SET
				body_hash = excluded.body_hash, execution_id = '', pending_id = '', created_at = excluded.created_at
			WHERE idempotency.created_at < $5 OR (idempotency.execution_id = '' AND idempotency.created_at < $6)
			RETURNING tenant, idem_key, body_hash, execution_id, created_at`,
			tenant, key, bodyHash, s.at(now), s.at(staleBefore), s.at(abandonedBefore)))
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return store.Idempotency{}, false, s.errf("claim idempotency", err)
		}
		rec, err = scanIdempotency(w.row(ctx, `SELECT tenant, idem_key, body_hash, execution_id, created_at
			FROM idempotency WHERE tenant = $1 AND idem_key = $2`, tenant, key))
		if err == nil {
			return rec, false, nil
		}
		// ErrNoRows: the holder released it in between; claim again.
		if !errors.Is(err, sql.ErrNoRows) {
			return store.Idempotency{}, false, s.errf("claim idempotency", err)
		}
	}
	return store.Idempotency{}, false, s.errf("claim idempotency", errors.New("record keeps changing, try again"))
}

func scanIdempotency(row scanner) (store.Idempotency, error) {
	var rec store.Idempotency
	err := row.Scan(&rec.Tenant, &rec.Key, &rec.BodyHash, &rec.ExecutionID, tm(&rec.CreatedAt))
	return rec, err
}

// CompleteIdempotency implements store.Idempotencies.
func (s *Store) CompleteIdempotency(ctx context.Context, tenant, key, executionID string) error {
	if err := s.writer().one(ctx, store.ErrNotFound, `UPDATE idempotency SET execution_id = $1 WHERE tenant = $2 AND idem_key = $3`,
		executionID, tenant, key); err != nil {
		return s.errf("complete idempotency", err)
	}
	return nil
}

// ReleaseIdempotency implements store.Idempotencies.
func (s *Store) ReleaseIdempotency(ctx context.Context, tenant, key string) error {
	// A completed record is never dropped: its result must keep replaying.
	if _, err := s.writer().exec(ctx, `DELETE FROM idempotency WHERE tenant = $1 AND idem_key = $2 AND execution_id = ''`,
		tenant, key); err != nil {
		return s.errf("release idempotency", err)
	}
	return nil
}
