// Package migrations reads the numbered SQL files each store embeds, so
// the SQLite and PostgreSQL stores agree on what a migration is: a file
// named NNNN_name.sql applied once, in order, and recorded by version in a
// schema_migrations table.
package migrations

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one SQL file.
type Migration struct {
	Version int64
	Name    string // file name, for schema_migrations and error messages
	SQL     string
}

// Load returns the .sql files at the root of fsys ordered by version. Two
// files with one version, or a name without a numeric prefix, are errors so
// that a typo cannot silently skip a migration.
func Load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	seen := map[int64]string{}
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		prefix, _, ok := strings.Cut(e.Name(), "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name must be NNNN_name.sql", e.Name())
		}
		v, err := strconv.ParseInt(prefix, 10, 64)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("migration %q: name must start with a positive version", e.Name())
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %q and %q share version %d", other, e.Name(), v)
		}
		seen[v] = e.Name()
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
