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

// lookup returns m[id] under s.mu, or store.ErrNotFound.
func lookup[T any](s *Store, m map[string]T, id string) (T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := m[id]
	if !ok {
		var zero T
		return zero, store.ErrNotFound
	}
	return v, nil
}

// sortedValues returns m's values under s.mu, ordered by key (nil when m
// is empty).
func sortedValues[T any](s *Store, m map[string]T, key func(T) string) []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []T
	for _, v := range m {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out
}

// update applies fn to m[id] under s.mu, or returns store.ErrNotFound.
func update[T any](s *Store, m map[string]T, id string, fn func(*T)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := m[id]
	if !ok {
		return store.ErrNotFound
	}
	fn(&v)
	m[id] = v
	return nil
}

func (s *Store) Tenant(_ context.Context, id string) (store.Tenant, error) {
	return lookup(s, s.tenants, id)
}

func (s *Store) Tenants(_ context.Context) ([]store.Tenant, error) {
	return sortedValues(s, s.tenants, func(t store.Tenant) string { return t.ID }), nil
}

func (s *Store) SetPlan(_ context.Context, tenant, plan string) error {
	return update(s, s.tenants, tenant, func(t *store.Tenant) { t.Plan = plan })
}

func (s *Store) SetTenantDisabled(_ context.Context, tenant string, disabled bool) error {
	return update(s, s.tenants, tenant, func(t *store.Tenant) { t.Disabled = disabled })
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
	return lookup(s, s.accounts, id)
}

func (s *Store) ListAccounts(_ context.Context) ([]store.Account, error) {
	return sortedValues(s, s.accounts, func(a store.Account) string { return a.Email }), nil
}

func (s *Store) SetPassword(_ context.Context, accountID, hash string) error {
	return update(s, s.accounts, accountID, func(a *store.Account) { a.PasswordHash = hash })
}

func (s *Store) MarkVerified(_ context.Context, accountID string, at time.Time) error {
	return update(s, s.accounts, accountID, func(a *store.Account) {
		if a.VerifiedAt.IsZero() {
			a.VerifiedAt = ts(at)
		}
	})
}

func (s *Store) SetRole(_ context.Context, accountID, role string) error {
	return update(s, s.accounts, accountID, func(a *store.Account) { a.Role = role })
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
