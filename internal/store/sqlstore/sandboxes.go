package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

var _ store.Sandboxes = (*Store)(nil)

const sandboxColumns = `id, tenant, key_id, status, reason, message, image, image_version, limits,
	metadata, env, on_timeout, timeout_s, node, created_at, started_at, expires_at, ended_at,
	alive_seconds, cpu_seconds, archive_path, archive_bytes, access_token`

func scanSandbox(row scanner) (store.Sandbox, error) {
	var (
		sb            store.Sandbox
		limits        string
		metadata, env string
	)
	err := row.Scan(&sb.ID, &sb.Tenant, &sb.KeyID, &sb.Status, &sb.Reason, &sb.Message, &sb.Image, &sb.ImageVersion,
		&limits, &metadata, &env, &sb.OnTimeout, &sb.TimeoutS, &sb.Node, tm(&sb.CreatedAt), tm(&sb.StartedAt),
		tm(&sb.ExpiresAt), tm(&sb.EndedAt), &sb.AliveSeconds, &sb.CPUSeconds, &sb.ArchivePath, &sb.ArchiveBytes, &sb.AccessToken)
	if err != nil {
		return store.Sandbox{}, err
	}
	sb.Limits = []byte(limits)
	if err := json.Unmarshal([]byte(metadata), &sb.Metadata); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.Env); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s env: %w", sb.ID, err)
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if sb.Env == nil {
		sb.Env = map[string]string{}
	}
	return sb, nil
}

