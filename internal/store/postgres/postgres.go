// Package postgres is the Store for several API nodes sharing one PostgreSQL
// database: the one SQL store (internal/store/sqlstore) with PostgreSQL's
// dialect, over pgx's database/sql driver on a pgx pool that the durable
// queue shares.
//
// Every check-and-update the API relies on across nodes is one statement
// or one transaction that PostgreSQL serializes on a row lock: quota and
// rate-window counters are INSERT ... ON CONFLICT DO UPDATE ... WHERE, key
// creation and rotation lock the tenant's row before counting its active
// keys, an execution's row is locked (SELECT ... FOR UPDATE) before it is
// checked and changed, and an idempotency claim is an upsert that only
// takes over a stale record. Nothing is cached, so a revoked key fails on
// every node at once.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLock is the pg_advisory_xact_lock key that serializes
// migrations when several nodes start at once ("vertal" in ASCII).
const migrationLock int64 = 0x76657274616c

// dialect is PostgreSQL's: timestamptz times, boolean literals, and row
// locks for the check-and-update transactions.
var dialect = sqlstore.Dialect{
	Name: "postgres",
	// Truncating here (PostgreSQL would round) makes both stores return
	// the same instant.
	Time:       func(t time.Time) any { return t.Truncate(time.Microsecond).UTC() },
	ForUpdate:  " FOR UPDATE",
	True:       "true",
	False:      "false",
	EmptyBytes: "''",
	MigrationsTable: `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    BIGINT PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
	// Held to commit: a second node starting now waits here, then finds
	// every version recorded.
	LockMigrations: fmt.Sprintf(`SELECT pg_advisory_xact_lock(%d)`, migrationLock),
	UniqueViolation: func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "23505" // unique_violation
	},
}

// Store is the PostgreSQL store.Store.
type Store struct {
	*sqlstore.Store
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) a pool to the database at url and applies the
// embedded migrations. The URL may carry pgxpool settings such as
// pool_max_conns.
func Open(ctx context.Context, url string) (store.Store, error) {
	s, err := open(ctx, url)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The parse error may quote the URL, password included.
		return nil, errors.New("postgres: open: invalid database URL")
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	// database/sql over the pool: each statement borrows one of the
	// pool's connections, with the statement cache pgx keeps on it.
	db := stdlib.OpenDBFromPool(pool)
	s, err := sqlstore.Open(ctx, dialect, db, db, migrationFiles)
	if err != nil {
		db.Close()
		pool.Close()
		return nil, err
	}
	return &Store{Store: s, pool: pool}, nil
}

// Close closes the store and its pool.
func (s *Store) Close() error {
	err := s.Store.Close()
	s.pool.Close()
	return err
}
