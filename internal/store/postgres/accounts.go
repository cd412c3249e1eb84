package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// CreateTenant implements store.Store.
func (s *Store) CreateTenant(ctx context.Context, t store.Tenant) error {
	tag, err := s.pool.Exec(ctx, `INSERT INTO tenants (id, plan, created_at, disabled) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, t.ID, t.Plan, ts(t.CreatedAt), t.Disabled)
	if err == nil && tag.RowsAffected() == 0 {
		err = store.ErrExists
	}
	if err != nil {
		return fmt.Errorf("postgres: create tenant %s: %w", t.ID, err)
	}
	return nil
}

const tenantColumns = `id, plan, disabled, created_at`

func scanTenant(row pgx.Row) (store.Tenant, error) {
	var t store.Tenant
	if err := row.Scan(&t.ID, &t.Plan, &t.Disabled, &t.CreatedAt); err != nil {
		return store.Tenant{}, err
	}
	t.CreatedAt = t.CreatedAt.UTC()
	return t, nil
}

// Tenant implements store.Store.
func (s *Store) Tenant(ctx context.Context, id string) (store.Tenant, error) {
	t, err := scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id))
	if err != nil {
		return store.Tenant{}, fmt.Errorf("postgres: tenant %s: %w", id, notFound(err))
	}
	return t, nil
}

// Tenants implements store.Store.
func (s *Store) Tenants(ctx context.Context) ([]store.Tenant, error) {
	out, err := queryAll(ctx, s, scanTenant, `SELECT `+tenantColumns+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("postgres: tenants: %w", err)
	}
	return out, nil
}

// SetPlan implements store.Store.
func (s *Store) SetPlan(ctx context.Context, tenant, plan string) error {
	return s.updateOne(ctx, "set plan of "+tenant, `UPDATE tenants SET plan = $2 WHERE id = $1`, tenant, plan)
}

// SetTenantDisabled implements store.Store.
func (s *Store) SetTenantDisabled(ctx context.Context, tenant string, disabled bool) error {
	return s.updateOne(ctx, "disable "+tenant, `UPDATE tenants SET disabled = $2 WHERE id = $1`, tenant, disabled)
}

// TouchKey implements store.Store.
func (s *Store) TouchKey(ctx context.Context, keyID string, at time.Time) error {
	if _, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = $2
		WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)`, keyID, ts(at)); err != nil {
		return fmt.Errorf("postgres: touch key %s: %w", keyID, err)
	}
	return nil
}

// CreateAccount implements store.Store. The UNIQUE constraints on email
// and tenant decide a race between nodes.
func (s *Store) CreateAccount(ctx context.Context, a store.Account, plan string) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO tenants (id, plan, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING`, a.Tenant, plan, ts(a.CreatedAt)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO accounts (id, email, name, password_hash, tenant, role, verified_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			a.ID, a.Email, a.Name, a.PasswordHash, a.Tenant, a.Role, nullTime(a.VerifiedAt), ts(a.CreatedAt))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" { // unique_violation
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: create account: %w", err)
	}
	return nil
}

const accountColumns = `id, email, name, password_hash, tenant, role, verified_at, created_at`

func scanAccount(row pgx.Row) (store.Account, error) {
	var (
		a        store.Account
		verified *time.Time
	)
	if err := row.Scan(&a.ID, &a.Email, &a.Name, &a.PasswordHash, &a.Tenant, &a.Role, &verified, &a.CreatedAt); err != nil {
		return store.Account{}, err
	}
	a.VerifiedAt = optTime(verified)
	a.CreatedAt = a.CreatedAt.UTC()
	return a, nil
}

// AccountByEmail implements store.Store.
func (s *Store) AccountByEmail(ctx context.Context, email string) (store.Account, error) {
	a, err := scanAccount(s.pool.QueryRow(ctx, `SELECT `+accountColumns+` FROM accounts WHERE email = $1`,
		strings.ToLower(email)))
	if err != nil {
		return store.Account{}, fmt.Errorf("postgres: account by email: %w", notFound(err))
	}
	return a, nil
}

// AccountByID implements store.Store.
func (s *Store) AccountByID(ctx context.Context, id string) (store.Account, error) {
	a, err := scanAccount(s.pool.QueryRow(ctx, `SELECT `+accountColumns+` FROM accounts WHERE id = $1`, id))
	if err != nil {
		return store.Account{}, fmt.Errorf("postgres: account %s: %w", id, notFound(err))
	}
	return a, nil
}

// ListAccounts implements store.Store.
func (s *Store) ListAccounts(ctx context.Context) ([]store.Account, error) {
	out, err := queryAll(ctx, s, scanAccount, `SELECT `+accountColumns+` FROM accounts ORDER BY email`)
	if err != nil {
		return nil, fmt.Errorf("postgres: list accounts: %w", err)
	}
	return out, nil
}

// SetPassword implements store.Store.
func (s *Store) SetPassword(ctx context.Context, accountID, hash string) error {
	return s.updateOne(ctx, "set password", `UPDATE accounts SET password_hash = $2 WHERE id = $1`, accountID, hash)
}

// MarkVerified implements store.Store.
func (s *Store) MarkVerified(ctx context.Context, accountID string, at time.Time) error {
	return s.updateOne(ctx, "mark verified", `UPDATE accounts SET verified_at = coalesce(verified_at, $2) WHERE id = $1`, accountID, ts(at))
}

// SetRole implements store.Store.
func (s *Store) SetRole(ctx context.Context, accountID, role string) error {
	return s.updateOne(ctx, "set role", `UPDATE accounts SET role = $2 WHERE id = $1`, accountID, role)
}

// CreateSession implements store.Store.
func (s *Store) CreateSession(ctx context.Context, se store.Session) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO sessions (hash, account_id, csrf, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5)`, se.Hash[:], se.AccountID, se.CSRF, ts(se.CreatedAt), ts(se.ExpiresAt)); err != nil {
		return fmt.Errorf("postgres: create session: %w", err)
	}
	return nil
}

