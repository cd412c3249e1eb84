package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// Sandboxes that stay: one sandbox across many calls, with commands,
// files, pause and resume.
//
//	sb, err := c.CreateSandbox(ctx, client.SandboxParams{Timeout: 10 * time.Minute})
//	...
//	defer sb.Kill(ctx)
//	sb.Files.Write(ctx, "data.csv", csv)
//	res, err := sb.Commands.Run(ctx, "python3 -c 'print(open(\"data.csv\").read())'")

// SandboxStatus is where a sandbox stands: running, paused or ended.
type SandboxStatus string

// The statuses of a sandbox.
const (
	SandboxRunning SandboxStatus = "running"
	SandboxPaused  SandboxStatus = "paused"
	SandboxEnded   SandboxStatus = "ended"
)

// CodeSandboxNotRunning, CodeProcessFinished and CodeSandboxLimit are the
// errors particular to sandboxes: the sandbox has ended, the command has
// finished, the plan's concurrent sandboxes are running.
const (
	CodeSandboxNotRunning = "sandbox_not_running"
	CodeProcessFinished   = "process_finished"
	CodeSandboxLimit      = "sandbox_limit"
)

// SandboxLimits are a sandbox's resources.
type SandboxLimits = wire.SandboxLimits

// SandboxUsage is the sandboxes part of Usage.
type SandboxUsage = wire.SandboxUsage

// FileEntry is a file inside a sandbox.
type FileEntry = wire.FileEntry

// Sandbox is one sandbox that stays, as last seen: the methods that
// change it (Refresh, Pause, Resume, Kill, SetTimeout) update these
// fields, and nothing else does. A command or file call to a paused
// sandbox resumes it on the server, and an expiry ends it there, without
// changing Status here: call Refresh to see where it stands. Use one
// Sandbox from one goroutine at a time, or take copies of its fields; its
// Commands and Files are safe for concurrent use.
type Sandbox struct {
	ID     string        `json:"id"`
	Status SandboxStatus `json:"status"`
	// Reason says why it ended (killed, expired, error, node_lost);
	// Message what went wrong for error.
	Reason       string            `json:"reason,omitempty"`
	Message      string            `json:"message,omitempty"`
	Image        string            `json:"image"`
	ImageVersion string            `json:"image_version"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	EndedAt      time.Time         `json:"ended_at,omitzero"` // zero until it ends
	OnTimeout    string            `json:"on_timeout"`        // kill or pause
	Limits       SandboxLimits     `json:"limits"`
	Metadata     map[string]string `json:"metadata"`
	// AliveSeconds is its wall time running (not paused), CPUSeconds its
	// CPU time.
	AliveSeconds float64 `json:"alive_seconds"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	// Network is a running sandbox's traffic through its egress proxy (nil
	// without network): bytes, connections and its last attempts.
	Network *wire.NetworkUsage `json:"network,omitempty"`

	// Commands runs commands in the sandbox; Files reads and writes its
	// files.
	Commands *Commands `json:"-"`
	Files    *Files    `json:"-"`
	// Contexts manages its code contexts, in which RunCode runs cells.
	Contexts *Contexts `json:"-"`

	c *Client
}

// Sandbox is a handle for the sandbox id without asking the server: its
// fields other than ID are zero until Refresh or a call that answers the
// sandbox (Pause, Resume, Kill, SetTimeout). Use it to act on a sandbox
// whose id you kept.
func (c *Client) Sandbox(id string) *Sandbox {
	return c.newSandbox(wire.Sandbox{ID: id})
}

func (c *Client) newSandbox(w wire.Sandbox) *Sandbox {
	sb := &Sandbox{c: c}
	sb.set(w)
	sb.Commands = &Commands{c: c, id: w.ID}
	sb.Files = &Files{c: c, id: w.ID}
	sb.Contexts = &Contexts{c: c, id: w.ID}
	return sb
}

