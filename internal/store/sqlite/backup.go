package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// ErrExists is returned by Backup when its destination already exists.
var ErrExists = errors.New("sqlite: backup destination exists")

// Backup writes a consistent copy of the database at src to dest while
// other processes (a running server) keep reading and writing it, then
// checks the copy with PRAGMA integrity_check.
//
// It uses VACUUM INTO, which copies inside one read transaction: in WAL
// mode the server's writers are not blocked, and the copy is the database
// as of that transaction's start, WAL included. Copying the file with cp
// instead could catch it between a checkpoint's writes.
//
// src must exist (Backup never creates a database), and dest must not:
// the copy is made under a temporary name in dest's directory and linked
// to dest only when it is complete and checked, so dest is never
// overwritten and never half written. The copy's mode is 0600, like the
// database: it holds key hashes and users' output.
func Backup(ctx context.Context, src, dest string) error {
	if strings.ContainsRune(src, '?') {
		return fmt.Errorf("sqlite: backup: invalid database path %q", src)
	}
	if fi, err := os.Stat(src); err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("sqlite: backup: %s is not a database file", src)
	}
	if _, err := os.Lstat(dest); err == nil {
		return fmt.Errorf("%w: %s", ErrExists, dest)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sqlite: backup: %w", err)
	}

	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".partial-*")
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpPath)

	// mode=ro: the backup never writes to (or migrates) the live database.
	db, err := sql.Open("sqlite", readOnlyURI(src, fmt.Sprintf("&_pragma=busy_timeout(%d)", busyTimeout.Milliseconds())))
	if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	defer db.Close()
	// VACUUM INTO fills an empty existing file, keeping its 0600 mode.
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", tmpPath); err != nil {
		return fmt.Errorf("sqlite: backup: VACUUM INTO: %w", err)
	}
	if err := check(ctx, tmpPath); err != nil {
		return err
	}
	if err := syncFile(tmpPath); err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	if err := os.Link(tmpPath, dest); errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %s", ErrExists, dest)
	} else if err != nil {
		return fmt.Errorf("sqlite: backup: %w", err)
	}
	return syncFile(filepath.Dir(dest))
}

// check runs PRAGMA integrity_check on the database at path.
func check(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", readOnlyURI(path, ""))
	if err != nil {
		return fmt.Errorf("sqlite: backup: checking the copy: %w", err)
	}
	defer db.Close()
	var res string
	if err := db.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&res); err != nil {
		return fmt.Errorf("sqlite: backup: checking the copy: %w", err)
	}
	if res != "ok" {
		return fmt.Errorf("sqlite: backup: the copy failed its integrity check: %s", res)
	}
	return nil
}

// readOnlyURI is a file: URI opening path read-only; escaping the path
// keeps a '#' or '%' in a directory name from being read as URI syntax.
func readOnlyURI(path, params string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return (&url.URL{Scheme: "file", Path: path, OmitHost: true}).String() + "?mode=ro" + params
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
