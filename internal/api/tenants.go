package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

type usageResponse struct {
	Tenant string      `json:"tenant"`
	Plan   string      `json:"plan"`
	Today  usageToday  `json:"today"`
	Limits usageLimits `json:"limits"`
}

type usageToday struct {
	Date           string  `json:"date"`
	Executions     int64   `json:"executions"`
	SandboxSeconds float64 `json:"sandbox_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
}

type usageLimits struct {
	ExecutionsPerDay  int64 `json:"executions_per_day"`
	RequestsPerMinute int64 `json:"requests_per_minute"`
	MaxTimeoutS       int   `json:"max_timeout_s"`
	MemoryMB          int64 `json:"memory_mb"`
}

func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, c *Caller) error {
	body, err := usage(r.Context(), s.exec, c)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, body)
}

// usage is the body of GET /v1/usage (and of the MCP get_usage tool).
func usage(ctx context.Context, exec *execution.Service, c *Caller) (usageResponse, error) {
	u, day, err := exec.Usage(ctx, *c)
	if err != nil {
		return usageResponse{}, err
	}
	return usageResponse{
		Tenant: c.Key.Tenant,
		Plan:   c.Key.Plan,
		Today: usageToday{
			Date:           day,
			Executions:     u.Executions,
			SandboxSeconds: round3(u.SandboxSeconds),
			CPUSeconds:     round3(u.CPUSeconds),
		},
		Limits: usageLimits{
			ExecutionsPerDay:  c.Plan.ExecutionsPerDay,
			RequestsPerMinute: c.Plan.RequestsPerMinute,
			MaxTimeoutS:       c.Plan.MaxTimeoutS,
			MemoryMB:          c.Plan.MemoryMB,
		},
	}, nil
}

type rotateResponse struct {
	APIKey       string `json:"api_key"`
	KeyID        string `json:"key_id"`
	RevokedKeyID string `json:"revoked_key_id"`
	Plan         string `json:"plan"`
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
	return s.writeJSON(w, r, http.StatusOK, rotateResponse{APIKey: secret, KeyID: k.ID, RevokedKeyID: c.Key.ID, Plan: k.Plan})
}
