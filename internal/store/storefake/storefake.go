// Package storefake is an in-memory store.Store for unit tests of the
// packages above the Store seam (API, MCP, web). One mutex makes every
// method atomic, which is the behaviour the real stores give through their
// database. It is not for production: nothing survives the process.
package storefake

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

type keyRec struct {
	store.Key
	hash [32]byte
}

type dayKey struct{ tenant, day string }

type windowKey struct {
	tenant string
	window time.Time
}

type idemKey struct{ tenant, key string }

// Store is the in-memory fake. The zero value is not usable; call New.
type Store struct {
	mu         sync.Mutex
	keys       []*keyRec
	tenants    map[string]store.Tenant
	accounts   map[string]store.Account // by id
	sessions   map[[32]byte]store.Session
	tokens     map[[32]byte]*tokenRec
	reserved   map[dayKey]int64
	usage      map[dayKey]store.DayUsage
	windows    map[windowKey]int64
	executions map[string]store.Execution
	idem       map[idemKey]store.Idempotency
	pending    map[string]idemKey // execution id -> the running claim that accepted it
	nodes      map[string]time.Time
	nodeAddrs  map[string]string
	secrets    map[string]secretRec
	closed     bool
}

var _ store.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{
		tenants:    map[string]store.Tenant{},
		accounts:   map[string]store.Account{},
		sessions:   map[[32]byte]store.Session{},
		tokens:     map[[32]byte]*tokenRec{},
		reserved:   map[dayKey]int64{},
		usage:      map[dayKey]store.DayUsage{},
		windows:    map[windowKey]int64{},
		executions: map[string]store.Execution{},
		idem:       map[idemKey]store.Idempotency{},
		pending:    map[string]idemKey{},
	}
}

func (s *Store) activeKeys(tenant string) int {
	n := 0
	for _, k := range s.keys {
		if k.Tenant == tenant && k.RevokedAt.IsZero() {
			n++
		}
	}
	return n
}

// clone copies what an Execution shares with its caller (the webhook, the
// request and file bytes), so that neither side's changes reach the
// other, as with a database.
func clone(e store.Execution) store.Execution {
	if e.Webhook != nil {
		w := *e.Webhook
		e.Webhook = &w
	}
	e.Request = slices.Clone(e.Request)
	if e.Files != nil {
		files := make([]store.File, len(e.Files))
		for i, f := range e.Files {
			files[i] = store.File{Path: f.Path, Content: slices.Clone(f.Content)}
		}
		e.Files = files
	}
	return e
}

// ts is a time as the real stores return it: UTC, microseconds.
func ts(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Truncate(time.Microsecond).UTC()
}

func validDay(day string) error {
	if t, err := time.Parse(time.DateOnly, day); err != nil || t.Format(time.DateOnly) != day {
		return fmt.Errorf("storefake: invalid day %q", day)
	}
	return nil
}

// check refuses what the real stores refuse: duplicate ids or hashes, and
// a new tenant without a plan. An empty plan keeps the tenant's plan.
func (s *Store) check(k store.NewKey) error {
	for _, r := range s.keys {
		if r.ID == k.ID || r.hash == k.Hash {
			return fmt.Errorf("storefake: duplicate key %s", k.ID)
		}
	}
	if _, ok := s.tenants[k.Tenant]; !ok && k.Plan == "" {
		return fmt.Errorf("storefake: tenant %s has no plan", k.Tenant)
	}
	return nil
}

func (s *Store) insert(k store.NewKey) store.Key {
	rec := &keyRec{Key: store.Key{ID: k.ID, Tenant: k.Tenant, CreatedAt: ts(k.CreatedAt)}, hash: k.Hash}
	s.keys = append(s.keys, rec)
	if _, ok := s.tenants[k.Tenant]; !ok {
		s.tenants[k.Tenant] = store.Tenant{ID: k.Tenant, Plan: k.Plan, CreatedAt: ts(k.CreatedAt)}
	}
	return s.withPlan(rec.Key)
}

func (s *Store) withPlan(k store.Key) store.Key {
	t := s.tenants[k.Tenant]
	k.Plan, k.TenantDisabled = t.Plan, t.Disabled
	return k
}

func (s *Store) CreateKey(_ context.Context, k store.NewKey) (store.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(k); err != nil {
		return store.Key{}, err
	}
	if s.activeKeys(k.Tenant) >= store.MaxActiveKeys {
		return store.Key{}, store.ErrTooManyKeys
	}
	return s.insert(k), nil
}

