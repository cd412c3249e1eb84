package postgres

import (
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres/pgtest"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storetest"
)

// newDatabase is a database of the test's own; without
// VERTAL_TEST_DATABASE_URL the test is skipped (CI always sets it).
func newDatabase(t *testing.T) string {
	t.Helper()
	if os.Getenv(pgtest.EnvVar) == "" {
		t.Skip("VERTAL_TEST_DATABASE_URL is not set (scripts/postgres.sh prints one)")
	}
	return pgtest.NewDatabase(t)
}

func openStore(t *testing.T, dbURL string) store.Store {
	t.Helper()
	s, err := Open(t.Context(), dbURL)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		return openStore(t, newDatabase(t))
	})
}

// TestNodes runs several Stores, each with its own pool as separate API
// processes would have, on one database.
func TestNodes(t *testing.T) {
	dbURL := newDatabase(t)
	ctx := t.Context()
	t0 := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)

	// Nodes starting together migrate once.
	nodes := make([]store.Store, 4)
	errs := storetest.Parallel(len(nodes), func(i int) error {
		var err error
		nodes[i], err = Open(ctx, dbURL)
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open node %d: %v", i, err)
		}
		t.Cleanup(func() { nodes[i].Close() })
	}
	var versions int
	if err := nodes[0].(*Store).pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if versions != 11 { // 0001_init, 0002_lifecycle, 0003_files, 0004_async, 0005_accounts, 0006_image, 0007_idempotency_pending, 0008_sandboxes, 0009_node_address, 0010_sandbox_access, 0011_execution_network
		t.Errorf("schema_migrations has %d rows, want 10", versions)
	}
	node := func(i int) store.Store { return nodes[i%len(nodes)] }

	t.Run("quota", func(t *testing.T) {
		const n, limit = 150, 100
		errs := storetest.Parallel(n, func(i int) error {
			_, err := node(i).ReserveExecution(ctx, "acme", "2025-03-14", limit)
			return err
		})
		ok, refused := storetest.CountErrs(t, errs, store.ErrQuotaExceeded)
		if ok != limit || refused != n-limit {
			t.Errorf("%d reservations over %d nodes on a quota of %d: %d ran, %d refused", n, len(nodes), limit, ok, refused)
		}
	})

	t.Run("rate window", func(t *testing.T) {
		const n = 40
		counts := make([]int64, n)
		errs := storetest.Parallel(n, func(i int) error {
			var err error
			counts[i], err = node(i).CountRequest(ctx, "acme", t0)
			return err
		})
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(counts)
		for i, c := range counts {
			if c != int64(i+1) {
				t.Fatalf("sorted counts over %d nodes = %v, want 1..%d", len(nodes), counts, n)
			}
		}
	})

	t.Run("keys and revocation", func(t *testing.T) {
		errs := storetest.Parallel(20, func(i int) error {
			_, err := node(i).CreateKey(ctx, storetest.NewKey(fmt.Sprintf("key_%012d", i), "keys", "pro", fmt.Sprint("s", i), t0))
			return err
		})
		if ok, _ := storetest.CountErrs(t, errs, store.ErrTooManyKeys); ok != store.MaxActiveKeys {
			t.Errorf("20 CreateKey over %d nodes: %d created, want %d", len(nodes), ok, store.MaxActiveKeys)
		}

		nk := storetest.NewKey("key_shared000001", "shared", "pro", "shared-secret", t0)
		if _, err := nodes[0].CreateKey(ctx, nk); err != nil {
			t.Fatal(err)
		}
		if _, err := nodes[1].KeyByHash(ctx, nk.Hash); err != nil {
			t.Fatalf("key created on node 0, looked up on node 1: %v", err)
		}
		if err := nodes[1].RevokeKey(ctx, nk.ID, t0); err != nil {
			t.Fatal(err)
		}
		for i, n := range nodes {
			if _, err := n.KeyByHash(ctx, nk.Hash); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("node %d after revocation on node 1: error = %v, want ErrNotFound", i, err)
			}
		}
	})

	t.Run("async claims, settling and batches", func(t *testing.T) {
		const n = 40
		for i := range 3 {
			e := store.Execution{ID: fmt.Sprintf("exe_a%031d", i), Tenant: "acme", Language: "python",
				Status: store.StatusQueued, CreatedAt: t0, Async: true, Request: []byte("{}")}
			if err := nodes[0].CreateExecution(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		// Every node's workers claim the same job: it runs once.
		errs := storetest.Parallel(n, func(i int) error {
			return node(i).ClaimExecution(ctx, "acme", "exe_a0000000000000000000000000000000", fmt.Sprint("node-", i%len(nodes)), t0)
		})
		if ok, refused := storetest.CountErrs(t, errs, store.ErrNotQueued); ok != 1 || refused != n-1 {
			t.Errorf("%d claims of one job over %d nodes: %d won, %d refused; want 1, %d", n, len(nodes), ok, refused, n-1)
		}
		// Every node settles the same dead node's execution: once.
		if err := nodes[1].ClaimExecution(ctx, "acme", "exe_a0000000000000000000000000000001", "node-dead", t0); err != nil {
			t.Fatal(err)
		}
		errs = storetest.Parallel(n, func(i int) error {
			_, err := node(i).AbortExecution(ctx, "acme", "exe_a0000000000000000000000000000001", "error", "node-dead stopped",
				[]string{store.StatusRunning}, t0)
			return err
		})
		if ok, finished := storetest.CountErrs(t, errs, store.ErrFinished); ok != 1 || finished != n-1 {
			t.Errorf("%d aborts of one execution over %d nodes: %d won, %d ErrFinished; want 1, %d", n, len(nodes), ok, finished, n-1)
		}
		// A claim racing a cancel of a queued job: one of them.
		errs = storetest.Parallel(n, func(i int) error {
			if i%2 == 0 {
				return node(i).ClaimExecution(ctx, "acme", "exe_a0000000000000000000000000000002", "node-x", t0)
			}
			_, err := node(i).AbortExecution(ctx, "acme", "exe_a0000000000000000000000000000002", store.StatusCanceled, "canceled",
				[]string{store.StatusQueued}, t0)
			return err
		})
		won := 0
		for _, err := range errs {
			if err == nil {
				won++
			} else if !errors.Is(err, store.ErrNotQueued) && !errors.Is(err, store.ErrFinished) {
				t.Errorf("claim or cancel: %v", err)
			}
		}
		if won != 1 {
			t.Errorf("claims racing cancels over %d nodes: %d won, want 1", len(nodes), won)
		}
		// Batches of 5 on a quota of 52: ten fit, whole.
		errs = storetest.Parallel(n, func(i int) error {
			_, err := node(i).ReserveExecutions(ctx, "batches", "2025-03-14", 5, 52)
			return err
		})
		if ok, _ := storetest.CountErrs(t, errs, store.ErrQuotaExceeded); ok != 10 {
			t.Errorf("batches of 5 on a quota of 52 over %d nodes: %d counted, want 10", len(nodes), ok)
		}
		if u, err := nodes[2].Usage(ctx, "batches", "2025-03-14"); err != nil || u.Executions != 50 {
			t.Errorf("Usage = %+v, %v; want 50 executions", u, err)
		}
	})

	t.Run("webhook secret", func(t *testing.T) {
		const n = 40
		secrets := make([]string, n)
		errs := storetest.Parallel(n, func(i int) error {
			var err error
			secrets[i], _, err = node(i).WebhookSecret(ctx, "acme", func() string { return fmt.Sprint("whsec_", i) }, t0)
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
			if secrets[i] != secrets[0] {
				t.Fatalf("first uses over %d nodes got %q and %q", len(nodes), secrets[0], secrets[i])
			}
		}
		if err := nodes[3].RotateWebhookSecret(ctx, "acme", "whsec_rotated", t0); err != nil {
			t.Fatal(err)
		}
		for i, n := range nodes {
			if got, _, err := n.WebhookSecret(ctx, "acme", func() string { return "whsec_other" }, t0); err != nil || got != "whsec_rotated" {
				t.Errorf("node %d after rotation on node 3: %q, %v", i, got, err)
			}
		}
	})

	t.Run("idempotency", func(t *testing.T) {
		const n = 40
		claimed := make([]bool, n)
		errs := storetest.Parallel(n, func(i int) error {
			var err error
			_, claimed[i], err = node(i).ClaimIdempotency(ctx, "acme", "order-1", "hash", t0, t0.Add(-24*time.Hour), t0.Add(-3*time.Minute))
			return err
		})
		winner := -1
		for i, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
			if claimed[i] {
				if winner >= 0 {
					t.Fatalf("claims %d and %d both won", winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatal("no claim won")
		}

		e := store.Execution{ID: "exe_00000000000000000000000000000001", Tenant: "acme", Language: "python",
			Status: "succeeded", Stdout: "42\n", CreatedAt: t0}
		if err := node(winner).SaveExecution(ctx, e); err != nil {
			t.Fatal(err)
		}
		if err := node(winner).CompleteIdempotency(ctx, "acme", "order-1", e.ID); err != nil {
			t.Fatal(err)
		}
		other := node(winner + 1)
		rec, again, err := other.ClaimIdempotency(ctx, "acme", "order-1", "hash", t0, t0.Add(-24*time.Hour), t0.Add(-3*time.Minute))
		if err != nil || again || rec.ExecutionID != e.ID {
			t.Fatalf("replay on another node = %+v, claimed %v, %v; want %s", rec, again, err, e.ID)
		}
		got, err := other.Execution(ctx, "acme", rec.ExecutionID)
		if err != nil || got.Stdout != e.Stdout {
			t.Errorf("replayed execution on another node = %q, %v", got.Stdout, err)
		}
	})
}

// TestOpenErrorsHideSecrets needs no server: the errors Open returns may
// reach a log, so they must not carry the password.
func TestOpenErrorsHideSecrets(t *testing.T) {
	for _, u := range []string{
		"postgres://vertal:s3cr3t-pw@127.0.0.1:1/vertal?sslmode=disable&connect_timeout=2", // nothing listens
		"postgres://vertal:s3cr3t-pw@127.0.0.1:5432/vertal?sslmode=bogus",                  // unparsable
	} {
		s, err := Open(t.Context(), u)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q): no error", u)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t-pw") {
			t.Errorf("Open error shows the password: %v", err)
		}
	}
}

// TestOpenOldDatabase opens a database migrated and filled as the store
// before internal/store/sqlstore did it (native pgx, timestamptz times): it
// migrates nothing again and every row reads and changes as before.
func TestOpenOldDatabase(t *testing.T) {
	dbURL := newDatabase(t)
	db, err := sql.Open("pgx", dbURL) // the driver postgres.go's stdlib import registers
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	migrated := storetest.MigrateAsOld(t, db, sub, `CREATE TABLE schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`, 0, applied)
	storetest.SeedOldRows(t, db, func(t time.Time) any { return t.UTC() })

	s := openStore(t, dbURL)
	storetest.CheckOldRows(t, s)
	var (
		n    int64
		last time.Time
	)
	if err := db.QueryRowContext(t.Context(), `SELECT count(*), max(applied_at) FROM schema_migrations`).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	if n != int64(migrated) || !last.Equal(applied) {
		t.Errorf("schema_migrations: %d rows, last applied at %v; want %d, all at %v", n, last, migrated, applied)
	}
}

func TestSandboxes(t *testing.T) {
	storetest.RunSandboxes(t, func(t *testing.T) store.Sandboxes {
		return openStore(t, newDatabase(t)).(store.Sandboxes)
	})
}
