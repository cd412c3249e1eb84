// Package postgres is the Store for several API nodes sharing one PostgreSQL
// database, through pgx.
package postgres

import (
	"context"
	"errors"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Open opens (creating if needed) a pool to the database at url and applies the
// embedded migrations.
func Open(ctx context.Context, url string) (store.Store, error) {
	return nil, errors.New("postgres: not implemented yet")
}
