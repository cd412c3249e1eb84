package storetest

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"io/fs"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/migrations"
)

// The rows of a database written before the stores became one
// (internal/store/sqlstore, issue 21), as the SQLite and PostgreSQL
// stores of that time wrote them, so that a database of an existing
// installation is known to open and keep working.
var (
	oldT0      = time.Date(2025, 3, 14, 12, 0, 0, 123456000, time.UTC)
	oldKeyHash = sha256.Sum256([]byte("old-secret"))
	oldSession = sha256.Sum256([]byte("old-session"))
	oldToken   = sha256.Sum256([]byte("old-token"))
)

const (
	oldDone    = "exe_0000000000000000000000000000old1"
	oldRunning = "exe_0000000000000000000000000000old2"
)

// MigrateAsOld applies the migrations in fsys below version before (all
// for 0) on db and records each in schema_migrations, created by table,
// with applied as its applied_at: what the stores before sqlstore did. It
// returns how many it applied.
func MigrateAsOld(t *testing.T, db *sql.DB, fsys fs.FS, table string, before int64, applied any) int {
	t.Helper()
	ctx := context.Background()
	ms, err := migrations.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, table); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range ms {
		if before > 0 && m.Version >= before {
			continue
		}
		if _, err := db.ExecContext(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
			m.Version, m.Name, applied); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

// SeedOldRows writes one row of every table with plain SQL on db, whose
// migrations the caller applied and recorded as the old store did. at
// binds a time as that store kept it.
func SeedOldRows(t *testing.T, db *sql.DB, at func(time.Time) any) {
	t.Helper()
	ctx := context.Background()
	t1 := oldT0.Add(time.Minute)
	files := []byte(`[{"path":"out.txt","content":"aGk="}]`)
	for _, r := range []struct {
		q    string
		args []any
	}{
		{`INSERT INTO tenants (id, plan, created_at, disabled) VALUES ($1, $2, $3, $4)`, []any{"acme", "pro", at(oldT0), false}},
		{`INSERT INTO api_keys (id, tenant, hash, created_at, last_used_at) VALUES ($1, $2, $3, $4, $5)`,
			[]any{"key_old000000001", "acme", oldKeyHash[:], at(oldT0), at(t1)}},
		{`INSERT INTO executions (id, tenant, key_id, request_id, language, status, stdout, stderr, exit_code, duration_ms,
			truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes, created_at, started_at, finished_at, files,
			files_truncated, async, request, owner, reason, webhook_url, webhook_delivery_id, webhook_state,
			webhook_attempts, webhook_last_status, webhook_last_error, image, image_version)
			VALUES ($1, 'acme', 'key_old000000001', 'req_1', 'python', 'succeeded', $2, $3, 0, 12, $4, 0.5, 0.25, 1024,
			$5, $6, $7, $8, $9, $10, $11, 'node-old', '', 'https://example.com/hook', 'dlv_1', 'delivered', 1, 200, '',
			'default', 'v1')`,
			[]any{oldDone, []byte("hi\n"), []byte{}, false, at(oldT0), at(oldT0), at(t1), files, true, true, []byte(`{"code":"print(1)"}`)}},
		{`INSERT INTO executions (id, tenant, key_id, request_id, language, status, stdout, stderr, exit_code, duration_ms,
			truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes, created_at, started_at, async, owner)
			VALUES ($1, 'acme', 'key_old000000001', 'req_2', 'python', 'running', $2, $2, 0, 0, $3, 0, 0, 0, $4, $4, $3, 'node-old')`,
			[]any{oldRunning, []byte{}, false, at(oldT0)}},
		{`INSERT INTO usage_days (tenant, day, executions, sandbox_seconds, cpu_seconds) VALUES ('acme', '2025-03-14', 3, 1.5, 0.5)`, nil},
		{`INSERT INTO rate_windows (tenant, window_start, requests) VALUES ('acme', $1, 4)`, []any{at(oldT0.Truncate(time.Minute))}},
		{`INSERT INTO idempotency (tenant, idem_key, body_hash, execution_id, created_at) VALUES ('acme', 'order-1', 'h', $1, $2)`,
			[]any{oldDone, at(oldT0)}},
		{`INSERT INTO nodes (id, seen_at) VALUES ('node-old', $1)`, []any{at(oldT0)}},
		{`INSERT INTO webhook_secrets (tenant, secret, created_at) VALUES ('acme', 'whsec_old', $1)`, []any{at(oldT0)}},
		{`INSERT INTO accounts (id, email, name, password_hash, tenant, role, verified_at, created_at)
			VALUES ('acc_0000000000000001', 'ann@example.com', 'Ann', '$argon2id$x', 'acme', 'user', $1, $1)`, []any{at(oldT0)}},
		{`INSERT INTO sessions (hash, account_id, csrf, created_at, expires_at) VALUES ($1, 'acc_0000000000000001', 'csrf', $2, $3)`,
			[]any{oldSession[:], at(oldT0), at(oldT0.Add(24 * time.Hour))}},
		{`INSERT INTO tokens (hash, kind, email, account_id, tenant, plan, created_at, expires_at)
			VALUES ($1, 'reset', '', 'acc_0000000000000001', '', '', $2, $3)`, []any{oldToken[:], at(oldT0), at(oldT0.Add(time.Hour))}},
	} {
		if _, err := db.ExecContext(ctx, r.q, r.args...); err != nil {
			t.Fatalf("%s: %v", r.q, err)
		}
	}
}

// CheckOldRows reads what SeedOldRows wrote through s, then changes it.
func CheckOldRows(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	t1 := oldT0.Add(time.Minute)

	k, err := s.KeyByHash(ctx, oldKeyHash)
	must(t, "KeyByHash", err)
	if diff := cmp.Diff(store.Key{ID: "key_old000000001", Tenant: "acme", Plan: "pro", CreatedAt: oldT0, LastUsedAt: t1}, k); diff != "" {
		t.Errorf("old key (-want +got):\n%s", diff)
	}
	e, err := s.Execution(ctx, "acme", oldDone)
	must(t, "Execution", err)
	want := store.Execution{ID: oldDone, Tenant: "acme", KeyID: "key_old000000001", RequestID: "req_1", Language: "python",
		Image: "default", ImageVersion: "v1", Status: "succeeded", Stdout: "hi\n", DurationMS: 12, SandboxSeconds: 0.5,
		CPUSeconds: 0.25, PeakMemoryBytes: 1024, CreatedAt: oldT0, StartedAt: oldT0, FinishedAt: t1,
		Files: []store.File{{Path: "out.txt", Content: []byte("hi")}}, FilesTruncated: true, Async: true,
		Request: []byte(`{"code":"print(1)"}`), Owner: "node-old",
		Webhook: &store.Webhook{URL: "https://example.com/hook", DeliveryID: "dlv_1", State: "delivered", Attempts: 1, LastStatus: 200}}
	if diff := cmp.Diff(want, e); diff != "" {
		t.Errorf("old execution (-want +got):\n%s", diff)
	}
	owned, err := s.OwnedExecutions(ctx, "node-old")
	must(t, "OwnedExecutions", err)
	if len(owned) != 1 || owned[0].ID != oldRunning || owned[0].Async {
		t.Errorf("OwnedExecutions = %+v; want only %s, sync", owned, oldRunning)
	}
	if _, err := s.AbortExecution(ctx, "acme", oldRunning, "error", "node-old stopped", []string{store.StatusRunning}, t1); err != nil {
		t.Errorf("AbortExecution of an old row: %v", err)
	}
	if u, err := s.Usage(ctx, "acme", "2025-03-14"); err != nil || u != (store.DayUsage{Executions: 3, SandboxSeconds: 1.5, CPUSeconds: 0.5}) {
		t.Errorf("Usage = %+v, %v", u, err)
	}
	if used, err := s.ReserveExecution(ctx, "acme", "2025-03-14", 10); err != nil || used != 4 {
		t.Errorf("ReserveExecution over an old day = %d, %v; want 4", used, err)
	}
	if n, err := s.CountRequest(ctx, "acme", oldT0.Truncate(time.Minute)); err != nil || n != 5 {
		t.Errorf("CountRequest in an old window = %d, %v; want 5", n, err)
	}
	rec, claimed, err := s.ClaimIdempotency(ctx, "acme", "order-1", "h", t1, oldT0.Add(-time.Hour), oldT0.Add(-time.Minute))
	if err != nil || claimed || rec.ExecutionID != oldDone || !rec.CreatedAt.Equal(oldT0) {
		t.Errorf("ClaimIdempotency of an old record = %+v, claimed %v, %v; want a replay of %s", rec, claimed, err, oldDone)
	}
	if nodes, err := s.StaleNodes(ctx, t1); err != nil || len(nodes) != 1 || nodes[0] != "node-old" {
		t.Errorf("StaleNodes = %v, %v", nodes, err)
	}
	secret, created, err := s.WebhookSecret(ctx, "acme", func() string { return "whsec_new" }, t1)
	if err != nil || secret != "whsec_old" || !created.Equal(oldT0) {
		t.Errorf("WebhookSecret = %q, %v, %v; want the old one", secret, created, err)
	}
	a, err := s.AccountByEmail(ctx, "ann@example.com")
	if err != nil || a.ID != "acc_0000000000000001" || !a.VerifiedAt.Equal(oldT0) || a.Tenant != "acme" {
		t.Errorf("AccountByEmail = %+v, %v", a, err)
	}
	if se, err := s.SessionByHash(ctx, oldSession, t1); err != nil || se.AccountID != a.ID || !se.ExpiresAt.Equal(oldT0.Add(24*time.Hour)) {
		t.Errorf("SessionByHash = %+v, %v", se, err)
	}
	if tok, err := s.UseToken(ctx, oldToken, store.TokenReset, t1); err != nil || tok.AccountID != a.ID {
		t.Errorf("UseToken = %+v, %v", tok, err)
	}
	if _, err := s.CreateKey(ctx, NewKey("key_new000000001", "acme", "", "new-secret", t1)); err != nil {
		t.Errorf("CreateKey for an old tenant: %v", err)
	}
	must(t, "SaveExecution", s.SaveExecution(ctx, execution("exe_00000000000000000000000000000new", "acme", t1)))
}
