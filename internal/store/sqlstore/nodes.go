package sqlstore

import (
	"context"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Heartbeat implements store.Nodes.
func (s *Store) Heartbeat(ctx context.Context, node, address string, at time.Time) error {
	if _, err := s.writer().exec(ctx, `INSERT INTO nodes (id, seen_at, address) VALUES ($1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at, address = excluded.address`, node, s.at(at), address); err != nil {
		return s.errf("heartbeat", err)
	}
	return nil
}

// NodeAddress implements store.Nodes.
func (s *Store) NodeAddress(ctx context.Context, node string) (string, error) {
	addrs, err := queryAll(ctx, s.reader(), func(row scanner) (a string, err error) { return a, row.Scan(&a) },
		`SELECT address FROM nodes WHERE id = $1`, node)
	if err != nil {
		return "", s.errf("node address", err)
	}
	if len(addrs) == 0 {
		return "", store.ErrNotFound
	}
	return addrs[0], nil
}

// StaleNodes implements store.Nodes.
func (s *Store) StaleNodes(ctx context.Context, before time.Time) ([]string, error) {
	nodes, err := queryAll(ctx, s.reader(), func(row scanner) (id string, err error) { return id, row.Scan(&id) },
		`SELECT id FROM nodes WHERE seen_at < $1 ORDER BY id`, s.at(before))
	if err != nil {
		return nil, s.errf("stale nodes", err)
	}
	return nodes, nil
}

// ForgetNode implements store.Nodes.
func (s *Store) ForgetNode(ctx context.Context, node string) error {
	if _, err := s.writer().exec(ctx, `DELETE FROM nodes WHERE id = $1`, node); err != nil {
		return s.errf("forget node", err)
	}
	return nil
}
