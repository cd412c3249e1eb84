package api

import (
	"encoding/json"
	"net/http"

	"github.com/kuboprotocol/vertal2kubo/client/wire"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// createBatch translates POST /v1/executions/batch: up to
// execution.MaxBatch async executions, validated all or nothing, under
// one Idempotency-Key. A replay marks each execution idempotent_replay,
// as a single replay is marked.
func (s *Server) createBatch(w http.ResponseWriter, r *http.Request, c *Caller) error {
	idemKey, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	body, release, err := s.readJSONBody(w, r, int64(execution.MaxBatch+1)*s.maxBodyBytes(c.Plan), int64(execution.MaxBatch+1)*s.maxDecodedBytes(c.Plan))
	defer release()
	if err != nil {
		return err
	}
	var br wire.BatchRequest
	if err := decodeRequest(body, &br, execution.InvalidTimeout(*c)); err != nil {
		return err
	}
	if br.Executions == nil {
		return errorf(KindInvalidRequest, "executions is required: an array of 1 to %d execution requests", execution.MaxBatch)
	}
	if len(br.Executions) > execution.MaxBatch {
		return errorf(KindInvalidRequest, "executions holds %d executions; a batch holds at most %d", len(br.Executions), execution.MaxBatch)
	}
	items := make([]execution.Input, len(br.Executions))
	for i, in := range br.Executions {
		items[i] = toInput(in)
	}
	req := runRequest(w, r, idemKey, execution.Input{})
	out, err := s.exec.SubmitBatch(r.Context(), *c, req, items, br.WebhookURL)
	if err != nil {
		return err
	}
	info := infoFrom(r.Context())
	resp := wire.BatchResponse{Executions: make([]wire.Execution, len(out.Executions))}
	for i, e := range out.Executions {
		resp.Executions[i] = toResponse(e, info.id)
		resp.Executions[i].IdempotentReplay = out.Replay
	}
	return s.writeJSON(w, r, http.StatusAccepted, resp)
}

// prefixError puts where in the batch a refusal is in front of its message.
func prefixError(err error, prefix string) error {
	if e, ok := err.(*Error); ok {
		c := *e
		c.Msg = prefix + c.Msg
		return &c
	}
	return err
}

// getWebhookSecret answers GET /v1/webhook-secret: the tenant's signing
// secret, made on first use.
func (s *Server) getWebhookSecret(w http.ResponseWriter, r *http.Request, c *Caller) error {
	secret, created, err := s.exec.WebhookSecret(r.Context(), *c)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, wire.WebhookSecret{Secret: secret, CreatedAt: created.Unix(), RequestID: infoFrom(r.Context()).id})
}

// rotateWebhookSecret answers POST /v1/webhook-secret/rotate.
func (s *Server) rotateWebhookSecret(w http.ResponseWriter, r *http.Request, c *Caller) error {
	secret, created, err := s.exec.RotateWebhookSecret(r.Context(), *c)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, wire.WebhookSecret{Secret: secret, CreatedAt: created.Unix(), RequestID: infoFrom(r.Context()).id})
}

// RenderExecution is the JSON a webhook delivers: what GET
// /v1/executions/{id} answers for e (with its own request id).
func RenderExecution(e store.Execution) ([]byte, error) {
	return json.Marshal(toResponse(e, e.RequestID))
}
