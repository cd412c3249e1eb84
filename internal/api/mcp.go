package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"
)

// MCPBackend returns what mcpserver.HTTPOptions.Backend wants: for each
// /mcp request a Server authenticated, what its MCP tools call. That is the
// execution service svc (the Server's own), as the caller the Server
// authenticated. Nothing they do is counted against the rate again (the
// message was), while quota, idempotency and metering are those of POST
// /v1/executions, because it is the same sequence. A refusal is counted in
// metrics and, when it is the server's fault, logged to logger (nil
// discards it), as the Server does for its own.
func MCPBackend(svc *execution.Service, metrics *Metrics, logger *slog.Logger) func(*http.Request) (mcpserver.Backend, error) {
	if metrics == nil {
		metrics = NewMetrics()
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	tools := &mcpTools{exec: svc, metrics: metrics, log: logger}
	return func(r *http.Request) (mcpserver.Backend, error) {
		c, ok := CallerFromContext(r.Context())
		if !ok {
			return nil, errors.New("api: MCPBackend outside an authenticated /mcp request")
		}
		return mcpBackend{s: tools, c: c, info: infoFrom(r.Context())}, nil
	}
}

// mcpTools is what every MCP request's backend shares.
type mcpTools struct {
	exec    *execution.Service
	metrics *Metrics
	log     *slog.Logger
}

type mcpBackend struct {
	s    *mcpTools
	c    *Caller
	info *requestInfo // of the /mcp request: its id names the execution and its errors
}

func (b mcpBackend) RunCode(ctx context.Context, req mcpserver.RunRequest) (*client.Execution, error) {
	out, err := b.s.exec.Run(ctx, *b.c, execution.Request{
		Input:     req.Input(),
		RequestID: b.info.id,
	})
	if err != nil {
		return nil, b.clientError(err)
	}
	return asClient[client.Execution](toResponse(out.Execution, b.info.id))
}

func (b mcpBackend) Usage(ctx context.Context) (*client.Usage, error) {
	body, err := usage(ctx, b.s.exec, b.c)
	if err != nil {
		return nil, b.clientError(err)
	}
	return asClient[client.Usage](body)
}

// asClient is body, an answer of the API, as the client package decodes it
// (with its Raw), which is what the tools take.
func asClient[T any](body any) (*T, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	out := new(T)
	if err := json.Unmarshal(raw, out); err != nil {
		return nil, err
	}
	return out, nil
}

// clientError gives a tool the refusal the HTTP API would have answered
// with, through the one table of errors.go, and logs what the client does
// not see.
func (b mcpBackend) clientError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	e := asError(err)
	b.s.metrics.observeError(kindCode(e.Kind))
	if st := kindStatus(e.Kind); st >= 500 {
		// As in the access log: overload is the server working as designed.
		level := slog.LevelError
		if st == http.StatusServiceUnavailable {
			level = slog.LevelWarn
		}
		b.s.log.Log(context.Background(), level, "mcp tool call failed", "request_id", b.info.id,
			"tenant", b.c.Key.Tenant, "error_code", kindCode(e.Kind), "error", e.Error())
	}
	return &client.Error{
		StatusCode: kindStatus(e.Kind),
		Code:       kindCode(e.Kind),
		Message:    e.Msg,
		RequestID:  b.info.id,
		RetryAfter: time.Duration(e.RetryAfter) * time.Second,
	}
}
