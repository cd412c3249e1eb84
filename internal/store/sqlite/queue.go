package sqlite

import "database/sql"

// WriterDB is the store's one-connection writer pool, for the durable
// queue (internal/queue), whose SQLite driver wants exactly such a pool:
// the queue's writes then wait in Go behind the store's, never on
// SQLITE_BUSY.
func (s *Store) WriterDB() *sql.DB { return s.w }
