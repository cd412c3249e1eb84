package postgres

import "github.com/jackc/pgx/v5/pgxpool"

// Pool is the store's connection pool, for the durable queue
// (internal/queue), which keeps its tables in the same database.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }
