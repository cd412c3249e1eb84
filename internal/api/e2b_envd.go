package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kuboprotocol/vertal2kubo/internal/e2b/envdpb/filesystem"
	"github.com/kuboprotocol/vertal2kubo/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/kuboprotocol/vertal2kubo/internal/e2b/envdpb/process"
	"github.com/kuboprotocol/vertal2kubo/internal/e2b/envdpb/process/processconnect"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// The E2B data plane: envd's process and filesystem Connect services,
// its /files and /health, and (e2b_interpreter.go) the code interpreter.
// The SDK sends every call to E2B_SANDBOX_URL and names the sandbox and
// the in-sandbox port in headers; it authenticates with the sandbox's own
// access token, never with the API key.
const (
	e2bSandboxHeader = "E2b-Sandbox-Id"
	e2bPortHeader    = "E2b-Sandbox-Port"
	e2bEnvdPort      = "49983"
	e2bJupyterPort   = "49999"
	// e2bUser is the one user there is: the sandbox's unprivileged user,
	// whose home is engine.HomeDir, as in E2B's default template.
	e2bUser = "user"
)

// e2bDataRoutes registers the data plane under p ("/e2b" or "/api/e2b").
func (s *Server) e2bDataRoutes(p string) {
	procPath, procHandler := processconnect.NewProcessHandler(e2bProcess{s}, e2bConnectOptions...)
	fsPath, fsHandler := filesystemconnect.NewFilesystemHandler(e2bFilesystem{s}, e2bConnectOptions...)
	s.handle("POST "+p+procPath, s.e2bData(connectHandler(p, procHandler)))
	s.handle("POST "+p+fsPath, s.e2bData(connectHandler(p, fsHandler)))
	s.handle("GET "+p+"/files", s.e2bData(s.e2bReadFile))
	s.handle("POST "+p+"/files", s.e2bData(s.e2bWriteFiles))
	s.handle("GET "+p+"/health", s.e2bHealth)
	s.handle("POST "+p+"/execute", s.e2bData(s.e2bExecute))
	s.handle("POST "+p+"/contexts", s.e2bData(s.e2bCreateContext))
	s.handle("GET "+p+"/contexts", s.e2bData(s.e2bListContexts))
	s.handle("DELETE "+p+"/contexts/{cid}", s.e2bData(s.e2bDeleteContext))
	s.handle("POST "+p+"/contexts/{cid}/restart", s.e2bData(s.e2bRestartContext))
}

// e2bConnectOptions bound what a Connect call may make the server hold:
// a message of at most e2bMaxMessage bytes, and no compression, so that a
// small gzip body cannot inflate to gigabytes on the server (the SDK
// sends its messages uncompressed). What a message may carry is small:
// paths, a command line, a chunk of stdin.
var e2bConnectOptions = []connect.HandlerOption{
	connect.WithReadMaxBytes(e2bMaxMessage),
	connect.WithCompression("gzip", nil, nil),
}

const e2bMaxMessage = 1 << 20

// connectHandler serves a Connect service mounted under prefix, with
// the caller e2bData put in the request's context.
func connectHandler(prefix string, h http.Handler) sandboxFunc {
	strip := http.StripPrefix(prefix, h)
	return func(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
		ctx := context.WithValue(r.Context(), e2bCallKey{}, e2bCall{c: c, id: id})
		strip.ServeHTTP(w, r.WithContext(ctx))
		return nil
	}
}

type e2bCallKey struct{}

// e2bCall is who a data-plane call acts for, and on which sandbox.
type e2bCall struct {
	c  *Caller
	id string
}

func e2bCallFrom(ctx context.Context) (e2bCall, error) {
	call, ok := ctx.Value(e2bCallKey{}).(e2bCall)
	if !ok {
		return call, connect.NewError(connect.CodeUnauthenticated, errors.New("no sandbox access token"))
	}
	return call, nil
}

