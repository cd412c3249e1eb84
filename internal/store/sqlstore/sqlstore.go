// Package sqlstore is the one store.Store over database/sql. The SQLite
// store (internal/store/sqlite) and the PostgreSQL store
// (internal/store/postgres) open their database, describe it with a
// Dialect and hand it here; every query is written once, with $N
// placeholders, which both drivers take.
//
// What differs between the two is in the Dialect and nowhere else: how a
// time is bound (SQLite keeps Unix microseconds, PostgreSQL timestamptz),
// row locks (SELECT ... FOR UPDATE on PostgreSQL; SQLite has one writer,
// so a write transaction already holds the only lock), the boolean
// literals that partial indexes match, the migrations table, the lock that
// serializes migrations across nodes, and the unique-violation error.
//
// Scanning needs no dialect: a time column scans through timeCol, which
// reads either form.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/migrations"
)

// Dialect is what one database does differently.
type Dialect struct {
	// Name prefixes every error ("sqlite", "postgres").
	Name string
	// Time is how a time is bound as an argument. The store keeps times
	// to the microsecond in both, truncated, so both return one instant.
	Time func(time.Time) any
	// ForUpdate ends a SELECT that must lock its row until the
	// transaction ends (" FOR UPDATE"), or is "" where a write
	// transaction is already exclusive.
	ForUpdate string
	// True and False are the boolean literals the partial indexes are
	// written with, so the planner matches a query to them.
	True, False string
	// EmptyBytes is the literal of an empty BLOB/BYTEA.
	EmptyBytes string
	// MigrationsTable creates schema_migrations if it is missing; its
	// columns are (version, name, applied_at), applied_at bound with Time.
	MigrationsTable string
	// LockMigrations, when set, runs first in the migrating transaction
	// and holds a lock until it commits, so nodes starting at once
	// migrate one after another.
	LockMigrations string
	// UniqueViolation reports whether err is a unique or primary-key
	// constraint refusing an insert.
	UniqueViolation func(error) bool
	// Prepare is whether the hot statements are prepared once at Open
	// (see hotQueries). SQLite's driver parses the SQL of every statement
	// it is not given prepared; pgx caches the statements of each of its
	// connections by itself.
	Prepare bool
}

// Store is store.Store over one database. Writes go to W; reads that
// need no transaction go to R, which may be the same pool.
type Store struct {
	d   Dialect
	w   *sql.DB
	r   *sql.DB
	hot map[string]*sql.Stmt // prepared hot statements by their text, on w or r as hotQueries says

	lockExecution string // executionState's query with the dialect's lock
}

var _ store.Store = (*Store)(nil)

