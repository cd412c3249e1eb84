package mcpserver

import (
	"context"
	"io"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// The stdio server's sandbox tools call the API through the Go SDK, so the
// key's plan, quota and metering apply as they do over HTTP. A server
// without sandboxes answers each call with its own error, which the tool
// passes on.
type clientSandboxes struct{ clientBackend }

var (
	_ SandboxBackend = clientSandboxes{}
	_ SandboxGetter  = clientSandboxes{}
)

func (b clientSandboxes) GetSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	sb, err := b.c.GetSandbox(ctx, id)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	return fromClientSandbox(sb), nil
}

func (b clientSandboxes) CreateSandbox(ctx context.Context, req sandboxes.CreateRequest) (sandboxes.Sandbox, error) {
	p := client.SandboxParams{Image: req.Image, Timeout: time.Duration(req.TimeoutS) * time.Second, Env: req.Env,
		Metadata: req.Metadata, OnTimeout: req.OnTimeout}
	if req.Network != nil {
		p.Network = &wire.NetworkRequest{Allow: req.Network.Allow}
	}
	for _, f := range req.Files {
		p.Files = append(p.Files, client.File{Path: f.Path, Content: f.Content})
	}
	sb, err := b.c.CreateSandbox(ctx, p)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	return fromClientSandbox(sb), nil
}

func (b clientSandboxes) RunCommand(ctx context.Context, id string, req sandboxes.CommandRequest) (sandboxes.CommandResult, error) {
	var opts []client.CommandOption
	if len(req.Argv) > 0 {
		opts = append(opts, client.WithArgv(req.Argv...))
	}
	if req.Cwd != "" {
		opts = append(opts, client.WithCwd(req.Cwd))
	}
	if len(req.Env) > 0 {
		opts = append(opts, client.WithCommandEnv(req.Env))
	}
	if req.Stdin != "" {
		opts = append(opts, client.WithCommandStdin(req.Stdin))
	}
	if req.TimeoutS > 0 {
		opts = append(opts, client.WithCommandTimeout(time.Duration(req.TimeoutS)*time.Second))
	}
	res, err := b.c.Sandbox(id).Commands.Run(ctx, req.Cmd, opts...)
	if err != nil {
		return sandboxes.CommandResult{}, err
	}
	return sandboxes.CommandResult{PID: res.PID, Status: string(res.Status), Stdout: res.Stdout, Stderr: res.Stderr,
		ExitCode: res.ExitCode, DurationMS: res.DurationMS, Truncated: res.Truncated, CPUSeconds: res.CPUSeconds}, nil
}

func (b clientSandboxes) RunCell(ctx context.Context, id string, req sandboxes.RunCodeRequest) (sandboxes.CodeResult, error) {
	opts := []client.CodeOption{client.InContext(req.ContextID), client.WithCodeLanguage(req.Language), client.WithCodeEnv(req.Env)}
	if req.TimeoutS > 0 {
		opts = append(opts, client.WithCodeTimeout(time.Duration(req.TimeoutS)*time.Second))
	}
	res, err := b.c.Sandbox(id).RunCode(ctx, req.Code, opts...)
	if err != nil {
		return sandboxes.CodeResult{}, err
	}
	out := sandboxes.CodeResult{ContextID: res.ContextID, Status: string(res.Status), Stdout: res.Stdout, Stderr: res.Stderr,
		ExecutionCount: res.ExecutionCount, DurationMS: res.DurationMS, Truncated: res.Truncated, CPUSeconds: res.CPUSeconds}
	for _, o := range res.Results {
		out.Results = append(out.Results, sandboxes.CodeOutput{Main: o.Main, Data: o.Data})
	}
	if e := res.Error; e != nil {
		out.Error = &sandboxes.CodeError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
	}
	return out, nil
}

func (b clientSandboxes) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	return b.c.Sandbox(id).Files.ReadTo(ctx, path, w)
}

func (b clientSandboxes) WriteFile(ctx context.Context, id, path string, r io.Reader) (sandboxes.FileInfo, error) {
	content, err := io.ReadAll(r) // the tool's argument, already in memory
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	if content == nil {
		content = []byte{}
	}
	fe, err := b.c.Sandbox(id).Files.Write(ctx, path, content)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	return fromClientEntry(*fe), nil
}

func (b clientSandboxes) ListFiles(ctx context.Context, id, path string) ([]sandboxes.FileInfo, error) {
	list, err := b.c.Sandbox(id).Files.List(ctx, path)
	if err != nil {
		return nil, err
	}
	out := make([]sandboxes.FileInfo, 0, len(list))
	for _, fe := range list {
		out = append(out, fromClientEntry(fe))
	}
	return out, nil
}

func (b clientSandboxes) KillSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	return b.update(ctx, id, (*client.Sandbox).Kill)
}

func (b clientSandboxes) PauseSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	return b.update(ctx, id, (*client.Sandbox).Pause)
}

func (b clientSandboxes) ResumeSandbox(ctx context.Context, id string) (sandboxes.Sandbox, error) {
	return b.update(ctx, id, (*client.Sandbox).Resume)
}

// update calls one of the Sandbox methods that answer the sandbox.
func (b clientSandboxes) update(ctx context.Context, id string, call func(*client.Sandbox, context.Context) error) (sandboxes.Sandbox, error) {
	sb := b.c.Sandbox(id)
	if err := call(sb, ctx); err != nil {
		return sandboxes.Sandbox{}, err
	}
	return fromClientSandbox(sb), nil
}

func fromClientSandbox(sb *client.Sandbox) sandboxes.Sandbox {
	l := sb.Limits
	out := sandboxes.Sandbox{
		ID: sb.ID, Status: sandboxes.Status(sb.Status), Reason: sb.Reason, Message: sb.Message, Image: sb.Image,
		ImageVersion: sb.ImageVersion, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, OnTimeout: sb.OnTimeout,
		Limits: sandboxes.Limits{MemoryMB: l.MemoryMB, CPUs: l.CPUs, Pids: l.Pids, HomeMB: l.HomeMB, TmpMB: l.TmpMB,
			OutputBytes: l.OutputBytes, MaxLifetimeS: l.MaxLifetimeS, MaxFileMB: l.MaxFileMB, FileSizeBytes: l.FileSizeBytes},
		Metadata: sb.Metadata, AliveSeconds: sb.AliveSeconds, CPUSeconds: sb.CPUSeconds,
	}
	if !sb.EndedAt.IsZero() {
		t := sb.EndedAt
		out.EndedAt = &t
	}
	if n := l.Network; n != nil {
		out.Limits.Network = &sandboxes.Network{Allow: n.Allow, MaxBytes: n.MaxBytes}
	}
	if u := sb.Network; u != nil {
		out.Network = &sandboxes.NetworkUsage{BytesIn: u.BytesIn, BytesOut: u.BytesOut, Connections: u.Connections, Refused: u.Refused,
			Attempts: make([]egress.Attempt, 0, len(u.Attempts))}
		for _, a := range u.Attempts {
			out.Network.Attempts = append(out.Network.Attempts, egress.Attempt(a))
		}
	}
	return out
}

func fromClientEntry(fe client.FileEntry) sandboxes.FileInfo {
	return sandboxes.FileInfo{Name: fe.Name, Path: fe.Path, Type: fe.Type, Size: fe.Size, Mode: fe.Mode, ModTime: fe.ModTime}
}