func jsonMap(m map[string]string) (string, error) {
	if m == nil {
		m = map[string]string{}
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// CreateSandbox implements store.Sandboxes.
func (s *Store) CreateSandbox(ctx context.Context, sb store.Sandbox, max int) error {
	metadata, err := jsonMap(sb.Metadata)
	if err != nil {
		return s.errf("create sandbox", err)
	}
	env, err := jsonMap(sb.Env)
	if err != nil {
		return s.errf("create sandbox", err)
	}
	limits := string(sb.Limits)
	if limits == "" {
		limits = "{}"
	}
	err = s.tx(ctx, func(c conn) error {
		// The upsert locks the tenant's row until the transaction ends,
		// so a parallel create on another connection waits here and then
		// counts this one's sandbox.
		if _, err := c.exec(ctx, `INSERT INTO sandbox_locks (tenant, creates) VALUES ($1, 1)
			ON CONFLICT (tenant) DO UPDATE SET creates = sandbox_locks.creates + 1`, sb.Tenant); err != nil {
			return err
		}
		var n int
		if err := c.row(ctx, `SELECT count(*) FROM sandboxes WHERE tenant = $1 AND status <> 'ended'`, sb.Tenant).Scan(&n); err != nil {
			return err
		}
		if n >= max {
			return store.ErrSandboxLimit
		}
		_, err := c.exec(ctx, `INSERT INTO sandboxes (`+sandboxColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)`,
			sb.ID, sb.Tenant, sb.KeyID, sb.Status, sb.Reason, sb.Message, sb.Image, sb.ImageVersion, limits,
			metadata, env, sb.OnTimeout, sb.TimeoutS, sb.Node, s.at(sb.CreatedAt), s.at(sb.StartedAt),
			s.at(sb.ExpiresAt), s.nullAt(sb.EndedAt), sb.AliveSeconds, sb.CPUSeconds, sb.ArchivePath, sb.ArchiveBytes, sb.AccessToken)
		return err
	})
	if err != nil {
		return s.errf("create sandbox", err)
	}
	return nil
}

// Sandbox implements store.Sandboxes.
func (s *Store) Sandbox(ctx context.Context, tenant, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.reader().row(ctx, qSandbox, tenant, id))
	if err != nil {
		return store.Sandbox{}, s.errf("sandbox", notFound(err))
	}
	return sb, nil
}

// ListSandboxes implements store.Sandboxes.
func (s *Store) ListSandboxes(ctx context.Context, tenant string, p store.SandboxPage) ([]store.Sandbox, error) {
	if p.Limit < 1 {
		return nil, nil
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE tenant = $1 AND ($2 = '' OR status = $2)`
	args := []any{tenant, p.Status}
	if p.BeforeID != "" {
		q += ` AND (created_at < $3 OR (created_at = $3 AND id < $4))`
		args = append(args, s.at(p.Before), p.BeforeID)
	}
	q += fmt.Sprintf(` ORDER BY created_at DESC, id DESC LIMIT %d`, p.Limit)
	out, err := queryAll(ctx, s.reader(), scanSandbox, q, args...)
	if err != nil {
		return nil, s.errf("list sandboxes", err)
	}
	return out, nil
}

// UpdateSandbox implements store.Sandboxes.
func (s *Store) UpdateSandbox(ctx context.Context, sb store.Sandbox, from string) error {
	err := s.tx(ctx, func(c conn) error {
		n, err := c.affected(ctx, `UPDATE sandboxes SET status = $3, reason = $4, message = $5, node = $6,
			started_at = $7, expires_at = $8, ended_at = $9, alive_seconds = $10, cpu_seconds = $11,
			archive_path = $12, archive_bytes = $13, timeout_s = $14
			WHERE tenant = $1 AND id = $2 AND status = $15`,
			sb.Tenant, sb.ID, sb.Status, sb.Reason, sb.Message, sb.Node, s.at(sb.StartedAt), s.at(sb.ExpiresAt),
			s.nullAt(sb.EndedAt), sb.AliveSeconds, sb.CPUSeconds, sb.ArchivePath, sb.ArchiveBytes, sb.TimeoutS, from)
		if err != nil || n == 1 {
			return err
		}
		var status string
		if err := c.row(ctx, `SELECT status FROM sandboxes WHERE tenant = $1 AND id = $2`, sb.Tenant, sb.ID).Scan(&status); err != nil {
			return notFound(err)
		}
		return store.ErrSandboxState
	})
	if err != nil {
		return s.errf("update sandbox", err)
	}
	return nil
}

// SandboxByID implements store.Sandboxes.
func (s *Store) SandboxByID(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := scanSandbox(s.reader().row(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1`, id))
	if err != nil {
		return store.Sandbox{}, s.errf("sandbox by id", notFound(err))
	}
	return sb, nil
}

// NodeSandboxes implements store.Sandboxes.
func (s *Store) NodeSandboxes(ctx context.Context, node, status string) ([]store.Sandbox, error) {
	out, err := queryAll(ctx, s.reader(), scanSandbox, `SELECT `+sandboxColumns+` FROM sandboxes
		WHERE node = $1 AND status = $2 ORDER BY id`, node, status)
	if err != nil {
		return nil, s.errf("node sandboxes", err)
	}
	return out, nil
}

// CountSandboxes implements store.Sandboxes.
func (s *Store) CountSandboxes(ctx context.Context, tenant string) (running, paused int, err error) {
	err = s.reader().row(ctx, `SELECT
		COALESCE(SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN status = 'paused' THEN 1 ELSE 0 END), 0)
		FROM sandboxes WHERE tenant = $1 AND status <> 'ended'`, tenant).Scan(&running, &paused)
	if err != nil {
		return 0, 0, s.errf("count sandboxes", err)
	}
	return running, paused, nil
}

// AddSandboxUsage implements store.Sandboxes.
func (s *Store) AddSandboxUsage(ctx context.Context, tenant, day string, u store.SandboxUsage) error {
	if err := checkDay(day); err != nil {
		return s.errf("add sandbox usage", err)
	}
	if _, err := s.writer().exec(ctx, `INSERT INTO usage_days (tenant, day, sbx_seconds, sbx_cpu_seconds, sbx_network_bytes_in, sbx_network_bytes_out)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (tenant, day) DO UPDATE SET sbx_seconds = usage_days.sbx_seconds + $3,
			sbx_cpu_seconds = usage_days.sbx_cpu_seconds + $4, sbx_network_bytes_in = usage_days.sbx_network_bytes_in + $5,
			sbx_network_bytes_out = usage_days.sbx_network_bytes_out + $6`,
		tenant, day, u.AliveSeconds, u.CPUSeconds, u.NetworkBytesIn, u.NetworkBytesOut); err != nil {
		return s.errf("add sandbox usage", err)
	}
	return nil
}

// SandboxUsage implements store.Sandboxes.
func (s *Store) SandboxUsage(ctx context.Context, tenant, day string) (store.SandboxUsage, error) {
	var u store.SandboxUsage
	if err := checkDay(day); err != nil {
		return u, s.errf("sandbox usage", err)
	}
	err := s.reader().row(ctx, `SELECT sbx_seconds, sbx_cpu_seconds, sbx_network_bytes_in, sbx_network_bytes_out
		FROM usage_days WHERE tenant = $1 AND day = $2`,
		tenant, day).Scan(&u.AliveSeconds, &u.CPUSeconds, &u.NetworkBytesIn, &u.NetworkBytesOut)
	if errors.Is(err, sql.ErrNoRows) {
		return store.SandboxUsage{}, nil
	}
	if err != nil {
		return store.SandboxUsage{}, s.errf("sandbox usage", err)
	}
	return u, nil
}

// PurgeSandboxes implements store.Sandboxes.
func (s *Store) PurgeSandboxes(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.writer().affected(ctx, `DELETE FROM sandboxes WHERE status = 'ended' AND ended_at < $1`, s.at(before))
	if err != nil {
		return 0, s.errf("purge sandboxes", err)
	}
	return n, nil
}
