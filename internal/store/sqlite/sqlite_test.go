package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storetest"
)

func openTemp(t *testing.T, path string) store.Store {
	t.Helper()
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return openTemp(t, filepath.Join(t.TempDir(), "vertal.db"))
	})
}

// TestReopen checks that migrations are recorded once and data survives.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "vertal.db")
	ctx := t.Context()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if _, err := s.ReserveExecution(ctx, "acme", "2025-03-14", 10); err != nil {
		t.Fatalf("ReserveExecution: %v", err)
	}
	s.Close()

	s2 := openTemp(t, path)
	if used, err := s2.ReserveExecution(ctx, "acme", "2025-03-14", 10); err != nil || used != 2 {
		t.Errorf("ReserveExecution after reopen = %d, %v; want 2, nil", used, err)
	}
	var n int
	if err := s2.(*Store).w.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 11 { // 0001_init, 0002_lifecycle, 0003_files, 0004_async, 0005_accounts, 0006_image, 0007_idempotency_pending, 0008_sandboxes, 0009_node_address, 0010_sandbox_access, 0011_execution_network
		t.Errorf("schema_migrations has %d rows, want 10", n)
	}
}

// TestTwoStoresOneFile is a server and a `vertal create-key` (or two
// servers) on one file: opening at once must migrate once, and the quota
// and key limit hold across both.
func TestTwoStoresOneFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vertal.db")
	stores := make([]store.Store, 4)
	errs := storetest.Parallel(len(stores), func(i int) error {
		var err error
		stores[i], err = Open(context.Background(), path)
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		t.Cleanup(func() { stores[i].Close() })
	}

	const n, limit = 150, 100
	errs = storetest.Parallel(n, func(i int) error {
		_, err := stores[i%len(stores)].ReserveExecution(context.Background(), "acme", "2025-03-14", limit)
		return err
	})
	ok, refused := storetest.CountErrs(t, errs, store.ErrQuotaExceeded)
	if ok != limit || refused != n-limit {
		t.Errorf("%d reservations over %d stores on a quota of %d: %d ran, %d refused", n, len(stores), limit, ok, refused)
	}

	errs = storetest.Parallel(20, func(i int) error {
		_, err := stores[i%len(stores)].CreateKey(context.Background(),
			storetest.NewKey(fmt.Sprintf("key_%012d", i), "acme", "free", fmt.Sprint("s", i), time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)))
		return err
	})
	ok, refused = storetest.CountErrs(t, errs, store.ErrTooManyKeys)
	if ok != store.MaxActiveKeys {
		t.Errorf("20 CreateKey over %d stores: %d created, %d refused; want %d created", len(stores), ok, refused, store.MaxActiveKeys)
	}
}

func TestOpenInvalidPath(t *testing.T) {
	for _, path := range []string{"", filepath.Join(t.TempDir(), "a?b.db")} {
		if s, err := Open(t.Context(), path); err == nil {
			s.Close()
			t.Errorf("Open(%q): no error", path)
		} else if errors.Is(err, store.ErrNotFound) {
			t.Errorf("Open(%q): %v", path, err)
		}
	}
}

// oldMigrationsTable is schema_migrations as the store before sqlstore
// created it.
const oldMigrationsTable = `CREATE TABLE schema_migrations (
	version    INTEGER PRIMARY KEY,
	name       TEXT NOT NULL,
	applied_at INTEGER NOT NULL)`

// migrateAsOld makes a database at a new path with the migrations below
// version before (all for 0), recorded at applied_at 1000, and returns it
// open, with its path and how many migrations it has.
func migrateAsOld(t *testing.T, before int64) (*sql.DB, string, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vertal.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	return db, path, storetest.MigrateAsOld(t, db, sub, oldMigrationsTable, before, int64(1000))
}

// TestUpgradeTo0004 opens a database made by the migrations before 0004
// with an execution in it: the row reads back as a sync execution without
// a webhook, and the new methods work on it.
func TestUpgradeTo0004(t *testing.T) {
	ctx := t.Context()
	db, path, _ := migrateAsOld(t, 4)
	if _, err := db.ExecContext(ctx, `INSERT INTO executions (id, tenant, key_id, request_id, language, status, stdout, stderr,
		exit_code, duration_ms, truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes, created_at, started_at)
		VALUES ('exe_old', 'acme', 'key_1', 'req_1', 'python', 'running', x'', x'', 0, 0, 0, 0, 0, 0, 1000000, 1000000)`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s := openTemp(t, path)
	got, err := s.Execution(ctx, "acme", "exe_old")
	if err != nil {
		t.Fatal(err)
	}
	if got.Image != "" || got.ImageVersion != "" {
		t.Errorf("row from before 0006 = image %q version %q; want none", got.Image, got.ImageVersion)
	}
	if got.Async || got.Request != nil || got.Owner != "" || got.Reason != "" || got.Webhook != nil {
		t.Errorf("row from before 0004 = async %v, request %q, owner %q, reason %q, webhook %+v; want none",
			got.Async, got.Request, got.Owner, got.Reason, got.Webhook)
	}
	if _, err := s.AbortExecution(ctx, "acme", "exe_old", "error", "server restarted", []string{store.StatusRunning}, time.Unix(2, 0)); err != nil {
		t.Errorf("AbortExecution of a row from before 0004: %v", err)
	}
}

// TestOpenOldDatabase opens a database migrated and filled as the store
// before internal/store/sqlstore did it (times as Unix microseconds,
// booleans as 0 and 1): it migrates nothing again and every row reads and
// changes as before.
func TestOpenOldDatabase(t *testing.T) {
	db, path, migrated := migrateAsOld(t, 0)
	storetest.SeedOldRows(t, db, func(t time.Time) any { return t.UnixMicro() })
	db.Close()

	s := openTemp(t, path)
	storetest.CheckOldRows(t, s)
	var n, applied int64
	if err := s.(*Store).w.QueryRowContext(t.Context(), `SELECT count(*), max(applied_at) FROM schema_migrations`).Scan(&n, &applied); err != nil {
		t.Fatal(err)
	}
	if n != int64(migrated) || applied != 1000 {
		t.Errorf("schema_migrations: %d rows, last applied at %d; want %d, all at 1000", n, applied, migrated)
	}
}

func TestSandboxes(t *testing.T) {
	storetest.RunSandboxes(t, func(t *testing.T) store.Sandboxes {
		return openTemp(t, filepath.Join(t.TempDir(), "vertal.db")).(store.Sandboxes)
	})
}