// e2bData authenticates a data-plane call: the sandbox in E2b-Sandbox-Id
// and its access token (X-Access-Token, or E2B-Traffic-Access-Token,
// which the code interpreter's context calls send alone). The call then
// acts as the tenant that owns the sandbox, through its key, counted
// against its rate; a sandbox held by another node is forwarded there.
func (s *Server) e2bData(h sandboxFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.sbx == nil {
			return errSandboxesOff
		}
		ctx := r.Context()
		id := r.Header.Get(e2bSandboxHeader)
		token := r.Header.Get("X-Access-Token")
		if token == "" {
			token = r.Header.Get("E2B-Traffic-Access-Token")
		}
		tenant, keyID, err := s.sbx.ByAccessToken(ctx, id, token)
		if err != nil {
			return err
		}
		c, err := s.e2bCallerOfTenant(ctx, tenant, keyID)
		if err != nil {
			return err
		}
		infoFrom(ctx).sandboxID = id
		return s.serveCaller(w, r, c, func(w http.ResponseWriter, r *http.Request, c *Caller) (bool, error) {
			return s.forwardSandbox(w, r, c, id)
		}, func(w http.ResponseWriter, r *http.Request, c *Caller) error {
			return h(w, r, c, id)
		})
	}
}

// e2bHealth is envd's GET /health (204 while the sandbox runs, 502 when
// it does not) for a call that names a sandbox, else the E2B API's.
func (s *Server) e2bHealth(w http.ResponseWriter, r *http.Request) error {
	if r.Header.Get(e2bSandboxHeader) == "" {
		w.WriteHeader(http.StatusOK)
		return nil
	}
	return s.e2bData(func(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
		sb, err := s.sbx.Get(r.Context(), *c, id)
		if err != nil {
			return err
		}
		if sb.Status != sandboxes.StatusRunning {
			return errorf(KindSandboxNotRunning, "sandbox %s is %s", id, sb.Status)
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})(w, r)
}

// e2bConnectPath reports whether p is a Connect route of the data plane.
func e2bConnectPath(p string) bool {
	return strings.Contains(p, "/process.Process/") || strings.Contains(p, "/filesystem.Filesystem/")
}

// e2bDataStatus is the HTTP status a data-plane call answers for e: a
// sandbox that is not running is 502, as E2B's proxy answers, which the
// SDK turns into "the sandbox is probably not running".
func e2bDataStatus(e *Error) int {
	if e.Kind == KindSandboxNotRunning {
		return http.StatusBadGateway
	}
	return kindStatus(e.Kind)
}

// e2bCode is the Connect code of e.
func e2bCode(e *Error) connect.Code {
	switch e.Kind {
	case KindNotFound, KindProcessFinished:
		return connect.CodeNotFound
	case KindInvalidRequest, KindInvalidJSON, KindInvalidContentType, KindInvalidTimeout:
		return connect.CodeInvalidArgument
	case KindUnauthorized:
		return connect.CodeUnauthenticated
	case KindForbidden:
		return connect.CodePermissionDenied
	case KindRateLimited, KindQuotaExceeded, KindSandboxLimit, KindPayloadTooLarge:
		return connect.CodeResourceExhausted
	case KindSandboxNotRunning, KindOverloaded, KindUnavailable:
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// e2bConnectErr turns a service error into a Connect error.
func e2bConnectErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the call's timeout passed"))
	}
	if errors.Is(err, context.Canceled) {
		return connect.NewError(connect.CodeCanceled, errors.New("the call was canceled"))
	}
	e := asError(err)
	return connect.NewError(e2bCode(e), errors.New(e.Msg))
}

// e2bUserOf checks the user a call asks for (Authorization: Basic
// base64("name:")): only "user", the sandbox's own unprivileged user, is
// there; root is refused, never mapped to a privilege the sandbox lacks.
func e2bUserOf(h http.Header) error {
	auth := h.Get("Authorization")
	if auth == "" {
		return nil
	}
	scheme, v, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return nil // not a user selection (another proxy's credential)
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("the Authorization header's user is not valid base64"))
	}
	return e2bCheckUser(strings.TrimSuffix(string(b), ":"))
}