func (s *Store) KeyByHash(_ context.Context, hash [32]byte) (store.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.keys {
		if k.hash == hash && k.RevokedAt.IsZero() {
			return s.withPlan(k.Key), nil
		}
	}
	return store.Key{}, store.ErrNotFound
}

func (s *Store) RevokeKey(_ context.Context, keyID string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.keys {
		if k.ID == keyID && k.RevokedAt.IsZero() {
			k.RevokedAt = ts(at)
			return nil
		}
	}
	return store.ErrNotFound
}

func (s *Store) RotateKey(_ context.Context, oldKeyID string, k store.NewKey) (store.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var old *keyRec
	for _, r := range s.keys {
		if r.ID == oldKeyID && r.RevokedAt.IsZero() && r.Tenant == k.Tenant {
			old = r
		}
	}
	if old == nil {
		return store.Key{}, store.ErrNotFound
	}
	if err := s.check(k); err != nil {
		return store.Key{}, err
	}
	old.RevokedAt = ts(k.CreatedAt)
	return s.insert(k), nil
}

func (s *Store) ListKeys(_ context.Context, tenant string) ([]store.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Key
	for _, k := range s.keys {
		if tenant == "" || k.Tenant == tenant {
			out = append(out, s.withPlan(k.Key))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (s *Store) ReserveExecution(_ context.Context, tenant, day string, limit int64) (int64, error) {
	if err := validDay(day); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := dayKey{tenant, day}
	if s.reserved[k] >= limit {
		return s.reserved[k], store.ErrQuotaExceeded
	}
	s.reserved[k]++
	u := s.usage[k]
	u.Executions = s.reserved[k]
	s.usage[k] = u
	return s.reserved[k], nil
}

func (s *Store) RefundExecution(_ context.Context, tenant, day string) error {
	if err := validDay(day); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := dayKey{tenant, day}
	if s.reserved[k] > 0 {
		s.reserved[k]--
		u := s.usage[k]
		u.Executions = s.reserved[k]
		s.usage[k] = u
	}
	return nil
}

func (s *Store) CountRequest(_ context.Context, tenant string, window time.Time) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := windowKey{tenant, window.UTC()}
	s.windows[k]++
	return s.windows[k], nil
}

func (s *Store) CreateExecution(_ context.Context, e store.Execution) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.creatable(e, nil); err != nil {
		return err
	}
	s.create(e)
	return nil
}

// creatable refuses what CreateExecution refuses: a final status or an id
// already stored, or already in batch.
func (s *Store) creatable(e store.Execution, batch map[string]bool) error {
	if store.Final(e.Status) {
		return fmt.Errorf("storefake: create execution %s: status %q is final", e.ID, e.Status)
	}
	if _, dup := s.executions[e.ID]; dup || batch[e.ID] {
		return fmt.Errorf("storefake: duplicate execution %s", e.ID)
	}
	return nil
}

func (s *Store) create(e store.Execution) {
	e = clone(e)
	e.CreatedAt, e.StartedAt, e.FinishedAt = ts(e.CreatedAt), ts(e.StartedAt), time.Time{}
	e.Purged, e.CancelRequested = false, false
	if k := (idemKey{e.Tenant, e.IdempotencyKey}); e.IdempotencyKey != "" && s.idem[k].BodyHash != "" && s.idem[k].ExecutionID == "" {
		s.pending[e.ID] = k
	}
	e.IdempotencyKey = "" // not read back, as in the SQL stores
	s.executions[e.ID] = e
}

// unfinished is tenant's execution id, to be changed: ErrNotFound when
// there is none, ErrFinished (with a copy of it) when it has ended. The
// caller holds s.mu.
func (s *Store) unfinished(tenant, id string) (store.Execution, error) {
	e, ok := s.executions[id]
	switch {
	case !ok || e.Tenant != tenant:
		return store.Execution{}, store.ErrNotFound
	case store.Final(e.Status):
		return clone(e), store.ErrFinished
	}
	return e, nil
}

func (s *Store) StartExecution(_ context.Context, tenant, id string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.unfinished(tenant, id)
	if err != nil {
		return err
	}
	e.Status, e.StartedAt = store.StatusRunning, ts(at)
	s.executions[id] = e
	return nil
}

func (s *Store) SaveExecution(_ context.Context, e store.Execution) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !store.Final(e.Status) {
		return fmt.Errorf("storefake: save execution %s: status %q is not final", e.ID, e.Status)
	}
	old, exists := s.executions[e.ID]
	if exists && (store.Final(old.Status) || old.Tenant != e.Tenant) {
		return fmt.Errorf("storefake: duplicate execution %s", e.ID)
	}
	e = clone(e)
	e.CreatedAt, e.StartedAt, e.FinishedAt = ts(e.CreatedAt), ts(e.StartedAt), ts(e.FinishedAt)
	e.Purged, e.CancelRequested = false, exists && old.CancelRequested
	e.IdempotencyKey = ""
	delete(s.pending, e.ID)
	s.executions[e.ID] = e
	k := dayKey{e.Tenant, e.CreatedAt.UTC().Format("2006-01-02")}
	u := s.usage[k]
	u.SandboxSeconds += e.SandboxSeconds
	u.CPUSeconds += e.CPUSeconds
	in, out := e.NetworkBytes()
	u.NetworkBytesIn += in
	u.NetworkBytesOut += out
	s.usage[k] = u
	return nil
}