// Open applies the migrations in fsys's directory migrations (NNNN_name.sql
// files, see package migrations) to the database behind w and returns the
// store. w and r are
// the writer and reader pools (the same one where the database needs no
// split); Close closes both.
func Open(ctx context.Context, d Dialect, w, r *sql.DB, fsys fs.FS) (*Store, error) {
	s := &Store{d: d, w: w, r: r, lockExecution: qExecutionState + d.ForUpdate}
	if err := s.migrate(ctx, fsys); err != nil {
		return nil, err
	}
	if d.Prepare {
		if err := s.prepare(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close closes the prepared statements and both pools.
func (s *Store) Close() error {
	var errs []error
	for _, st := range s.hot {
		errs = append(errs, st.Close())
	}
	if s.r != s.w {
		errs = append(errs, s.r.Close())
	}
	return errors.Join(append(errs, s.w.Close())...)
}

func (s *Store) migrate(ctx context.Context, fsys fs.FS) error {
	sub, err := fs.Sub(fsys, "migrations")
	if err != nil {
		return s.errf("migrate", err)
	}
	ms, err := migrations.Load(sub)
	if err != nil {
		return s.errf("migrate", err)
	}
	// One transaction: a second process or node opening the database at
	// the same moment waits (SQLite's BEGIN IMMEDIATE, PostgreSQL's
	// advisory lock), then finds every version recorded.
	err = s.tx(ctx, func(c conn) error {
		if s.d.LockMigrations != "" {
			if _, err := c.exec(ctx, s.d.LockMigrations); err != nil {
				return err
			}
		}
		if _, err := c.exec(ctx, s.d.MigrationsTable); err != nil {
			return err
		}
		for _, m := range ms {
			var n int
			if err := c.row(ctx, `SELECT count(*) FROM schema_migrations WHERE version = $1`, m.Version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			if _, err := c.exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("%s: %w", m.Name, err)
			}
			if _, err := c.exec(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
				m.Version, m.Name, s.d.Time(time.Now())); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.errf("migrate", err)
	}
	return nil
}

// errf wraps err with the dialect's name and what failed.
func (s *Store) errf(what string, err error) error {
	return fmt.Errorf("%s: %s: %w", s.d.Name, what, err)
}

// at binds t as the dialect keeps times.
func (s *Store) at(t time.Time) any { return s.d.Time(t) }

// nullAt binds t, or NULL for the zero time.
func (s *Store) nullAt(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return s.d.Time(t)
}

// querier is what a pool and a transaction both run statements on.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// conn runs statements on a pool or in a transaction, through the
// prepared statement of a hot query when the store has one.
type conn struct {
	q   querier
	tx  *sql.Tx // q, when it is a transaction
	hot map[string]*sql.Stmt
}

func (s *Store) writer() conn { return conn{q: s.w, hot: s.hot} }
func (s *Store) reader() conn { return conn{q: s.r, hot: s.hot} }

// stmt is the prepared statement of query, bound to the transaction, or
// nil if there is none.
func (c conn) stmt(ctx context.Context, query string) *sql.Stmt {
	st := c.hot[query]
	if st != nil && c.tx != nil {
		st = c.tx.StmtContext(ctx, st)
	}
	return st
}

func (c conn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := c.stmt(ctx, query); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return c.q.ExecContext(ctx, query, args...)
}

func (c conn) row(ctx context.Context, query string, args ...any) *sql.Row {
	if st := c.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return c.q.QueryRowContext(ctx, query, args...)
}

// affected runs an Exec and returns the rows it changed.
func (c conn) affected(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := c.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// one runs an Exec that must change a row; none otherwise.
func (c conn) one(ctx context.Context, none error, query string, args ...any) error {
	n, err := c.affected(ctx, query, args...)
	if err == nil && n == 0 {
		err = none
	}
	return err
}

// tx runs fn in a write transaction and commits it if fn returns nil.
func (s *Store) tx(ctx context.Context, fn func(conn) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(conn{q: tx, tx: tx, hot: s.hot}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

// queryAll runs a query on c and scans every row.
func queryAll[T any](ctx context.Context, c conn, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := c.q.QueryContext(ctx, query, args...)
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

// timeCol scans a time column as either database keeps it: SQLite's Unix
// microseconds or PostgreSQL's timestamptz, in UTC; NULL is the zero time.
type timeCol struct{ t *time.Time }

func (c timeCol) Scan(v any) error {
	switch v := v.(type) {
	case nil:
		*c.t = time.Time{}
	case int64:
		*c.t = time.UnixMicro(v).UTC()
	case time.Time:
		*c.t = v.UTC()
	default:
		return fmt.Errorf("a time column holds %T", v)
	}
	return nil
}

// tm scans into t through timeCol.
func tm(t *time.Time) timeCol { return timeCol{t} }

// us is t as the store returns it once stored.
func us(t time.Time) time.Time { return t.Truncate(time.Microsecond).UTC() }

// notFound maps an empty result to store.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

func checkDay(day string) error {
	if t, err := time.Parse(time.DateOnly, day); err != nil || t.Format(time.DateOnly) != day {
		return fmt.Errorf("invalid day %q", day)
	}
	return nil
}
