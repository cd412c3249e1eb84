// Package sqlite is the embedded Store: one SQLite file in WAL mode,
// through the pure-Go modernc.org/sqlite driver.
package sqlite

import (
	"context"
	"errors"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Open opens (creating if needed) the database at path and applies the
// embedded migrations.
func Open(ctx context.Context, path string) (store.Store, error) {
	return nil, errors.New("sqlite: not implemented yet")
}
