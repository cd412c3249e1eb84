package sqlstore

import (
	"context"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// CreateTenant implements store.Tenants.
func (s *Store) CreateTenant(ctx context.Context, t store.Tenant) error {
	if err := s.writer().one(ctx, store.ErrExists, `INSERT INTO tenants (id, plan, created_at, disabled) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING`, t.ID, t.Plan, s.at(t.CreatedAt), t.Disabled); err != nil {
		return s.errf("create tenant "+t.ID, err)
	}
	return nil
}

const tenantColumns = `id, plan, disabled, created_at`

func scanTenant(row scanner) (store.Tenant, error) {
	var t store.Tenant
	err := row.Scan(&t.ID, &t.Plan, &t.Disabled, tm(&t.CreatedAt))
	return t, err
}

// Tenant implements store.Tenants.
func (s *Store) Tenant(ctx context.Context, id string) (store.Tenant, error) {
	t, err := scanTenant(s.reader().row(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id))
	if err != nil {
		return store.Tenant{}, s.errf("tenant "+id, notFound(err))
	}
	return t, nil
}

// Tenants implements store.Tenants.
func (s *Store) Tenants(ctx context.Context) ([]store.Tenant, error) {
	out, err := queryAll(ctx, s.reader(), scanTenant, `SELECT `+tenantColumns+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, s.errf("tenants", err)
	}
	return out, nil
}

// SetPlan implements store.Tenants.
func (s *Store) SetPlan(ctx context.Context, tenant, plan string) error {
	return s.updateOne(ctx, "set plan of "+tenant, `UPDATE tenants SET plan = $2 WHERE id = $1`, tenant, plan)
}

// SetTenantDisabled implements store.Tenants.
func (s *Store) SetTenantDisabled(ctx context.Context, tenant string, disabled bool) error {
	return s.updateOne(ctx, "disable "+tenant, `UPDATE tenants SET disabled = $2 WHERE id = $1`, tenant, disabled)
}

// CreateAccount implements store.Accounts. The UNIQUE constraints on
// email and tenant decide a race.
func (s *Store) CreateAccount(ctx context.Context, a store.Account, plan string) error {
	err := s.tx(ctx, func(c conn) error {
		if _, err := c.exec(ctx, `INSERT INTO tenants (id, plan, created_at) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO NOTHING`, a.Tenant, plan, s.at(a.CreatedAt)); err != nil {
			return err
		}
		_, err := c.exec(ctx, `INSERT INTO accounts (id, email, name, password_hash, tenant, role, verified_at, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			a.ID, a.Email, a.Name, a.PasswordHash, a.Tenant, a.Role, s.nullAt(a.VerifiedAt), s.at(a.CreatedAt))
		if err != nil && s.d.UniqueViolation(err) {
			return store.ErrExists
		}
		return err
	})
	if err != nil {
		return s.errf("create account", err)
	}
	return nil
}

const accountColumns = `id, email, name, password_hash, tenant, role, verified_at, created_at`

func scanAccount(row scanner) (store.Account, error) {
	var a store.Account
	err := row.Scan(&a.ID, &a.Email, &a.Name, &a.PasswordHash, &a.Tenant, &a.Role, tm(&a.VerifiedAt), tm(&a.CreatedAt))
	return a, err
}

// AccountByEmail implements store.Accounts.
func (s *Store) AccountByEmail(ctx context.Context, email string) (store.Account, error) {
	a, err := scanAccount(s.reader().row(ctx, `SELECT `+accountColumns+` FROM accounts WHERE email = $1`,
		strings.ToLower(email)))
	if err != nil {
		return store.Account{}, s.errf("account by email", notFound(err))
	}
	return a, nil
}

// AccountByID implements store.Accounts.
func (s *Store) AccountByID(ctx context.Context, id string) (store.Account, error) {
	a, err := scanAccount(s.reader().row(ctx, `SELECT `+accountColumns+` FROM accounts WHERE id = $1`, id))
	if err != nil {
		return store.Account{}, s.errf("account "+id, notFound(err))
	}
	return a, nil
}

// ListAccounts implements store.Accounts.
func (s *Store) ListAccounts(ctx context.Context) ([]store.Account, error) {
	out, err := queryAll(ctx, s.reader(), scanAccount, `SELECT `+accountColumns+` FROM accounts ORDER BY email`)
	if err != nil {
		return nil, s.errf("list accounts", err)
	}
	return out, nil
}

// SetPassword implements store.Accounts.
func (s *Store) SetPassword(ctx context.Context, accountID, hash string) error {
	return s.updateOne(ctx, "set password", `UPDATE accounts SET password_hash = $2 WHERE id = $1`, accountID, hash)
}

// MarkVerified implements store.Accounts.
func (s *Store) MarkVerified(ctx context.Context, accountID string, at time.Time) error {
	return s.updateOne(ctx, "mark verified", `UPDATE accounts SET verified_at = coalesce(verified_at, $2) WHERE id = $1`, accountID, s.at(at))
}

// SetRole implements store.Accounts.
func (s *Store) SetRole(ctx context.Context, accountID, role string) error {
	return s.updateOne(ctx, "set role", `UPDATE accounts SET role = $2 WHERE id = $1`, accountID, role)
}

// updateOne runs an UPDATE that must touch exactly one row (ErrNotFound
// otherwise).
func (s *Store) updateOne(ctx context.Context, what, query string, args ...any) error {
	if err := s.writer().one(ctx, store.ErrNotFound, query, args...); err != nil {
		return s.errf(what, err)
	}
	return nil
}

// CreateSession implements store.Sessions.
func (s *Store) CreateSession(ctx context.Context, se store.Session) error {
	if _, err := s.writer().exec(ctx, `INSERT INTO sessions (hash, account_id, csrf, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5)`, se.Hash[:], se.AccountID, se.CSRF, s.at(se.CreatedAt), s.at(se.ExpiresAt)); err != nil {
		return s.errf("create session", err)
	}
	return nil
}

// SessionByHash implements store.Sessions.
func (s *Store) SessionByHash(ctx context.Context, hash [32]byte, now time.Time) (store.Session, error) {
	var (
		se store.Session
		h  []byte
	)
	err := s.reader().row(ctx, `SELECT hash, account_id, csrf, created_at, expires_at FROM sessions
		WHERE hash = $1 AND expires_at > $2`, hash[:], s.at(now)).Scan(&h, &se.AccountID, &se.CSRF, tm(&se.CreatedAt), tm(&se.ExpiresAt))
	if err != nil {
		return store.Session{}, s.errf("session", notFound(err))
	}
	copy(se.Hash[:], h)
	return se, nil
}

// DeleteSession implements store.Sessions.
func (s *Store) DeleteSession(ctx context.Context, hash [32]byte) error {
	if _, err := s.writer().exec(ctx, `DELETE FROM sessions WHERE hash = $1`, hash[:]); err != nil {
		return s.errf("delete session", err)
	}
	return nil
}

// DeleteSessions implements store.Sessions.
func (s *Store) DeleteSessions(ctx context.Context, accountID string) error {
	if _, err := s.writer().exec(ctx, `DELETE FROM sessions WHERE account_id = $1`, accountID); err != nil {
		return s.errf("delete sessions", err)
	}
	return nil
}

// CreateToken implements store.Sessions.
func (s *Store) CreateToken(ctx context.Context, t store.Token) error {
	if _, err := s.writer().exec(ctx, `INSERT INTO tokens (hash, kind, email, account_id, tenant, plan, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, t.Hash[:], t.Kind, t.Email, t.AccountID, t.Tenant, t.Plan,
		s.at(t.CreatedAt), s.at(t.ExpiresAt)); err != nil {
		return s.errf("create token", err)
	}
	return nil
}

const tokenColumns = `hash, kind, email, account_id, tenant, plan, created_at, expires_at`

func scanToken(row scanner) (store.Token, error) {
	var (
		t store.Token
		h []byte
	)
	if err := row.Scan(&h, &t.Kind, &t.Email, &t.AccountID, &t.Tenant, &t.Plan, tm(&t.CreatedAt), tm(&t.ExpiresAt)); err != nil {
		return store.Token{}, err
	}
	copy(t.Hash[:], h)
	return t, nil
}

// UseToken implements store.Sessions: one UPDATE ... RETURNING, so exactly
// one caller (on any node) consumes the token.
func (s *Store) UseToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	t, err := scanToken(s.writer().row(ctx, `UPDATE tokens SET used_at = $3
		WHERE hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3
		RETURNING `+tokenColumns, hash[:], kind, s.at(at)))
	if err != nil {
		return store.Token{}, s.errf("use token", notFound(err))
	}
	return t, nil
}

// PeekToken implements store.Sessions.
func (s *Store) PeekToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	t, err := scanToken(s.reader().row(ctx, `SELECT `+tokenColumns+` FROM tokens
		WHERE hash = $1 AND kind = $2 AND used_at IS NULL AND expires_at > $3`, hash[:], kind, s.at(at)))
	if err != nil {
		return store.Token{}, s.errf("peek token", notFound(err))
	}
	return t, nil
}

// PurgeExpired implements store.Sessions.
func (s *Store) PurgeExpired(ctx context.Context, now time.Time) (sessions, tokens int64, err error) {
	err = s.tx(ctx, func(c conn) error {
		var err error
		if sessions, err = c.affected(ctx, `DELETE FROM sessions WHERE expires_at <= $1`, s.at(now)); err != nil {
			return err
		}
		tokens, err = c.affected(ctx, `DELETE FROM tokens WHERE used_at IS NOT NULL OR expires_at <= $1`, s.at(now))
		return err
	})
	if err != nil {
		return 0, 0, s.errf("purge expired sessions and tokens", err)
	}
	return sessions, tokens, nil
}