func (s *Store) DeleteExecution(_ context.Context, tenant, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.unfinished(tenant, id); err != nil {
		return err
	}
	delete(s.executions, id)
	return nil
}

func (s *Store) RequestCancel(_ context.Context, tenant, id string) (store.Execution, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.unfinished(tenant, id)
	if err != nil {
		return e, err
	}
	e.CancelRequested = true
	s.executions[id] = e
	return clone(e), nil
}

func (s *Store) Execution(_ context.Context, tenant, id string) (store.Execution, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.executions[id]
	if !ok || e.Tenant != tenant {
		return store.Execution{}, store.ErrNotFound
	}
	return clone(e), nil
}

func (s *Store) Usage(_ context.Context, tenant, day string) (store.DayUsage, error) {
	if err := validDay(day); err != nil {
		return store.DayUsage{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usage[dayKey{tenant, day}], nil
}

func (s *Store) Purge(_ context.Context, before time.Time) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before = ts(before) // compared as the real stores keep it
	var n int64
	for id, e := range s.executions {
		if e.CreatedAt.Before(before) && !e.Purged {
			e.Stdout, e.Stderr, e.Files, e.Request, e.Purged = "", "", nil, nil, true
			s.executions[id] = e
			n++
		}
	}
	for k, r := range s.idem {
		if r.CreatedAt.Before(before) {
			delete(s.idem, k)
		}
	}
	for k := range s.windows {
		if k.window.Before(before) {
			delete(s.windows, k)
		}
	}
	return n, nil
}

func (s *Store) ClaimIdempotency(_ context.Context, tenant, key, bodyHash string, now, staleBefore, abandonedBefore time.Time) (store.Idempotency, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := idemKey{tenant, key}
	if r, ok := s.idem[k]; ok {
		stale := r.CreatedAt.Before(ts(staleBefore))
		abandoned := r.ExecutionID == "" && r.CreatedAt.Before(ts(abandonedBefore))
		if !stale && !abandoned {
			return r, false, nil
		}
	}
	r := store.Idempotency{Tenant: tenant, Key: key, BodyHash: bodyHash, CreatedAt: ts(now)}
	s.idem[k] = r
	for id, pk := range s.pending { // a taken-over claim forgets what it had accepted
		if pk == k {
			delete(s.pending, id)
		}
	}
	return r, true, nil
}

func (s *Store) CompleteIdempotency(_ context.Context, tenant, key, executionID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := idemKey{tenant, key}
	r, ok := s.idem[k]
	if !ok {
		return store.ErrNotFound
	}
	r.ExecutionID = executionID
	s.idem[k] = r
	return nil
}

func (s *Store) ReleaseIdempotency(_ context.Context, tenant, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A completed record keeps replaying; only a running claim is dropped.
	if r, ok := s.idem[idemKey{tenant, key}]; ok && r.ExecutionID == "" {
		delete(s.idem, idemKey{tenant, key})
	}
	return nil
}

func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// Executions returns how many executions were saved, for tests that count
// runs.
func (s *Store) Executions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.executions)
}

