package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// CreateTenant implements store.Store.
func (s *Store) CreateTenant(ctx context.Context, t store.Tenant) error {
	res, err := s.w.ExecContext(ctx, `INSERT INTO tenants (id, plan, created_at, disabled) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, t.ID, t.Plan, micros(t.CreatedAt), t.Disabled)
	if err == nil {
		err = oneRow(res, store.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("sqlite: create tenant %s: %w", t.ID, err)
	}
	return nil
}

const tenantColumns = `id, plan, disabled, created_at`

func scanTenant(row interface{ Scan(...any) error }) (store.Tenant, error) {
	var (
		t       store.Tenant
		created int64
	)
	if err := row.Scan(&t.ID, &t.Plan, &t.Disabled, &created); err != nil {
		return store.Tenant{}, err
	}
	t.CreatedAt = fromMicros(created)
	return t, nil
}

// Tenant implements store.Store.
func (s *Store) Tenant(ctx context.Context, id string) (store.Tenant, error) {
	t, err := scanTenant(s.r.QueryRowContext(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id))
	if err != nil {
		return store.Tenant{}, fmt.Errorf("sqlite: tenant %s: %w", id, notFound(err))
	}
	return t, nil
}

// Tenants implements store.Store.
func (s *Store) Tenants(ctx context.Context) ([]store.Tenant, error) {
	out, err := queryAll(ctx, s.r, scanTenant, `SELECT `+tenantColumns+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: tenants: %w", err)
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
	if _, err := s.w.ExecContext(ctx, `UPDATE api_keys SET last_used_at = $2
		WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)`, keyID, micros(at)); err != nil {
		return fmt.Errorf("sqlite: touch key %s: %w", keyID, err)
	}
	return nil
}

// CreateAccount implements store.Store.
func (s *Store) CreateAccount(ctx context.Context, a store.Account, plan string) error {
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenants (id, plan, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING`, a.Tenant, plan, micros(a.CreatedAt)); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM accounts WHERE email = $1 OR tenant = $2`,
			a.Email, a.Tenant).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return store.ErrExists
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO accounts (id, email, name, password_hash, tenant, role, verified_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			a.ID, a.Email, a.Name, a.PasswordHash, a.Tenant, a.Role, nullMicros(a.VerifiedAt), micros(a.CreatedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: create account: %w", err)
	}
	return nil
}

const accountColumns = `id, email, name, password_hash, tenant, role, verified_at, created_at`

func scanAccount(row interface{ Scan(...any) error }) (store.Account, error) {
	var (
		a        store.Account
		verified sql.NullInt64
		created  int64
	)
	if err := row.Scan(&a.ID, &a.Email, &a.Name, &a.PasswordHash, &a.Tenant, &a.Role, &verified, &created); err != nil {
		return store.Account{}, err
	}
	a.VerifiedAt = optMicros(verified)
	a.CreatedAt = fromMicros(created)
	return a, nil
}

// AccountByEmail implements store.Store.
func (s *Store) AccountByEmail(ctx context.Context, email string) (store.Account, error) {
	a, err := scanAccount(s.r.QueryRowContext(ctx, `SELECT `+accountColumns+` FROM accounts WHERE email = $1`,
		strings.ToLower(email)))
	if err != nil {
		return store.Account{}, fmt.Errorf("sqlite: account by email: %w", notFound(err))
	}
	return a, nil
}

// AccountByID implements store.Store.
func (s *Store) AccountByID(ctx context.Context, id string) (store.Account, error) {
	a, err := scanAccount(s.r.QueryRowContext(ctx, `SELECT `+accountColumns+` FROM accounts WHERE id = $1`, id))
	if err != nil {
		return store.Account{}, fmt.Errorf("sqlite: account %s: %w", id, notFound(err))
	}
	return a, nil
}

// ListAccounts implements store.Store.
func (s *Store) ListAccounts(ctx context.Context) ([]store.Account, error) {
	out, err := queryAll(ctx, s.r, scanAccount, `SELECT `+accountColumns+` FROM accounts ORDER BY email`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: list accounts: %w", err)
	}
	return out, nil
}

// SetPassword implements store.Store.
func (s *Store) SetPassword(ctx context.Context, accountID, hash string) error {
	return s.updateOne(ctx, "set password", `UPDATE accounts SET password_hash = $2 WHERE id = $1`, accountID, hash)
}

// MarkVerified implements store.Store.
func (s *Store) MarkVerified(ctx context.Context, accountID string, at time.Time) error {
	return s.updateOne(ctx, "mark verified", `UPDATE accounts SET verified_at = coalesce(verified_at, $2) WHERE id = $1`, accountID, micros(at))
}

// SetRole implements store.Store.
func (s *Store) SetRole(ctx context.Context, accountID, role string) error {
	return s.updateOne(ctx, "set role", `UPDATE accounts SET role = $2 WHERE id = $1`, accountID, role)
}

// CreateSession implements store.Store.
func (s *Store) CreateSession(ctx context.Context, se store.Session) error {
	if _, err := s.w.ExecContext(ctx, `INSERT INTO sessions (hash, account_id, csrf, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5)`, se.Hash[:], se.AccountID, se.CSRF, micros(se.CreatedAt), micros(se.ExpiresAt)); err != nil {
		return fmt.Errorf("sqlite: create session: %w", err)
	}
	return nil
}

// SessionByHash implements store.Store.
func (s *Store) SessionByHash(ctx context.Context, hash [32]byte, now time.Time) (store.Session, error) {
	var (
		se               store.Session
		h                []byte
		created, expires int64
	)
	err := s.r.QueryRowContext(ctx, `SELECT hash, account_id, csrf, created_at, expires_at FROM sessions
		WHERE hash = $1 AND expires_at > $2`, hash[:], micros(now)).Scan(&h, &se.AccountID, &se.CSRF, &created, &expires)
	if err != nil {
		return store.Session{}, fmt.Errorf("sqlite: session: %w", notFound(err))
	}
	copy(se.Hash[:], h)
	se.CreatedAt, se.ExpiresAt = fromMicros(created), fromMicros(expires)
	return se, nil
}

// DeleteSession implements store.Store.
func (s *Store) DeleteSession(ctx context.Context, hash [32]byte) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM sessions WHERE hash = $1`, hash[:]); err != nil {
		return fmt.Errorf("sqlite: delete session: %w", err)
	}
	return nil
}

