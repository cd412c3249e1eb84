// Package sqlite is the embedded Store: one SQLite file in WAL mode,
// through the pure-Go modernc.org/sqlite driver, served by the one SQL
// store (internal/store/sqlstore) with SQLite's dialect.
//
// Writes go through a pool of exactly one connection, so writers in this
// process queue in Go instead of failing with SQLITE_BUSY, and every
// read-modify-write (quota, rate window, key limit, idempotency claim) is
// serialized. Transactions start with BEGIN IMMEDIATE and a busy timeout,
// so another process on the same file (a `vertal create-key` next to a
// running server) waits for the write lock instead of failing. Reads use a
// separate read-only pool, which WAL lets run beside the writer.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	sqlitedriver "modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlstore"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// readers is the size of the read-only pool.
const readers = 4

// busyTimeout is how long a connection waits for another process's lock.
const busyTimeout = 10 * time.Second

// dialect is SQLite's: times are Unix microseconds (the precision
// PostgreSQL keeps, so both stores return the same instants), booleans 1
// and 0, and no row locks, since the one writer connection and BEGIN
// IMMEDIATE make every write transaction exclusive.
var dialect = sqlstore.Dialect{
	Name:       "sqlite",
	Time:       func(t time.Time) any { return t.UnixMicro() },
	True:       "1",
	False:      "0",
	EmptyBytes: "x''",
	MigrationsTable: `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at INTEGER NOT NULL)`,
	UniqueViolation: func(err error) bool {
		var se *sqlitedriver.Error
		return errors.As(err, &se) &&
			(se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
	},
	Prepare: true,
}

// Store is the SQLite store.Store.
type Store struct {
	*sqlstore.Store
	w *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and applies the
// embedded migrations.
func Open(ctx context.Context, path string) (store.Store, error) {
	s, err := open(ctx, path)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, path string) (*Store, error) {
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("sqlite: open: invalid database path %q", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	// Create the file ourselves so it is private: it holds key hashes and
	// user output. SQLite gives the -wal and -shm files the same mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	f.Close()

	params := fmt.Sprintf("?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)",
		busyTimeout.Milliseconds())
	w, err := sql.Open("sqlite", path+params+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxIdleTime(0)
	w.SetConnMaxLifetime(0)

	r, err := sql.Open("sqlite", path+params+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)

	s, err := openStore(ctx, w, r)
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	return &Store{Store: s, w: w}, nil
}

// openStore migrates and opens the store, retrying while the database is
// busy. Processes opening a fresh file at once can meet SQLITE_BUSY
// without the busy timeout being applied (the first connection switching
// the file to WAL; TestTwoStoresOneFile met it under -race), so Open
// waits as the busy timeout would, in short steps, before it gives up.
func openStore(ctx context.Context, w, r *sql.DB) (*sqlstore.Store, error) {
	deadline := time.Now().Add(busyTimeout)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		s, err := sqlstore.Open(ctx, dialect, w, r, migrationFiles)
		if err == nil || !busy(err) || time.Now().Add(wait).After(deadline) {
			return s, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, err
		}
	}
}

// busy reports whether err is SQLite's SQLITE_BUSY (any extended code).
func busy(err error) bool {
	var se *sqlitedriver.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}