func (sb *Sandbox) set(w wire.Sandbox) {
	sb.ID, sb.Status, sb.Reason, sb.Message = w.ID, SandboxStatus(w.Status), deref(w.Reason), deref(w.Message)
	sb.Image, sb.ImageVersion, sb.CreatedAt, sb.ExpiresAt, sb.OnTimeout = w.Image, w.ImageVersion, w.CreatedAt, w.ExpiresAt, w.OnTimeout
	sb.EndedAt = time.Time{}
	if w.EndedAt != nil {
		sb.EndedAt = *w.EndedAt
	}
	sb.Limits, sb.Metadata, sb.AliveSeconds, sb.CPUSeconds, sb.Network = w.Limits, w.Metadata, w.AliveSeconds, w.CPUSeconds, w.Network
}

// SandboxParams configure CreateSandbox; every field may be left zero for
// the server's default.
type SandboxParams struct {
	// Image is the image to run ("default" when empty).
	Image string
	// Timeout is how long until the sandbox expires (5 minutes when
	// zero), at most the plan's lifetime; whole seconds.
	Timeout time.Duration
	// Env is the environment of every command.
	Env map[string]string
	// Metadata are labels of your own, to filter ListSandboxes by.
	Metadata map[string]string
	// Files are placed under /home/user before the sandbox starts.
	Files []File
	// OnTimeout is "kill" (the default) or "pause": what happens at
	// ExpiresAt.
	OnTimeout string
	// Network narrows the plan's egress allowlist: nil takes the plan's
	// (none on the built-in plans), an empty Allow asks for no network,
	// and names, *.suffix wildcards and CIDRs beyond the plan's are
	// refused (403).
	Network *wire.NetworkRequest
	// IdempotencyKey makes the create retry-safe across processes: the
	// same key returns the same sandbox. Without it the client makes one
	// per call, which protects its own retries.
	IdempotencyKey string
}

func wholeSeconds(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := float64((d + time.Second - 1) / time.Second)
	return &s
}

// request is the body of POST /v1/sandboxes; fields left zero are left
// out.
func (p SandboxParams) request() wire.SandboxRequest {
	req := wire.SandboxRequest{Image: nonEmpty(p.Image), TimeoutS: wholeSeconds(p.Timeout), OnTimeout: nonEmpty(p.OnTimeout)}
	if p.Network != nil {
		req.Network = &wire.NetworkRequest{Allow: append([]string{}, p.Network.Allow...)}
	}
	if len(p.Env) > 0 {
		req.Env = p.Env
	}
	if len(p.Metadata) > 0 {
		req.Metadata = p.Metadata
	}
	for _, f := range p.Files {
		req.Files = append(req.Files, encodeFile(f))
	}
	return req
}

// CreateSandbox starts a sandbox that stays until Kill or its expiry.
func (c *Client) CreateSandbox(ctx context.Context, p SandboxParams) (*Sandbox, error) {
	cl, err := c.postCall("/v1/sandboxes", p.request(), p.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	w, err := doDecode[wire.Sandbox](ctx, c, cl)
	if err != nil {
		return nil, err
	}
	return c.newSandbox(w), nil
}

// GetSandbox returns a sandbox of this key's tenant, in any status: the
// way back to a sandbox made by another process.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	if id == "" {
		return nil, errors.New("vertal: empty sandbox id")
	}
	var w wire.Sandbox
	if _, err := c.do(ctx, call{method: http.MethodGet, path: sandboxPath(id, ""), retry: retryAlways, decodes: &w}); err != nil {
		return nil, err
	}
	return c.newSandbox(w), nil
}

func sandboxPath(id, rest string) string { return "/v1/sandboxes/" + url.PathEscape(id) + rest }

// ListParams filter ListSandboxes.
type ListParams struct {
	Status   SandboxStatus     // "" is any
	Metadata map[string]string // every pair must match
	Limit    int               // 0 is the server's (50); at most 100
	Cursor   string            // SandboxPage.NextCursor of the page before
}

// SandboxPage is one page of sandboxes, newest first; NextCursor is ""
// on the last.
type SandboxPage struct {
	Sandboxes  []*Sandbox
	NextCursor string
}

