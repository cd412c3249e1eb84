package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, c *Caller) error {
	body, err := usage(r.Context(), s.exec, c)
	if err != nil {
		return err
	}
	if body.Sandboxes, err = s.sandboxUsage(r.Context(), c); err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, body)
}

// usage is the body of GET /v1/usage (and of the MCP get_usage tool).
func usage(ctx context.Context, exec *execution.Service, c *Caller) (wire.Usage, error) {
	u, day, err := exec.Usage(ctx, *c)
	if err != nil {
		return wire.Usage{}, err
	}
	return wire.Usage{
		Tenant: c.Key.Tenant,
		Plan:   c.Key.Plan,
		Today: wire.UsageToday{
			Date:            day,
			Executions:      u.Executions,
			SandboxSeconds:  round3(u.SandboxSeconds),
			CPUSeconds:      round3(u.CPUSeconds),
			NetworkBytesIn:  u.NetworkBytesIn,
			NetworkBytesOut: u.NetworkBytesOut,
		},
		Limits: wire.Limits{
			ExecutionsPerDay:  c.Plan.ExecutionsPerDay,
			RequestsPerMinute: c.Plan.RequestsPerMinute,
			MaxTimeoutS:       c.Plan.MaxTimeoutS,
			MemoryMB:          c.Plan.MemoryMB,
		},
	}, nil
}

// rotateKey swaps the calling key for a new one in one store transaction,
// so there is never a moment with both or neither.
func (s *Server) rotateKey(w http.ResponseWriter, r *http.Request, c *Caller) error {
	secret := NewAPIKey()
	k, err := s.store.RotateKey(r.Context(), c.Key.ID, store.NewKey{
		ID:        NewKeyID(),
		Tenant:    c.Key.Tenant,
		Plan:      c.Key.Plan,
		Hash:      HashAPIKey(secret),
		CreatedAt: s.now().UTC(),
	})
	if errors.Is(err, store.ErrNotFound) {
		return errorf(KindUnauthorized, "invalid or revoked API key")
	}
	if err != nil {
		return internal(err)
	}
	return s.writeJSON(w, r, http.StatusOK, wire.KeyRotation{APIKey: secret, KeyID: k.ID, RevokedKeyID: c.Key.ID, Plan: k.Plan})
}