func (s *Store) ReserveExecutions(_ context.Context, tenant, day string, n, limit int64) (int64, error) {
	if err := validDay(day); err != nil {
		return 0, err
	}
	if n < 1 {
		return 0, fmt.Errorf("storefake: reserve executions: invalid count %d", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := dayKey{tenant, day}
	if s.reserved[k]+n > limit {
		return s.reserved[k], store.ErrQuotaExceeded
	}
	s.reserved[k] += n
	u := s.usage[k]
	u.Executions = s.reserved[k]
	s.usage[k] = u
	return s.reserved[k], nil
}

func (s *Store) RefundExecutions(_ context.Context, tenant, day string, n int64) error {
	if err := validDay(day); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("storefake: refund executions: invalid count %d", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := dayKey{tenant, day}
	s.reserved[k] = max(0, s.reserved[k]-n)
	u := s.usage[k]
	u.Executions = s.reserved[k]
	s.usage[k] = u
	return nil
}

func (s *Store) CreateExecutions(_ context.Context, es []store.Execution) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := map[string]bool{}
	for _, e := range es {
		if err := s.creatable(e, batch); err != nil {
			return err
		}
		batch[e.ID] = true
	}
	for _, e := range es {
		s.create(e)
	}
	return nil
}

func (s *Store) ClaimExecution(_ context.Context, tenant, id, owner string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.unfinished(tenant, id)
	if err != nil {
		return err
	}
	if e.Status != store.StatusQueued {
		return store.ErrNotQueued
	}
	e.Status, e.StartedAt, e.Owner = store.StatusRunning, ts(at), owner
	s.executions[id] = e
	return nil
}

func (s *Store) AbortExecution(_ context.Context, tenant, id, status, reason string, from []string, at time.Time) (store.Execution, error) {
	if !store.Final(status) {
		return store.Execution{}, fmt.Errorf("storefake: abort execution: status %q is not final", status)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.unfinished(tenant, id)
	if err != nil {
		return e, err
	}
	if !slices.Contains(from, e.Status) {
		return clone(e), store.ErrNotQueued
	}
	e.Status, e.Reason, e.FinishedAt = status, reason, ts(at)
	s.executions[id] = e
	if k, ok := s.pending[id]; ok {
		if r, ok := s.idem[k]; ok && r.ExecutionID == "" {
			r.ExecutionID = id
			s.idem[k] = r
		}
		delete(s.pending, id)
	}
	return clone(e), nil
}

func (s *Store) OwnedExecutions(_ context.Context, owner string) ([]store.Execution, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Execution
	for _, e := range s.executions {
		if e.Owner == owner && !store.Final(e.Status) {
			out = append(out, clone(e))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *Store) CountQueuedAsync(_ context.Context, tenant string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, e := range s.executions {
		if e.Tenant == tenant && e.Async && e.Status == store.StatusQueued {
			n++
		}
	}
	return n, nil
}

func (s *Store) QueuedAsync(_ context.Context, before time.Time, limit int) ([]store.Execution, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before = ts(before)
	var out []store.Execution
	for _, e := range s.executions {
		if e.Async && e.Status == store.StatusQueued && e.CreatedAt.Before(before) {
			out = append(out, clone(e))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	if len(out) > max(limit, 0) {
		out = out[:max(limit, 0)]
	}
	return out, nil
}

func (s *Store) UpdateWebhook(_ context.Context, tenant, id string, w store.Webhook) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.executions[id]
	if !ok || e.Tenant != tenant || e.Webhook == nil {
		return store.ErrNotFound
	}
	e.Webhook = &w
	s.executions[id] = e
	return nil
}

func (s *Store) Heartbeat(_ context.Context, node, address string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes == nil {
		s.nodes = map[string]time.Time{}
		s.nodeAddrs = map[string]string{}
	}
	s.nodes[node] = ts(at)
	s.nodeAddrs[node] = address
	return nil
}

func (s *Store) NodeAddress(_ context.Context, node string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.nodeAddrs[node]
	if !ok {
		return "", store.ErrNotFound
	}
	return a, nil
}

func (s *Store) StaleNodes(_ context.Context, before time.Time) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before = ts(before)
	var out []string
	for n, at := range s.nodes {
		if at.Before(before) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (s *Store) ForgetNode(_ context.Context, node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, node)
	delete(s.nodeAddrs, node)
	return nil
}

func (s *Store) WebhookSecret(_ context.Context, tenant string, create func() string, at time.Time) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secrets == nil {
		s.secrets = map[string]secretRec{}
	}
	r, ok := s.secrets[tenant]
	if !ok {
		r = secretRec{secret: create(), created: ts(at)}
		s.secrets[tenant] = r
	}
	return r.secret, r.created, nil
}

func (s *Store) RotateWebhookSecret(_ context.Context, tenant, secret string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secrets == nil {
		s.secrets = map[string]secretRec{}
	}
	s.secrets[tenant] = secretRec{secret: secret, created: ts(at)}
	return nil
}

type secretRec struct {
	secret  string
	created time.Time
}