// ListSandboxes lists this key's tenant's sandboxes, a page at a time.
func (c *Client) ListSandboxes(ctx context.Context, p ListParams) (*SandboxPage, error) {
	q := url.Values{}
	if p.Status != "" {
		q.Set("status", string(p.Status))
	}
	for k, v := range p.Metadata {
		q.Set("metadata."+k, v)
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var w wire.SandboxList
	if _, err := c.do(ctx, call{method: http.MethodGet, path: path, retry: retryAlways, decodes: &w}); err != nil {
		return nil, err
	}
	page := &SandboxPage{NextCursor: deref(w.NextCursor)}
	for _, s := range w.Sandboxes {
		page.Sandboxes = append(page.Sandboxes, c.newSandbox(s))
	}
	return page, nil
}

// update runs a call that answers the sandbox and takes its fields.
func (sb *Sandbox) update(ctx context.Context, cl call) error {
	w, err := doDecode[wire.Sandbox](ctx, sb.c, cl)
	if err != nil {
		return err
	}
	sb.set(w)
	return nil
}

// Refresh reads the sandbox again.
func (sb *Sandbox) Refresh(ctx context.Context) error {
	return sb.update(ctx, call{method: http.MethodGet, path: sandboxPath(sb.ID, ""), retry: retryAlways})
}

// Kill ends the sandbox; it stays readable (ended, reason killed) for the
// server's retention period.
func (sb *Sandbox) Kill(ctx context.Context) error {
	return sb.update(ctx, call{method: http.MethodDelete, path: sandboxPath(sb.ID, ""), retry: retryAlways})
}

// Pause stops its processes and saves its files; Resume, or any command
// or file call, brings it back with the files (not the processes).
func (sb *Sandbox) Pause(ctx context.Context) error {
	return sb.update(ctx, call{method: http.MethodPost, path: sandboxPath(sb.ID, "/pause"), retry: retryAlways})
}

// Resume brings a paused sandbox back.
func (sb *Sandbox) Resume(ctx context.Context) error {
	return sb.update(ctx, call{method: http.MethodPost, path: sandboxPath(sb.ID, "/resume"), retry: retryAlways})
}

// SetTimeout makes the sandbox expire d from now (whole seconds), up to
// the plan's lifetime counted from its creation.
func (sb *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	body, err := json.Marshal(wire.SandboxTimeoutRequest{TimeoutS: wholeSeconds(d)})
	if err != nil {
		return err
	}
	return sb.update(ctx, call{method: http.MethodPost, path: sandboxPath(sb.ID, "/timeout"), body: body, retry: retryAlways})
}

// Commands runs commands in one sandbox.
type Commands struct {
	c  *Client
	id string
}

// CommandOption configures one command.
type CommandOption func(*wire.CommandRequest)

// WithArgv runs argv directly instead of a shell line (pass "" as the
// command).
func WithArgv(argv ...string) CommandOption {
	return func(r *wire.CommandRequest) { r.Argv, r.Cmd = argv, nil }
}

// WithCwd sets the working directory (/home/user by default).
func WithCwd(dir string) CommandOption { return func(r *wire.CommandRequest) { r.Cwd = nonEmpty(dir) } }

// WithCommandEnv adds environment variables of this command.
func WithCommandEnv(env map[string]string) CommandOption {
	return func(r *wire.CommandRequest) {
		if r.Env == nil {
			r.Env = map[string]string{}
		}
		maps.Copy(r.Env, env)
	}
}

// WithCommandStdin writes s to the command's standard input, then closes
// it.
func WithCommandStdin(s string) CommandOption { return func(r *wire.CommandRequest) { r.Stdin = &s } }

// WithCommandTimeout bounds a foreground command (the plan's default
// timeout otherwise) or a background one (until the sandbox ends
// otherwise); whole seconds.
func WithCommandTimeout(d time.Duration) CommandOption {
	return func(r *wire.CommandRequest) { r.TimeoutS = wholeSeconds(d) }
}

func (cs *Commands) request(cmd string, opts []CommandOption, background bool) ([]byte, error) {
	req := wire.CommandRequest{Cmd: nonEmpty(cmd)}
	for _, o := range opts {
		o(&req)
	}
	if background {
		req.Background = &background
	}
	return json.Marshal(req)
}

// commandCall is POST .../commands: it runs something, so only a refusal
// the server answered before doing anything (429) is retried.
func (cs *Commands) commandCall(cmd string, opts []CommandOption, background bool) (call, error) {
	body, err := cs.request(cmd, opts, background)
	if err != nil {
		return call{}, fmt.Errorf("vertal: encoding request: %w", err)
	}
	return call{method: http.MethodPost, path: sandboxPath(cs.id, "/commands"), body: body, retry: retryRateLimitOnly}, nil
}

// CommandResult is a foreground command's outcome. A command that fails
// or times out is a result (check Status and ExitCode), not an error.
type CommandResult struct {
	PID        int
	Status     Status // succeeded, failed, timed_out, memory_exceeded
	Stdout     string
	Stderr     string
	ExitCode   int
	DurationMS int64
	Truncated  bool
	CPUSeconds float64
	RequestID  string
}

func toResult(w wire.CommandResult) *CommandResult {
	return &CommandResult{PID: w.PID, Status: Status(w.Status), Stdout: w.Stdout, Stderr: w.Stderr, ExitCode: w.ExitCode,
		DurationMS: w.DurationMS, Truncated: w.Truncated, CPUSeconds: w.Usage.CPUSeconds, RequestID: w.RequestID}
}

// Run runs cmd (a shell line, by /bin/sh -c) in the foreground and waits
// for it. Files and background processes persist between commands.
func (cs *Commands) Run(ctx context.Context, cmd string, opts ...CommandOption) (*CommandResult, error) {
	cl, err := cs.commandCall(cmd, opts, false)
	if err != nil {
		return nil, err
	}
	w, err := doDecode[wire.CommandResult](ctx, cs.c, cl)
	if err != nil {
		return nil, err
	}
	return toResult(w), nil
}

// CommandEvent is one event of a command's stream: EventStdout and
// EventStderr carry Text; EventExit (Attach) carries ExitCode; EventResult
// (Stream) carries the Result; EventError the failure.
type CommandEvent struct {
	Type     EventType
	ID       string // pass to Attach as lastEventID to resume after it
	Text     string
	ExitCode int
	Result   *CommandResult
	Error    *Error
}

// EventExit is a command stream's last event when attached to it.
const EventExit EventType = "exit"

// Stream runs cmd in the foreground like Run, and yields its output as it
// comes, then an EventResult. A refusal before it ran is yielded as an
// *Error. The command is not run again if the connection drops.
func (cs *Commands) Stream(ctx context.Context, cmd string, opts ...CommandOption) iter.Seq2[CommandEvent, error] {
	return func(yield func(CommandEvent, error) bool) {
		cl, err := cs.commandCall(cmd, opts, false)
		if err != nil {
			yield(CommandEvent{}, err)
			return
		}
		cl.accept = eventStreamType
		resp, err := cs.c.open(ctx, cl)
		if err != nil {
			yield(CommandEvent{}, err)
			return
		}
		_, _, err = readCommandEvents(resp, "", yield)
		if err != nil {
			yield(CommandEvent{}, err)
		}
	}
}

// Process is a command of a sandbox, running or finished.
type Process struct {
	PID       int
	Cmd       string
	Argv      []string
	Running   bool
	ExitCode  *int // nil while it runs
	StartedAt time.Time
	EndedAt   time.Time // zero while it runs
}

func toProcess(w wire.Command) Process {
	p := Process{PID: w.PID, Cmd: deref(w.Cmd), Argv: w.Argv, Running: w.Running, ExitCode: w.ExitCode, StartedAt: w.StartedAt}
	if w.EndedAt != nil {
		p.EndedAt = *w.EndedAt
	}
	return p
}

// Start starts cmd in the background and answers at once; follow it with
// Attach, feed it with SendStdin, stop it with Signal.
func (cs *Commands) Start(ctx context.Context, cmd string, opts ...CommandOption) (*Process, error) {
	cl, err := cs.commandCall(cmd, opts, true)
	if err != nil {
		return nil, err
	}
	w, err := doDecode[wire.Command](ctx, cs.c, cl)
	if err != nil {
		return nil, err
	}
	p := toProcess(w)
	return &p, nil
}

// List lists the sandbox's background commands, running or finished.
func (cs *Commands) List(ctx context.Context) ([]Process, error) {
	var w wire.CommandList
	if _, err := cs.c.do(ctx, call{method: http.MethodGet, path: sandboxPath(cs.id, "/commands"), retry: retryAlways, decodes: &w}); err != nil {
		return nil, err
	}
	out := make([]Process, 0, len(w.Commands))
	for _, cmd := range w.Commands {
		out = append(out, toProcess(cmd))
	}
	return out, nil
}

func pidPath(id string, pid int, rest string) string {
	return sandboxPath(id, "/commands/"+strconv.Itoa(pid)+rest)
}

// SendStdin writes data to a background command's standard input, and
// closes it if eof.
func (cs *Commands) SendStdin(ctx context.Context, pid int, data string, eof bool) error {
	req := wire.StdinRequest{}
	if data != "" {
		req.Data = &data
	}
	if eof {
		req.EOF = &eof
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	_, err = cs.c.do(ctx, call{method: http.MethodPost, path: pidPath(cs.id, pid, "/stdin"), body: body, retry: retryRateLimitOnly, decodes: &wire.Ack{}})
	return err
}

// Signal sends a signal by name (TERM, KILL, INT, HUP, QUIT, USR1, USR2,
// STOP, CONT) to a command.
func (cs *Commands) Signal(ctx context.Context, pid int, signal string) error {
	body, err := json.Marshal(wire.SignalRequest{Signal: &signal})
	if err != nil {
		return err
	}
	_, err = cs.c.do(ctx, call{method: http.MethodPost, path: pidPath(cs.id, pid, "/signal"), body: body, retry: retryRateLimitOnly, decodes: &wire.Ack{}})
	return err
}

// Attach follows a command's events: from the start with lastEventID
// empty, else after that event. It yields stdout and stderr, then
// EventExit. A dropped connection is resumed where it broke.
func (cs *Commands) Attach(ctx context.Context, pid int, lastEventID string) iter.Seq2[CommandEvent, error] {
	return func(yield func(CommandEvent, error) bool) {
		for reconnects := 0; ; reconnects++ {
			h := http.Header{}
			if lastEventID != "" {
				h.Set("Last-Event-ID", lastEventID)
			}
			resp, err := cs.c.open(ctx, call{method: http.MethodGet, path: pidPath(cs.id, pid, "/events"), header: h, retry: retryAlways, accept: eventStreamType})
			if err != nil {
				yield(CommandEvent{}, err)
				return
			}
			var done bool
			done, lastEventID, err = readCommandEvents(resp, lastEventID, yield)
			if done {
				return
			}
			if ctx.Err() != nil || reconnects >= cs.c.maxRetries {
				yield(CommandEvent{}, cmp.Or(err, ctx.Err()))
				return
			}
			if err := cs.c.sleep(ctx, cs.c.backoff(reconnects)); err != nil {
				yield(CommandEvent{}, err)
				return
			}
		}
	}
}

// readCommandEvents yields one response's events and closes it. done is
// true when the stream reached its last event or the caller stopped; else
// err says how it broke, and lastID where.
func readCommandEvents(resp *http.Response, lastID string, yield func(CommandEvent, error) bool) (done bool, _ string, err error) {
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != eventStreamType {
		return true, lastID, fmt.Errorf("vertal: event stream answered with Content-Type %q", resp.Header.Get("Content-Type"))
	}
	r := newSSEReader(resp.Body, maxResponseBytes, lastID)
	for {
		sev, err := r.next()
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return false, r.lastID, fmt.Errorf("vertal: reading event stream: %w", err)
		}
		ev := CommandEvent{Type: EventType(sev.event), ID: sev.id}
		data := []byte(sev.data)
		switch ev.Type {
		case EventStdout, EventStderr:
			var d wire.OutputEvent
			err = json.Unmarshal(data, &d)
			ev.Text = d.Text
		case EventExit:
			var d wire.ExitEvent
			err = json.Unmarshal(data, &d)
			ev.ExitCode = d.ExitCode
		case EventResult:
			var d wire.CommandResult
			err = json.Unmarshal(data, &d)
			ev.Result = toResult(d)
		case EventError:
			var d wire.Error
			if err := json.Unmarshal(data, &d); err != nil {
				return true, r.lastID, fmt.Errorf("vertal: decoding %s event: %w", sev.event, err)
			}
			ev.Error = &Error{Code: d.Error.Code, Message: d.Error.Message, RequestID: cmp.Or(d.RequestID, resp.Header.Get("X-Request-ID"))}
			yield(ev, ev.Error)
			return true, r.lastID, nil
		default:
			continue // an event this version does not know
		}
		if err != nil {
			return true, r.lastID, fmt.Errorf("vertal: decoding %s event: %w", sev.event, err)
		}
		if !yield(ev, nil) || ev.Type == EventExit || ev.Type == EventResult {
			return true, r.lastID, nil
		}
	}
}

// Files reads and writes the files of one sandbox. Relative paths are
// under /home/user.
type Files struct {
	c  *Client
	id string
}

func filesPath(id, rest, path string) string {
	return sandboxPath(id, "/files"+rest) + "?" + url.Values{"path": {path}}.Encode()
}

// ReadTo downloads a file into w and returns how many bytes it wrote.
func (fs *Files) ReadTo(ctx context.Context, path string, w io.Writer) (int64, error) {
	resp, err := fs.c.open(ctx, call{method: http.MethodGet, path: filesPath(fs.id, "", path), retry: retryAlways, accept: "application/octet-stream"})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		return 0, fmt.Errorf("vertal: %s is a directory; use List", path)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("vertal: reading %s: %w", path, err)
	}
	return n, nil
}