// DeleteSessions implements store.Store.
func (s *Store) DeleteSessions(ctx context.Context, accountID string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM sessions WHERE account_id = $1`, accountID); err != nil {
		return fmt.Errorf("sqlite: delete sessions: %w", err)
	}
	return nil
}

// CreateToken implements store.Store.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	if _, err := s.w.ExecContext(ctx, `INSERT INTO tokens (hash, kind, email, account_id, tenant, plan, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, t.Hash[:], t.Kind, t.Email, t.AccountID, t.Tenant, t.Plan,
		micros(t.CreatedAt), micros(t.ExpiresAt)); err != nil {
		return fmt.Errorf("sqlite: create token: %w", err)
	}
	return nil
}

const tokenColumns = `hash, kind, email, account_id, tenant, plan, created_at, expires_at`

func scanToken(row interface{ Scan(...any) error }) (store.Token, error) {
	var (
		t                store.Token
		h                []byte
		created, expires int64
	)
	if err := row.Scan(&h, &t.Kind, &t.Email, &t.AccountID, &t.Tenant, &t.Plan, &created, &expires); err != nil {
		return store.Token{}, err
	}
	copy(t.Hash[:], h)
	t.CreatedAt, t.ExpiresAt = fromMicros(created), fromMicros(expires)
	return t, nil
}

// UseToken implements store.Store: one UPDATE ... RETURNING, so exactly
// one caller consumes the token.
func (s *Store) UseToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	t, err := scanToken(s.w.QueryRowContext(ctx, `UPDATE tokens SET used_at = $3
		WHERE hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3
		RETURNING `+tokenColumns, hash[:], kind, micros(at)))
	if err != nil {
		return store.Token{}, fmt.Errorf("sqlite: use token: %w", notFound(err))
	}
	return t, nil
}

// PeekToken implements store.Store.
func (s *Store) PeekToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	t, err := scanToken(s.r.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens
		WHERE hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3`, hash[:], kind, micros(at)))
	if err != nil {
		return store.Token{}, fmt.Errorf("sqlite: peek token: %w", notFound(err))
	}
	return t, nil
}

// PurgeExpired implements store.Store.
func (s *Store) PurgeExpired(ctx context.Context, now time.Time) (sessions, tokens int64, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE expires_at <= $1`, micros(now))
		if err != nil {
			return err
		}
		if sessions, err = res.RowsAffected(); err != nil {
			return err
		}
		if res, err = tx.ExecContext(ctx, `DELETE FROM tokens WHERE used_at IS NOT NULL OR expires_at <= $1`, micros(now)); err != nil {
			return err
		}
		tokens, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("sqlite: purge expired sessions and tokens: %w", err)
	}
	return sessions, tokens, nil
}

// updateOne runs an UPDATE that must touch exactly one row (ErrNotFound
// otherwise).
func (s *Store) updateOne(ctx context.Context, what, query string, args ...any) error {
	res, err := s.w.ExecContext(ctx, query, args...)
	if err == nil {
		err = oneRow(res, store.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("sqlite: %s: %w", what, err)
	}
	return nil
}

func oneRow(res sql.Result, none error) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return none
	}
	return nil
}

func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

func nullMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return micros(t)
}

func queryAll[T any](ctx context.Context, db *sql.DB, scan func(interface{ Scan(...any) error }) (T, error), query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
