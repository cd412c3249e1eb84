package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

var errPlanRequired = errors.New("a new tenant needs a plan")

// CreateKey implements store.Keys.
func (s *Store) CreateKey(ctx context.Context, k store.NewKey) (store.Key, error) {
	var out store.Key
	err := s.tx(ctx, func(c conn) error {
		plan, err := s.lockTenant(ctx, c, k)
		if err != nil {
			return err
		}
		out, err = s.insertKey(ctx, c, k, plan)
		return err
	})
	if err != nil {
		return store.Key{}, s.errf("create key", err)
	}
	return out, nil
}

// RotateKey implements store.Keys.
func (s *Store) RotateKey(ctx context.Context, oldKeyID string, k store.NewKey) (store.Key, error) {
	var out store.Key
	err := s.tx(ctx, func(c conn) error {
		// Lock the tenant first, as CreateKey does, so the two never wait
		// on each other in opposite orders.
		plan, err := s.lockTenant(ctx, c, k)
		if errors.Is(err, errPlanRequired) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		// The old key must be this tenant's and still active.
		if err := c.one(ctx, store.ErrNotFound, `UPDATE api_keys SET revoked_at = $1
			WHERE id = $2 AND tenant = $3 AND revoked_at IS NULL`, s.at(k.CreatedAt), oldKeyID, k.Tenant); err != nil {
			return err
		}
		out, err = s.insertKey(ctx, c, k, plan)
		return err
	})
	if err != nil {
		return store.Key{}, s.errf("rotate key", err)
	}
	return out, nil
}

// lockTenant creates the tenant row if needed and holds it until the
// transaction ends (PostgreSQL's row lock; SQLite's write transaction),
// which serializes key changes of one tenant across nodes. It returns the
// tenant's plan.
func (s *Store) lockTenant(ctx context.Context, c conn, k store.NewKey) (string, error) {
	var plan string
	if k.Plan == "" {
		err := c.row(ctx, `SELECT plan FROM tenants WHERE id = $1`+s.d.ForUpdate, k.Tenant).Scan(&plan)
		if errors.Is(err, sql.ErrNoRows) {
			return "", errPlanRequired
		}
		return plan, err
	}
	// A key creates its tenant on k.Plan but never changes the plan of an
	// existing one: only SetPlan does (issue 13). The no-op update takes
	// the row lock all the same.
	err := c.row(ctx, `INSERT INTO tenants (id, plan, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET id = excluded.id
		RETURNING plan`, k.Tenant, k.Plan, s.at(k.CreatedAt)).Scan(&plan)
	return plan, err
}

// insertKey counts the tenant's active keys and inserts k; the caller
// holds the tenant (lockTenant), so the count stays true until commit.
func (s *Store) insertKey(ctx context.Context, c conn, k store.NewKey, plan string) (store.Key, error) {
	var active int
	if err := c.row(ctx, `SELECT count(*) FROM api_keys WHERE tenant = $1 AND revoked_at IS NULL`,
		k.Tenant).Scan(&active); err != nil {
		return store.Key{}, err
	}
	if active >= store.MaxActiveKeys {
		return store.Key{}, store.ErrTooManyKeys
	}
	if _, err := c.exec(ctx, `INSERT INTO api_keys (id, tenant, hash, created_at) VALUES ($1, $2, $3, $4)`,
		k.ID, k.Tenant, k.Hash[:], s.at(k.CreatedAt)); err != nil {
		return store.Key{}, err
	}
	return store.Key{ID: k.ID, Tenant: k.Tenant, Plan: plan, CreatedAt: us(k.CreatedAt)}, nil
}

const keyColumns = `k.id, k.tenant, t.plan, k.created_at, k.revoked_at, k.last_used_at, t.disabled`

func scanKey(row scanner) (store.Key, error) {
	var k store.Key
	err := row.Scan(&k.ID, &k.Tenant, &k.Plan, tm(&k.CreatedAt), tm(&k.RevokedAt), tm(&k.LastUsedAt), &k.TenantDisabled)
	return k, err
}

// KeyByHash implements store.Keys.
func (s *Store) KeyByHash(ctx context.Context, hash [32]byte) (store.Key, error) {
	k, err := scanKey(s.reader().row(ctx, qKeyByHash, hash[:]))
	if err != nil {
		return store.Key{}, s.errf("key by hash", notFound(err))
	}
	return k, nil
}

// RevokeKey implements store.Keys.
func (s *Store) RevokeKey(ctx context.Context, keyID string, at time.Time) error {
	if err := s.writer().one(ctx, store.ErrNotFound, `UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL`,
		s.at(at), keyID); err != nil {
		return s.errf("revoke key", err)
	}
	return nil
}

// ListKeys implements store.Keys.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]store.Key, error) {
	keys, err := queryAll(ctx, s.reader(), scanKey, `SELECT `+keyColumns+`
		FROM api_keys k JOIN tenants t ON t.id = k.tenant
		WHERE $1 = '' OR k.tenant = $1
		ORDER BY k.created_at, k.id`, tenant)
	if err != nil {
		return nil, s.errf("list keys", err)
	}
	return keys, nil
}

// TouchKey implements store.Keys.
func (s *Store) TouchKey(ctx context.Context, keyID string, at time.Time) error {
	if _, err := s.writer().exec(ctx, `UPDATE api_keys SET last_used_at = $2
		WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)`, keyID, s.at(at)); err != nil {
		return s.errf("touch key "+keyID, err)
	}
	return nil
}