// SessionByHash implements store.Store.
func (s *Store) SessionByHash(ctx context.Context, hash [32]byte, now time.Time) (store.Session, error) {
	var (
		se store.Session
		h  []byte
	)
	err := s.pool.QueryRow(ctx, `SELECT hash, account_id, csrf, created_at, expires_at FROM sessions
		WHERE hash = $1 AND expires_at > $2`, hash[:], ts(now)).Scan(&h, &se.AccountID, &se.CSRF, &se.CreatedAt, &se.ExpiresAt)
	if err != nil {
		return store.Session{}, fmt.Errorf("postgres: session: %w", notFound(err))
	}
	copy(se.Hash[:], h)
	se.CreatedAt, se.ExpiresAt = se.CreatedAt.UTC(), se.ExpiresAt.UTC()
	return se, nil
}

// DeleteSession implements store.Store.
func (s *Store) DeleteSession(ctx context.Context, hash [32]byte) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE hash = $1`, hash[:]); err != nil {
		return fmt.Errorf("postgres: delete session: %w", err)
	}
	return nil
}

// DeleteSessions implements store.Store.
func (s *Store) DeleteSessions(ctx context.Context, accountID string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE account_id = $1`, accountID); err != nil {
		return fmt.Errorf("postgres: delete sessions: %w", err)
	}
	return nil
}

// CreateToken implements store.Store.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	if _, err := s.pool.Exec(ctx, `INSERT INTO tokens (hash, kind, email, account_id, tenant, plan, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, t.Hash[:], t.Kind, t.Email, t.AccountID, t.Tenant, t.Plan,
		ts(t.CreatedAt), ts(t.ExpiresAt)); err != nil {
		return fmt.Errorf("postgres: create token: %w", err)
	}
	return nil
}

const tokenColumns = `hash, kind, email, account_id, tenant, plan, created_at, expires_at`

func scanToken(row pgx.Row) (store.Token, error) {
	var (
		t store.Token
		h []byte
	)
	if err := row.Scan(&h, &t.Kind, &t.Email, &t.AccountID, &t.Tenant, &t.Plan, &t.CreatedAt, &t.ExpiresAt); err != nil {
		return store.Token{}, err
	}
	copy(t.Hash[:], h)
	t.CreatedAt, t.ExpiresAt = t.CreatedAt.UTC(), t.ExpiresAt.UTC()
	return t, nil
}

// UseToken implements store.Store: one UPDATE ... RETURNING, so exactly
// one caller (on any node) consumes the token.
func (s *Store) UseToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `UPDATE tokens SET used_at = $3
		WHERE hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3
		RETURNING `+tokenColumns, hash[:], kind, ts(at)))
	if err != nil {
		return store.Token{}, fmt.Errorf("postgres: use token: %w", notFound(err))
	}
	return t, nil
}

// PeekToken implements store.Store.
func (s *Store) PeekToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens
		WHERE hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3`, hash[:], kind, ts(at)))
	if err != nil {
		return store.Token{}, fmt.Errorf("postgres: peek token: %w", notFound(err))
	}
	return t, nil
}

// PurgeExpired implements store.Store.
func (s *Store) PurgeExpired(ctx context.Context, now time.Time) (sessions, tokens int64, err error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE expires_at <= $1`, ts(now))
	if err != nil {
		return 0, 0, fmt.Errorf("postgres: purge expired sessions: %w", err)
	}
	sessions = tag.RowsAffected()
	if tag, err = s.pool.Exec(ctx, `DELETE FROM tokens WHERE used_at IS NOT NULL OR expires_at <= $1`, ts(now)); err != nil {
		return 0, 0, fmt.Errorf("postgres: purge expired tokens: %w", err)
	}
	return sessions, tag.RowsAffected(), nil
}

// updateOne runs an UPDATE that must touch exactly one row (ErrNotFound
// otherwise).
func (s *Store) updateOne(ctx context.Context, what, query string, args ...any) error {
	tag, err := s.pool.Exec(ctx, query, args...)
	if err == nil && tag.RowsAffected() == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", what, err)
	}
	return nil
}

func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := ts(t)
	return &u
}

func queryAll[T any](ctx context.Context, s *Store, scan func(pgx.Row) (T, error), query string, args ...any) ([]T, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
}