// Read downloads a file.
func (fs *Files) Read(ctx context.Context, path string) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := fs.ReadTo(ctx, path, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write uploads content to path, making its parents, and returns what was
// written. Content is capped at the sandbox's Limits.MaxFileMB.
func (fs *Files) Write(ctx context.Context, path string, content []byte) (*FileEntry, error) {
	var fe FileEntry
	if content == nil {
		content = []byte{}
	}
	_, err := fs.c.do(ctx, call{method: http.MethodPut, path: filesPath(fs.id, "", path), body: content, ctype: "application/octet-stream", retry: retryAlways, decodes: &fe})
	if err != nil {
		return nil, err
	}
	return &fe, nil
}

// List lists a directory.
func (fs *Files) List(ctx context.Context, path string) ([]FileEntry, error) {
	resp, err := fs.c.open(ctx, call{method: http.MethodGet, path: filesPath(fs.id, "", path), retry: retryAlways})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "application/json" {
		return nil, fmt.Errorf("vertal: %s is not a directory; use Read", path)
	}
	var l wire.FileList
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponseBytes)).Decode(&l); err != nil {
		return nil, fmt.Errorf("vertal: decoding the listing of %s: %w", path, err)
	}
	return l.Entries, nil
}

// Remove removes a file, or a directory with what it holds.
func (fs *Files) Remove(ctx context.Context, path string) error {
	_, err := fs.c.do(ctx, call{method: http.MethodDelete, path: filesPath(fs.id, "", path), retry: retryAlways, decodes: &wire.Ack{}})
	return err
}

// Mkdir makes a directory and its parents.
func (fs *Files) Mkdir(ctx context.Context, path string) (*FileEntry, error) {
	body, err := json.Marshal(wire.PathRequest{Path: &path})
	if err != nil {
		return nil, err
	}
	var fe FileEntry
	if _, err := fs.c.do(ctx, call{method: http.MethodPost, path: sandboxPath(fs.id, "/files/mkdir"), body: body, retry: retryAlways, decodes: &fe}); err != nil {
		return nil, err
	}
	return &fe, nil
}

// Move moves or renames a file inside the sandbox.
func (fs *Files) Move(ctx context.Context, from, to string) (*FileEntry, error) {
	body, err := json.Marshal(wire.MoveRequest{From: &from, To: &to})
	if err != nil {
		return nil, err
	}
	var fe FileEntry
	if _, err := fs.c.do(ctx, call{method: http.MethodPost, path: sandboxPath(fs.id, "/files/move"), body: body, retry: retryRateLimitOnly, decodes: &fe}); err != nil {
		return nil, err
	}
	return &fe, nil
}
