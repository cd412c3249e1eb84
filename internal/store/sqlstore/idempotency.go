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

// Heartbeat implements store.Nodes.
func (s *Store) Heartbeat(ctx context.Context, node string, at time.Time) error {
	if _, err := s.writer().exec(ctx, `INSERT INTO nodes (id, seen_at) VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at`, node, s.at(at)); err != nil {
		return s.errf("heartbeat", err)
	}
	return nil
}

// StaleNodes implements store.Nodes.
func (s *Store) StaleNodes(ctx context.Context, before time.Time) ([]string, error) {
	nodes, err := queryAll(ctx, s.reader(), func(row scanner) (id string, err error) { return id, row.Scan(&id) },
		`SELECT id FROM nodes WHERE seen_at < $1 ORDER BY id`, s.at(before))
	if err != nil {
		return nil, s.errf("stale nodes", err)
	}
	return nodes, nil
}

// ForgetNode implements store.Nodes.
func (s *Store) ForgetNode(ctx context.Context, node string) error {
	if _, err := s.writer().exec(ctx, `DELETE FROM nodes WHERE id = $1`, node); err != nil {
		return s.errf("forget node", err)
	}
	return nil
}

// WebhookSecret implements store.WebhookSecrets. create is called only
// when no secret is found; of callers inserting at once the first insert
// wins (ON CONFLICT DO NOTHING waits for it to commit) and all read it
// back.
func (s *Store) WebhookSecret(ctx context.Context, tenant string, create func() string, at time.Time) (string, time.Time, error) {
	const read = `SELECT secret, created_at FROM webhook_secrets WHERE tenant = $1`
	var (
		secret  string
		created time.Time
	)
	err := s.reader().row(ctx, read, tenant).Scan(&secret, tm(&created))
	if errors.Is(err, sql.ErrNoRows) {
		w := s.writer()
		_, err = w.exec(ctx, `INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (tenant) DO NOTHING`, tenant, create(), s.at(at))
		if err == nil {
			err = w.row(ctx, read, tenant).Scan(&secret, tm(&created))
		}
	}
	if err != nil {
		return "", time.Time{}, s.errf("webhook secret", err)
	}
	return secret, created, nil
}

// RotateWebhookSecret implements store.WebhookSecrets.
func (s *Store) RotateWebhookSecret(ctx context.Context, tenant, secret string, at time.Time) error {
	if _, err := s.writer().exec(ctx, `INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (tenant) DO UPDATE SET secret = excluded.secret, created_at = excluded.created_at`,
		tenant, secret, s.at(at)); err != nil {
		return s.errf("rotate webhook secret", err)
	}
	return nil
}
