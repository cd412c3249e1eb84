package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

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
