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
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
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
	return MCPBackendWithSandboxes(svc, nil, metrics, logger)
}

// MCPSandboxes is what the MCP sandbox tools call of the sandboxes
// service (*sandboxes.Service), as the caller the Server authenticated.
type MCPSandboxes interface {
	Create(ctx context.Context, c execution.Caller, idemKey string, r sandboxes.CreateRequest) (sandboxes.Sandbox, error)
	Get(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	Kill(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	Pause(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	Resume(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	Run(ctx context.Context, c execution.Caller, id string, r sandboxes.CommandRequest, onEvent func(sandboxes.Event)) (sandboxes.CommandResult, error)
	ListDir(ctx context.Context, c execution.Caller, id, path string) ([]sandboxes.FileInfo, error)
	ReadFile(ctx context.Context, c execution.Caller, id, path string, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, c execution.Caller, id, path string, r io.Reader) (sandboxes.FileInfo, error)
	RunCode(ctx context.Context, c execution.Caller, id string, r sandboxes.RunCodeRequest, onEvent func(sandboxes.CodeEvent)) (sandboxes.CodeResult, error)
}

// MCPBackendWithSandboxes is MCPBackend whose tools also serve sandboxes
// that stay, through sbx; with sbx nil (a nil interface, not a nil
// *sandboxes.Service) it is MCPBackend, and the MCP server lists no
// sandbox tools.
func MCPBackendWithSandboxes(svc *execution.Service, sbx MCPSandboxes, metrics *Metrics, logger *slog.Logger) func(*http.Request) (mcpserver.Backend, error) {
	if metrics == nil {
		metrics = NewMetrics()
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	tools := &mcpTools{exec: svc, sbx: sbx, metrics: metrics, log: logger}
	return func(r *http.Request) (mcpserver.Backend, error) {
		c, ok := CallerFromContext(r.Context())
		if !ok {
			return nil, errors.New("api: MCPBackend outside an authenticated /mcp request")
		}
		b := mcpBackend{s: tools, c: c, info: infoFrom(r.Context())}
		if sbx != nil {
			return mcpSandboxBackend{b}, nil
		}
		return b, nil
	}
}

// mcpTools is what every MCP request's backend shares.
type mcpTools struct {
	exec    *execution.Service
	sbx     MCPSandboxes // nil: no sandbox tools
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

// mcpSandboxBackend is an mcpBackend with the sandbox tools.
type mcpSandboxBackend struct{ mcpBackend }

var (
	_ mcpserver.SandboxBackend = mcpSandboxBackend{}
	_ mcpserver.SandboxGetter  = mcpSandboxBackend{}
)

// GetSandbox reads a sandbox's record, with which run_command and
// run_code in a sandbox name the connections refused while they ran.
func (b mcpSandboxBackend) GetSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	sb, err := b.s.sbx.Get(ctx, *b.c, id)
	return sb, b.sandboxError(err)
}

func (b mcpSandboxBackend) CreateSandbox(ctx context.Context, req sandboxes.CreateRequest) (sandboxes.Sandbox, error) {
	// No idempotency key: an MCP call that is retried is a new call.
	sb, err := b.s.sbx.Create(ctx, *b.c, "", req)
	return sb, b.sandboxError(err)
}

func (b mcpSandboxBackend) RunCommand(ctx context.Context, id string, req sandboxes.CommandRequest) (sandboxes.CommandResult, error) {
	out, err := b.s.sbx.Run(ctx, *b.c, id, req, nil)
	return out, b.sandboxError(err)
}

func (b mcpSandboxBackend) RunCell(ctx context.Context, id string, req sandboxes.RunCodeRequest) (sandboxes.CodeResult, error) {
	out, err := b.s.sbx.RunCode(ctx, *b.c, id, req, nil)
	return out, b.sandboxError(err)
}

func (b mcpSandboxBackend) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	n, err := b.s.sbx.ReadFile(ctx, *b.c, id, path, w)
	return n, b.sandboxError(err)
}

func (b mcpSandboxBackend) WriteFile(ctx context.Context, id, path string, r io.Reader) (sandboxes.FileInfo, error) {
	fi, err := b.s.sbx.WriteFile(ctx, *b.c, id, path, r)
	return fi, b.sandboxError(err)
}

func (b mcpSandboxBackend) ListFiles(ctx context.Context, id, path string) ([]sandboxes.FileInfo, error) {
	files, err := b.s.sbx.ListDir(ctx, *b.c, id, path)
	return files, b.sandboxError(err)
}

func (b mcpSandboxBackend) KillSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	sb, err := b.s.sbx.Kill(ctx, *b.c, id)
	return sb, b.sandboxError(err)
}

func (b mcpSandboxBackend) PauseSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	sb, err := b.s.sbx.Pause(ctx, *b.c, id)
	return sb, b.sandboxError(err)
}

func (b mcpSandboxBackend) ResumeSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	sb, err := b.s.sbx.Resume(ctx, *b.c, id)
	return sb, b.sandboxError(err)
}

// sandboxError is clientError(err), and nil for nil.
func (b mcpSandboxBackend) sandboxError(err error) error {
	if err == nil {
		return nil
	}
	return b.clientError(err)
}
