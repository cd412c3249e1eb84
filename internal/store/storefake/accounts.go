package storefake

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

type tokenRec struct {
	store.Token
	used bool
}

func (s *Store) CreateTenant(_ context.Context, t store.Tenant) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.tenants[t.ID]; ok {
		return store.ErrExists
	}
	t.CreatedAt = ts(t.CreatedAt)
	s.tenants[t.ID] = t
	return nil
}

func (s *Store) Tenant(_ context.Context, id string) (store.Tenant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tenants[id]
	if !ok {
		return store.Tenant{}, store.ErrNotFound
	}
	return t, nil
}

func (s *Store) Tenants(_ context.Context) ([]store.Tenant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Tenant
	for _, t := range s.tenants {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *Store) updateTenant(id string, fn func(*store.Tenant)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tenants[id]
	if !ok {
		return store.ErrNotFound
	}
	fn(&t)
	s.tenants[id] = t
	return nil
}

func (s *Store) SetPlan(_ context.Context, tenant, plan string) error {
	return s.updateTenant(tenant, func(t *store.Tenant) { t.Plan = plan })
}

func (s *Store) SetTenantDisabled(_ context.Context, tenant string, disabled bool) error {
	return s.updateTenant(tenant, func(t *store.Tenant) { t.Disabled = disabled })
}

func (s *Store) TouchKey(_ context.Context, keyID string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.keys {
		if k.ID == keyID && k.LastUsedAt.Before(at) {
			k.LastUsedAt = ts(at)
		}
	}
	return nil
}

func (s *Store) CreateAccount(_ context.Context, a store.Account, plan string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.accounts {
		if b.Email == a.Email || b.Tenant == a.Tenant || b.ID == a.ID {
			return store.ErrExists
		}
	}
	if _, ok := s.tenants[a.Tenant]; !ok {
		s.tenants[a.Tenant] = store.Tenant{ID: a.Tenant, Plan: plan, CreatedAt: ts(a.CreatedAt)}
	}
	a.CreatedAt, a.VerifiedAt = ts(a.CreatedAt), ts(a.VerifiedAt)
	s.accounts[a.ID] = a
	return nil
}

func (s *Store) AccountByEmail(_ context.Context, email string) (store.Account, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.accounts {
		if a.Email == strings.ToLower(email) {
			return a, nil
		}
	}
	return store.Account{}, store.ErrNotFound
}

func (s *Store) AccountByID(_ context.Context, id string) (store.Account, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.accounts[id]
	if !ok {
		return store.Account{}, store.ErrNotFound
	}
	return a, nil
}

func (s *Store) ListAccounts(_ context.Context) ([]store.Account, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Account
	for _, a := range s.accounts {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Email < out[j].Email })
	return out, nil
}

func (s *Store) updateAccount(id string, fn func(*store.Account)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.accounts[id]
	if !ok {
		return store.ErrNotFound
	}
	fn(&a)
	s.accounts[id] = a
	return nil
}

func (s *Store) SetPassword(_ context.Context, accountID, hash string) error {
	return s.updateAccount(accountID, func(a *store.Account) { a.PasswordHash = hash })
}

func (s *Store) MarkVerified(_ context.Context, accountID string, at time.Time) error {
	return s.updateAccount(accountID, func(a *store.Account) {
		if a.VerifiedAt.IsZero() {
			a.VerifiedAt = ts(at)
		}
	})
}

func (s *Store) SetRole(_ context.Context, accountID, role string) error {
	return s.updateAccount(accountID, func(a *store.Account) { a.Role = role })
}

func (s *Store) CreateSession(_ context.Context, se store.Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	se.CreatedAt, se.ExpiresAt = ts(se.CreatedAt), ts(se.ExpiresAt)
	s.sessions[se.Hash] = se
	return nil
}

func (s *Store) SessionByHash(_ context.Context, hash [32]byte, now time.Time) (store.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.sessions[hash]
	if !ok || !se.ExpiresAt.After(now) {
		return store.Session{}, store.ErrNotFound
	}
	return se, nil
}

func (s *Store) DeleteSession(_ context.Context, hash [32]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, hash)
	return nil
}

func (s *Store) DeleteSessions(_ context.Context, accountID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, se := range s.sessions {
		if se.AccountID == accountID {
			delete(s.sessions, h)
		}
	}
	return nil
}

func (s *Store) CreateToken(_ context.Context, t store.Token) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.CreatedAt, t.ExpiresAt = ts(t.CreatedAt), ts(t.ExpiresAt)
	s.tokens[t.Hash] = &tokenRec{Token: t}
	return nil
}

func (s *Store) token(hash [32]byte, kind string, at time.Time, use bool) (store.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[hash]
	if !ok || t.used || t.Kind != kind || !t.ExpiresAt.After(at) {
		return store.Token{}, store.ErrNotFound
	}
	t.used = use
	return t.Token, nil
}

func (s *Store) UseToken(_ context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	return s.token(hash, kind, at, true)
}

func (s *Store) PeekToken(_ context.Context, hash [32]byte, kind string, at time.Time) (store.Token, error) {
	return s.token(hash, kind, at, false)
}

func (s *Store) PurgeExpired(_ context.Context, now time.Time) (sessions, tokens int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, se := range s.sessions {
		if !se.ExpiresAt.After(now) {
			delete(s.sessions, h)
			sessions++
		}
	}
	for h, t := range s.tokens {
		if t.used || !t.ExpiresAt.After(now) {
			delete(s.tokens, h)
			tokens++
		}
	}
	return sessions, tokens, nil
}