func e2bCheckUser(name string) error {
	switch name {
	case "", e2bUser:
		return nil
	case "root":
		return connect.NewError(connect.CodePermissionDenied, errors.New(`user "root" is not available: everything in a Vertal Run sandbox runs as its unprivileged user "user", with no root and no capabilities (see docs/E2B.md)`))
	}
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(`user %q does not exist: a Vertal Run sandbox has one user, "user" (see docs/E2B.md)`, clip(name, 40)))
}

// e2bProcess serves envd's process.Process.
type e2bProcess struct{ s *Server }

// Start runs a command in the background of the sandbox and streams its
// events (start, output, end). As envd does, the call's Connect timeout
// bounds the process's life, and a client that goes away leaves it
// running (commands.connect attaches again).
func (p e2bProcess) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	call, err := e2bCallFrom(ctx)
	if err != nil {
		return err
	}
	if err := e2bUserOf(req.Header()); err != nil {
		return err
	}
	m := req.Msg
	if m.GetPty() != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("PTYs are not supported by Vertal Run's E2B API: run commands without pty (see docs/E2B.md)"))
	}
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	// envd names the user in USER and LOGNAME; the sandbox's uid has no
	// passwd entry to name it by (docs/E2B.md, "Differences").
	env := map[string]string{"USER": e2bUser, "LOGNAME": e2bUser}
	maps.Copy(env, cfg.GetEnvs())
	cr := sandboxes.CommandRequest{
		Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Cwd: cfg.GetCwd(), Env: env, Background: true,
	}
	if dl, ok := ctx.Deadline(); ok {
		cr.TimeoutS = max(1, int((time.Until(dl)+time.Second-1)/time.Second))
	}
	cmd, err := p.s.sbx.StartCommand(context.WithoutCancel(ctx), *call.c, call.id, cr)
	if err != nil {
		return e2bConnectErr(err)
	}
	if !m.GetStdin() {
		// No stdin asked for: the command reads EOF, as under envd. A
		// command that is already done has no stdin left to close.
		_ = p.s.sbx.SendStdin(context.WithoutCancel(ctx), *call.c, call.id, cmd.PID, nil, true)
	}
	return p.s.e2bFollow(ctx, call, cmd.PID, req.Header(), func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

// e2bFollow sends pid's start event, then its output and end, as envd's
// process events; while the command is silent, a keepalive event every
// Keepalive-Ping-Interval seconds (as the SDK asks; 50 by default) keeps
// clients and proxies from cutting an idle stream.
func (s *Server) e2bFollow(ctx context.Context, call e2bCall, pid int, h http.Header, send func(*process.ProcessEvent) error) error {
	var mu sync.Mutex // send is not safe for concurrent use
	locked := func(ev *process.ProcessEvent) error {
		mu.Lock()
		defer mu.Unlock()
		return send(ev)
	}
	start := &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
	if err := locked(start); err != nil {
		return err
	}
	// At each keepalive the key behind the token is checked again: a
	// rotation ends the streams it had opened.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := keepalive(e2bKeepalive(h), func() {
		if _, err := s.e2bActiveKey(ctx, call.c.Key.Tenant, call.c.Key.ID); err != nil {
			cancel(err)
			return
		}
		_ = locked(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}})
	})
	defer stop()
	err := s.sbx.Events(ctx, *call.c, call.id, pid, 0, func(e sandboxes.Event) error {
		var ev process.ProcessEvent
		switch e.Type {
		case "stdout":
			ev.Event = &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(e.Data)}}}
		case "stderr":
			ev.Event = &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte(e.Data)}}}
		case "exit":
			end := &process.ProcessEvent_EndEvent{ExitCode: int32(e.ExitCode), Exited: true, Status: fmt.Sprintf("exit status %d", e.ExitCode)}
			if e.ExitCode != 0 {
				end.Error = &end.Status
			}
			ev.Event = &process.ProcessEvent_End{End: end}
		default:
			return nil
		}
		return locked(&ev)
	})
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		err = cause
	}
	if err != nil {
		return e2bConnectErr(err)
	}
	return nil
}

