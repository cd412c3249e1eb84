package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"

	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
)

// pgDumpHowTo is printed instead of a backup when the store is PostgreSQL:
// its own tools do it better than we could (docs/DEPLOY.md, "Backups").
const pgDumpHowTo = `The store is PostgreSQL: back it up with its own tools, e.g.

  pg_dump --format=custom --file=vertal-$(date +%F).dump "$VERTAL_DATABASE_URL"

and restore into an empty database with pg_restore --no-owner -d URL FILE.
See docs/DEPLOY.md, "Backups".`

func cmdBackup(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "backup", "backup DEST\n\nCopies the SQLite database (data-dir/vertal.db) to the new file DEST while the\n"+
		"server keeps running, then checks the copy with PRAGMA integrity_check. DEST must not\n"+
		"exist. For PostgreSQL it prints how to use pg_dump instead and exits 1.")
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs)
	}
	if cfg.UsesPostgres() {
		_, _ = io.WriteString(e.Stderr, pgDumpHowTo+"\n")
		return exitCode(1)
	}
	src := sqlitePath(cfg)
	err = sqlite.Backup(ctx, src, pos[0])
	var pathErr *iofs.PathError
	switch {
	case errors.Is(err, sqlite.ErrExists):
		return fmt.Errorf("%s exists; not overwriting it (choose a new name)", pos[0])
	case errors.As(err, &pathErr) && pathErr.Path == src && errors.Is(err, iofs.ErrNotExist):
		return fmt.Errorf("%w (is --data-dir / VERTAL_DATA_DIR %s the server's?)", err, cfg.DataDir)
	case err != nil:
		return err
	}
	fi, err := os.Stat(pos[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "backed up %s to %s (%d bytes, integrity ok)\n", src, pos[0], fi.Size())
	return nil
}