// e2bKeepalive is the keepalive interval a call asks for in
// Keepalive-Ping-Interval (seconds), within 5 s to 5 min; 50 s if none.
func e2bKeepalive(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 50 * time.Second
	}
	return time.Duration(min(max(n, 5), 300)) * time.Second
}

// keepalive calls ping every interval until stop is called; stop waits
// for a ping under way.
func keepalive(interval time.Duration, ping func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				ping()
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// Connect attaches to a running command: its start event, then its
// output from the beginning that the sandbox still holds, and its end.
func (p e2bProcess) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	call, err := e2bCallFrom(ctx)
	if err != nil {
		return err
	}
	pid, err := e2bPID(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	return p.s.e2bFollow(ctx, call, pid, req.Header(), func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}

// e2bProcCall is the call of a request about one process.
func e2bProcCall(ctx context.Context, sel *process.ProcessSelector) (e2bCall, int, error) {
	call, err := e2bCallFrom(ctx)
	if err != nil {
		return call, 0, err
	}
	pid, err := e2bPID(sel)
	return call, pid, err
}

// e2bPID is the pid a selector names; tags are not kept.
func e2bPID(sel *process.ProcessSelector) (int, error) {
	if sel == nil {
		return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process is required"))
	}
	if _, ok := sel.GetSelector().(*process.ProcessSelector_Tag); ok {
		return 0, connect.NewError(connect.CodeNotFound, errors.New("no process has that tag: Vertal Run's E2B API selects processes by pid"))
	}
	if sel.GetPid() == 0 {
		return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process.pid is required"))
	}
	return int(sel.GetPid()), nil
}

// List answers the sandbox's running commands.
func (p e2bProcess) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	call, err := e2bCallFrom(ctx)
	if err != nil {
		return nil, err
	}
	cmds, err := p.s.sbx.Commands(ctx, *call.c, call.id)
	if err != nil {
		return nil, e2bConnectErr(err)
	}
	out := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, c := range cmds {
		if !c.Running {
			continue
		}
		cfg := &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", c.Cmd}, Envs: map[string]string{}}
		if len(c.Argv) > 0 {
			cfg.Cmd, cfg.Args = c.Argv[0], c.Argv[1:]
		}
		out.Processes = append(out.Processes, &process.ProcessInfo{Config: cfg, Pid: uint32(c.PID)})
	}
	return connect.NewResponse(out), nil
}

// SendInput writes to a command's stdin.
func (p e2bProcess) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	call, pid, err := e2bProcCall(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	in, ok := req.Msg.GetInput().GetInput().(*process.ProcessInput_Stdin)
	if !ok {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input.stdin is required (PTYs are not supported)"))
	}
	if err := p.s.sbx.SendStdin(ctx, *call.c, call.id, pid, in.Stdin, false); err != nil {
		return nil, e2bConnectErr(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// CloseStdin closes a command's stdin.
func (p e2bProcess) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	call, pid, err := e2bProcCall(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.s.sbx.SendStdin(ctx, *call.c, call.id, pid, nil, true); err != nil {
		return nil, e2bConnectErr(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a command.
func (p e2bProcess) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	call, pid, err := e2bProcCall(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "KILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "TERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL"))
	}
	if err := p.s.sbx.Signal(ctx, *call.c, call.id, pid, sig); err != nil {
		return nil, e2bConnectErr(err)
	}
	if sig == "KILL" {
		// A killed command is gone when the call returns, as the SDK's
		// kill() promises: wait a little for its exit to be recorded.
		wait, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_ = p.s.sbx.Events(wait, *call.c, call.id, pid, 0, func(sandboxes.Event) error { return nil })
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// Update would resize a PTY; there are none.
func (p e2bProcess) Update(context.Context, *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("PTYs are not supported by Vertal Run's E2B API (see docs/E2B.md)"))
}

// e2bMaxInputMessages bounds one StreamInput.
const e2bMaxInputMessages = 10000

// StreamInput writes a stream of chunks to a command's stdin, in order:
// a start naming the process, then data (E2B's JS SDK uses SendInput).
func (p e2bProcess) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	call, err := e2bCallFrom(ctx)
	if err != nil {
		return nil, err
	}
	pid, n := 0, 0
	for stream.Receive() {
		// Each message is a write to the sandbox that no request counted:
		// a stream carries a bounded number, and checks every hundredth
		// that the key behind the token is still active.
		if n++; n > e2bMaxInputMessages {
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("a StreamInput carries at most %d messages; open another", e2bMaxInputMessages))
		}
		if n%100 == 0 {
			if _, err := p.s.e2bActiveKey(ctx, call.c.Key.Tenant, call.c.Key.ID); err != nil {
				return nil, e2bConnectErr(err)
			}
		}
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if pid, err = e2bPID(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			in, ok := ev.Data.GetInput().GetInput().(*process.ProcessInput_Stdin)
			switch {
			case pid == 0:
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("send a start event naming the process before data"))
			case !ok:
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input.stdin is required (PTYs are not supported)"))
			}
			if err := p.s.sbx.SendStdin(ctx, *call.c, call.id, pid, in.Stdin, false); err != nil {
				return nil, e2bConnectErr(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// e2bFilesystem serves envd's filesystem.Filesystem.
type e2bFilesystem struct{ s *Server }

// e2bFSCall is the call of a filesystem request, for the user it names.
func e2bFSCall(ctx context.Context, h http.Header) (e2bCall, error) {
	call, err := e2bCallFrom(ctx)
	if err != nil {
		return call, err
	}
	return call, e2bUserOf(h)
}

// e2bEntry is an entry as envd describes it.
func e2bEntry(fi sandboxes.FileInfo) *filesystem.EntryInfo {
	t := filesystem.FileType_FILE_TYPE_UNSPECIFIED
	switch fi.Type {
	case "file":
		t = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		t = filesystem.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		t = filesystem.FileType_FILE_TYPE_SYMLINK
	}
	var mode uint32
	_, _ = fmt.Sscanf(fi.Mode, "%o", &mode)
	perm := []byte("-rwxrwxrwx")
	switch t {
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		perm[0] = 'd'
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		perm[0] = 'l'
	}
	for i := range 9 {
		if mode&(1<<(8-i)) == 0 {
			perm[i+1] = '-'
		}
	}
	return &filesystem.EntryInfo{
		Name: fi.Name, Type: t, Path: fi.Path, Size: fi.Size, Mode: mode, Permissions: string(perm),
		Owner: e2bUser, Group: e2bUser, ModifiedTime: timestamppb.New(fi.ModTime),
	}
}

func (f e2bFilesystem) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	call, err := e2bFSCall(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	fi, err := f.s.sbx.Stat(ctx, *call.c, call.id, req.Msg.GetPath())
	if err != nil {
		return nil, e2bConnectErr(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e2bEntry(fi)}), nil
}

// e2bMaxListed bounds a recursive listing.
const e2bMaxListed = 10000

func (f e2bFilesystem) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	call, err := e2bFSCall(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	// Stat resumes a paused sandbox, as any file call does; the walk then
	// lists the running one.
	fi, err := f.s.sbx.Stat(ctx, *call.c, call.id, req.Msg.GetPath())
	if err != nil {
		return nil, e2bConnectErr(err)
	}
	if fi.Type != "dir" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", fi.Path))
	}
	out := &filesystem.ListDirResponse{Entries: []*filesystem.EntryInfo{}}
	err = f.s.sbx.WalkLive(ctx, *call.c, call.id, fi.Path, max(1, int(req.Msg.GetDepth())), e2bMaxListed, func(e sandboxes.FileInfo) {
		out.Entries = append(out.Entries, e2bEntry(e))
	})
	if err != nil {
		return nil, e2bConnectErr(err)
	}
	return connect.NewResponse(out), nil
}

func (f e2bFilesystem) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	call, err := e2bFSCall(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if fi, err := f.s.sbx.Stat(ctx, *call.c, call.id, req.Msg.GetPath()); err == nil {
		if fi.Type == "dir" {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", fi.Path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path already exists and is not a directory: %s", fi.Path))
	}
	fi, err := f.s.sbx.Mkdir(ctx, *call.c, call.id, req.Msg.GetPath())
	if err != nil {
		return nil, e2bConnectErr(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e2bEntry(fi)}), nil
}

func (f e2bFilesystem) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	call, err := e2bFSCall(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	fi, err := f.s.sbx.Move(ctx, *call.c, call.id, req.Msg.GetSource(), req.Msg.GetDestination())
	if err != nil {
		return nil, e2bConnectErr(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e2bEntry(fi)}), nil
}

// Remove removes a file or a directory with what it holds; a path that
// does not exist is already removed, as envd has it.
func (f e2bFilesystem) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	call, err := e2bFSCall(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	if err := f.s.sbx.Remove(ctx, *call.c, call.id, req.Msg.GetPath()); err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Kind != KindNotFound || e.Msg == "" || !strings.HasPrefix(e.Msg, "no such file") {
			return nil, e2bConnectErr(err)
		}
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// Watching a directory: the sandbox's agent has no inotify of its own,
// so a watch lists the directory (recursively down to e2bWatchDepth with
// recursive) every e2bWatchEvery, or less often for a tree whose listing
// takes longer (at most a fifth of the time is spent listing), and sends
// what changed as envd's events:
// a new entry is CREATE, a gone one REMOVE, a change of size or time
// WRITE, of mode CHMOD (a rename shows as REMOVE then CREATE). A tenant
// has at most e2bMaxWatches open at once.
const (
	e2bWatchEvery = 500 * time.Millisecond
	e2bWatchDepth = 16
	e2bWatchMax   = 5000 // entries a watched tree may hold
	e2bMaxWatches = 4    // open at once, per tenant
)

func (f e2bFilesystem) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	call, err := e2bFSCall(ctx, req.Header())
	if err != nil {
		return err
	}
	tenant := call.c.Key.Tenant
	if !f.s.e2bWatches.acquire(tenant) {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("a tenant may have %d directory watches open at once; stop one first", e2bMaxWatches))
	}
	defer f.s.e2bWatches.release(tenant)
	root := req.Msg.GetPath()
	fi, err := f.s.sbx.Stat(ctx, *call.c, call.id, root)
	if err != nil {
		return e2bConnectErr(err)
	}
	if fi.Type != "dir" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", fi.Path))
	}
	depth := 1
	if req.Msg.GetRecursive() {
		depth = e2bWatchDepth
	}
	// Each listing is of the running sandbox only (a watch never resumes
	// a paused one: it ends), and checks again that the key behind the
	// token is active, so a rotation also ends the watches it opened.
	snapshot := func() (map[string]sandboxes.FileInfo, error) {
		if _, err := f.s.e2bActiveKey(ctx, tenant, call.c.Key.ID); err != nil {
			return nil, err
		}
		m := map[string]sandboxes.FileInfo{}
		err := f.s.sbx.WalkLive(ctx, *call.c, call.id, fi.Path, depth, e2bWatchMax, func(e sandboxes.FileInfo) {
			m[strings.TrimPrefix(e.Path, fi.Path+"/")] = e
		})
		return m, err
	}
	prev, err := snapshot()
	if err != nil {
		return e2bConnectErr(err)
	}
	var mu sync.Mutex
	send := func(r *filesystem.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	if err := send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	stop := keepalive(e2bKeepalive(req.Header()), func() {
		_ = send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}})
	})
	defer stop()
	wait := e2bWatchEvery
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		began := time.Now()
		cur, err := snapshot()
		if err != nil {
			var e *Error
			if errors.As(err, &e) && e.Kind == KindSandboxNotRunning {
				return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was paused or has ended, so the watch ended"))
			}
			return e2bConnectErr(err)
		}
		// A large tree is listed less often: a watch spends at most a
		// fifth of its time listing.
		wait = max(e2bWatchEvery, 4*time.Since(began))
		for _, ev := range e2bDiff(prev, cur, req.Msg.GetIncludeEntry()) {
			if err := send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		prev = cur
	}
}

// e2bDiff is what changed from prev to cur, as envd's events, by name.
func e2bDiff(prev, cur map[string]sandboxes.FileInfo, withEntry bool) []*filesystem.FilesystemEvent {
	var out []*filesystem.FilesystemEvent
	add := func(name string, t filesystem.EventType, fi sandboxes.FileInfo) {
		ev := &filesystem.FilesystemEvent{Name: name, Type: t}
		if withEntry && t != filesystem.EventType_EVENT_TYPE_REMOVE {
			ev.Entry = e2bEntry(fi)
		}
		out = append(out, ev)
	}
	for _, name := range slices.Sorted(maps.Keys(cur)) {
		c := cur[name]
		p, ok := prev[name]
		switch {
		case !ok:
			add(name, filesystem.EventType_EVENT_TYPE_CREATE, c)
		case p.Size != c.Size || !p.ModTime.Equal(c.ModTime) || p.Type != c.Type:
			add(name, filesystem.EventType_EVENT_TYPE_WRITE, c)
		case p.Mode != c.Mode:
			add(name, filesystem.EventType_EVENT_TYPE_CHMOD, c)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(prev)) {
		if _, ok := cur[name]; !ok {
			add(name, filesystem.EventType_EVENT_TYPE_REMOVE, prev[name])
		}
	}
	return out
}

// watchCount counts the open directory watches of each tenant.
type watchCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (w *watchCount) acquire(tenant string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = map[string]int{}
	}
	if w.n[tenant] >= e2bMaxWatches {
		return false
	}
	w.n[tenant]++
	return true
}

func (w *watchCount) release(tenant string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[tenant]--; w.n[tenant] <= 0 {
		delete(w.n, tenant)
	}
}

func (f e2bFilesystem) CreateWatcher(context.Context, *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watchers are not supported by Vertal Run's E2B API: use WatchDir (see docs/E2B.md)"))
}

func (f e2bFilesystem) GetWatcherEvents(context.Context, *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watchers are not supported by Vertal Run's E2B API: use WatchDir (see docs/E2B.md)"))
}

func (f e2bFilesystem) RemoveWatcher(context.Context, *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watchers are not supported by Vertal Run's E2B API: use WatchDir (see docs/E2B.md)"))
}

// e2bFilesUser checks /files' username query.
func e2bFilesUser(r *http.Request) error {
	if err := e2bCheckUser(r.URL.Query().Get("username")); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodePermissionDenied {
			return errorf(KindForbidden, "%s", ce.Message())
		}
		return errorf(KindInvalidRequest, "%s", err.(*connect.Error).Message())
	}
	return nil
}

// e2bReadFile is envd's GET /files?path=: the file's bytes.
func (s *Server) e2bReadFile(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	if err := e2bFilesUser(r); err != nil {
		return err
	}
	p := r.URL.Query().Get("path")
	fi, err := s.sbx.Stat(r.Context(), *c, id, p)
	if err != nil {
		return err
	}
	if fi.Type == "dir" {
		return errorf(KindInvalidRequest, "%s is a directory: list it with files.list", fi.Path)
	}
	return s.sendFile(w, r, c, id, fi)
}

// e2bMaxUploadFiles bounds the files of one multipart upload.
const e2bMaxUploadFiles = 1000

// e2bWritten is one entry of POST /files' answer.
type e2bWritten struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// e2bWriteFiles is envd's POST /files: a multipart body with one "file"
// part per file (the path in the query, or each part's file name), or
// one file's raw bytes (application/octet-stream). Each is written as the
// sandbox's user, parents created, within the plan's size cap.
func (s *Server) e2bWriteFiles(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	if err := e2bFilesUser(r); err != nil {
		return err
	}
	if r.Header.Get("Content-Encoding") != "" {
		return errorf(KindInvalidRequest, "compressed uploads are not supported: send the file without gzip")
	}
	ctx := r.Context()
	limit, err := s.fileLimit(ctx, c, id)
	if err != nil {
		return err
	}
	qpath := r.URL.Query().Get("path")
	write := func(p string, body io.Reader) (e2bWritten, error) {
		fi, err := s.sbx.WriteFile(ctx, *c, id, p, body)
		var tooLarge *http.MaxBytesError
		switch {
		case errors.Is(err, errFileTooLarge) || (errors.As(err, &tooLarge) && tooLarge.Limit == limit):
			return e2bWritten{}, errorf(KindPayloadTooLarge, "%s is over %d bytes, this sandbox's max_file_mb (nothing of it was kept)", clip(p, 80), limit)
		case errors.As(err, &tooLarge):
			return e2bWritten{}, errorf(KindPayloadTooLarge, "the upload is over %d bytes in all (8 files of this sandbox's max_file_mb); the files before %s were written: send the rest in another upload", tooLarge.Limit, clip(p, 80))
		}
		if err != nil {
			return e2bWritten{}, err
		}
		return e2bWritten{Path: fi.Path, Name: fi.Name, Type: "file"}, nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		if qpath == "" {
			return errorf(KindInvalidRequest, "path is required")
		}
		one, err := write(qpath, http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			return err
		}
		return s.writeJSON(w, r, http.StatusOK, []e2bWritten{one})
	}
	if params["boundary"] == "" {
		return errorf(KindInvalidContentType, "a multipart body needs a boundary")
	}
	// The whole body is bounded by a few files' worth: each file by the cap.
	mr := multipart.NewReader(http.MaxBytesReader(w, r.Body, 8*limit+1<<20), params["boundary"])
	out := []e2bWritten{}
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return errorf(KindPayloadTooLarge, "the upload is over %d bytes in all (8 files of this sandbox's max_file_mb); the files before the cut were written: send the rest in another upload", 8*limit+1<<20)
		}
		if err != nil {
			return errorf(KindInvalidRequest, "the multipart body is malformed")
		}
		if part.FormName() != "file" {
			continue
		}
		p := qpath
		if p == "" {
			// The file name is the whole path: Part.FileName would keep its
			// base name only.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p = dp["filename"]
		}
		if p == "" {
			return errorf(KindInvalidRequest, "each file needs a path (the path query, or the part's file name)")
		}
		if seen[p] {
			return errorf(KindInvalidRequest, "the path %q is given twice", clip(p, 80))
		}
		if len(out) >= e2bMaxUploadFiles {
			return errorf(KindInvalidRequest, "at most %d files in one upload", e2bMaxUploadFiles)
		}
		seen[p] = true
		one, err := write(p, &capReader{r: part, left: limit})
		if err != nil {
			return err
		}
		out = append(out, one)
	}
	if len(out) == 0 {
		return errorf(KindInvalidRequest, `the multipart body has no part named "file"`)
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

// errFileTooLarge: one file of an upload is over the cap.
var errFileTooLarge = errors.New("file over the cap")

// capReader fails a read past left bytes with errFileTooLarge.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errFileTooLarge
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, errFileTooLarge
	}
	return n, err
}
