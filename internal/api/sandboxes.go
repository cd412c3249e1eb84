package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// Sandboxes is what the sandbox routes need of the sandboxes service
// (*sandboxes.Service): sandboxes that stay, with commands and files. The
// handlers only translate; tenancy, limits, quota and the sandboxes
// themselves are the service's.
type Sandboxes interface {
	Create(ctx context.Context, c execution.Caller, idemKey string, r sandboxes.CreateRequest) (sandboxes.Sandbox, error)
	Get(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	List(ctx context.Context, c execution.Caller, r sandboxes.ListRequest) (sandboxes.Page, error)
	Kill(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	SetTimeout(ctx context.Context, c execution.Caller, id string, timeout time.Duration) (sandboxes.Sandbox, error)
	Pause(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	Resume(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error)
	Run(ctx context.Context, c execution.Caller, id string, r sandboxes.CommandRequest, onEvent func(sandboxes.Event)) (sandboxes.CommandResult, error)
	StartCommand(ctx context.Context, c execution.Caller, id string, r sandboxes.CommandRequest) (sandboxes.Command, error)
	Commands(ctx context.Context, c execution.Caller, id string) ([]sandboxes.Command, error)
	SendStdin(ctx context.Context, c execution.Caller, id string, pid int, data []byte, eof bool) error
	Signal(ctx context.Context, c execution.Caller, id string, pid int, signal string) error
	Events(ctx context.Context, c execution.Caller, id string, pid int, after int64, fn func(sandboxes.Event) error) error
	Stat(ctx context.Context, c execution.Caller, id, path string) (sandboxes.FileInfo, error)
	ListDir(ctx context.Context, c execution.Caller, id, path string) ([]sandboxes.FileInfo, error)
	WalkLive(ctx context.Context, c execution.Caller, id, path string, depth, max int, fn func(sandboxes.FileInfo)) error
	ReadFile(ctx context.Context, c execution.Caller, id, path string, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, c execution.Caller, id, path string, r io.Reader) (sandboxes.FileInfo, error)
	Remove(ctx context.Context, c execution.Caller, id, path string) error
	Mkdir(ctx context.Context, c execution.Caller, id, path string) (sandboxes.FileInfo, error)
	Move(ctx context.Context, c execution.Caller, id, from, to string) (sandboxes.FileInfo, error)
	CreateContext(ctx context.Context, c execution.Caller, id string, r sandboxes.ContextRequest) (sandboxes.CodeContext, error)
	Contexts(ctx context.Context, c execution.Caller, id string) ([]sandboxes.CodeContext, error)
	DeleteContext(ctx context.Context, c execution.Caller, id, cid string) error
	RestartContext(ctx context.Context, c execution.Caller, id, cid string) (sandboxes.CodeContext, error)
	RunCode(ctx context.Context, c execution.Caller, id string, r sandboxes.RunCodeRequest, onEvent func(sandboxes.CodeEvent)) (sandboxes.CodeResult, error)
	Usage(ctx context.Context, c execution.Caller) (sandboxes.Usage, error)
	// ByAccessToken checks an E2B data-plane token (e2b_envd.go).
	ByAccessToken(ctx context.Context, id, token string) (tenant, keyID string, err error)
	// Owner is the base URL of the node holding c's sandbox live when that
	// is another node, else "".
	Owner(ctx context.Context, c execution.Caller, id string) (string, error)
}

var _ Sandboxes = (*sandboxes.Service)(nil)

// errSandboxesOff answers every sandbox route of a server started without
// the sandboxes service: 404, since there is no such resource here (a 503
// would make clients retry what can never succeed).
var errSandboxesOff = errorf(KindNotFound, "sandboxes are not enabled on this server")

// sandboxIDPattern is what a sandbox id looks like; anything else is not
// found without asking the service.
var sandboxIDPattern = regexp.MustCompile(`^sbx_[0-9a-f]{8,64}$`)

// smallBodyBytes caps the bodies that carry only a few names (timeout,
// signal, mkdir, move).
const smallBodyBytes = 64 << 10

// sandboxesOn authenticates, then refuses when sandboxes are off.
func (s *Server) sandboxesOn(h authedFunc) handlerFunc {
	return s.authed(func(w http.ResponseWriter, r *http.Request, c *Caller) error {
		if s.sbx == nil {
			return errSandboxesOff
		}
		return h(w, r, c)
	})
}

type sandboxFunc func(w http.ResponseWriter, r *http.Request, c *Caller, id string) error

// sandbox is sandboxesOn for a route of one sandbox: a malformed id is
// not found.
// One held live by another node is forwarded there (forward.go).
func (s *Server) sandbox(h sandboxFunc) handlerFunc {
	return s.authedAfter(s.sandboxPre, withPathID(h))
}

// sandboxPre checks the {id} of a route of one sandbox and forwards the
// call when another node holds it (done: it answered).
func (s *Server) sandboxPre(w http.ResponseWriter, r *http.Request, c *Caller) (bool, error) {
	if s.sbx == nil {
		return true, errSandboxesOff
	}
	id := r.PathValue("id")
	if !sandboxIDPattern.MatchString(id) {
		return true, errorf(KindNotFound, "no sandbox %q", clip(id, 80))
	}
	infoFrom(r.Context()).sandboxID = id
	return s.forwardSandbox(w, r, c, id)
}

// withPathID is h with the route's {id}.
func withPathID(h sandboxFunc) authedFunc {
	return func(w http.ResponseWriter, r *http.Request, c *Caller) error {
		return h(w, r, c, r.PathValue("id"))
	}
}

// pathPID is the {pid} of a route; a malformed one is not found.
func pathPID(r *http.Request) (int, error) {
	v := r.PathValue("pid")
	pid, err := strconv.Atoi(v)
	if err != nil || pid <= 0 || strconv.Itoa(pid) != v {
		return 0, errorf(KindNotFound, "no command %q", clip(v, 40))
	}
	return pid, nil
}

// decodeBody reads and strictly decodes a JSON body of at most limit bytes.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, release, err := s.readJSONBody(w, r, limit, limit)
	defer release()
	if err != nil {
		return err
	}
	return decodeStrict(body, v)
}

// seconds is a timeout_s as whole seconds; nil is 0 (the default).
func seconds(v *float64) (int, error) {
	if v == nil {
		return 0, nil
	}
	f := *v
	if f <= 0 || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0, errorf(KindInvalidTimeout, "timeout_s must be a whole number of seconds, at least 1")
	}
	return int(f), nil
}

func toWireSandbox(sb sandboxes.Sandbox, requestID string) wire.Sandbox {
	l := sb.Limits
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	var ended *time.Time
	if sb.EndedAt != nil {
		t := sb.EndedAt.UTC()
		ended = &t
	}
	var nl *wire.SandboxNetwork
	if n := l.Network; n != nil {
		nl = &wire.SandboxNetwork{Allow: n.Allow, MaxBytes: n.MaxBytes}
	}
	var nu *wire.NetworkUsage
	if n := sb.Network; n != nil {
		nu = &wire.NetworkUsage{BytesIn: n.BytesIn, BytesOut: n.BytesOut, Connections: n.Connections, Refused: n.Refused, Attempts: []wire.NetworkAttempt{}}
		for _, a := range n.Attempts {
			nu.Attempts = append(nu.Attempts, wire.NetworkAttempt(a))
		}
	}
	return wire.Sandbox{
		ID: sb.ID, Status: string(sb.Status), Reason: nilIfEmpty(sb.Reason), Message: nilIfEmpty(sb.Message),
		Image: sb.Image, ImageVersion: sb.ImageVersion,
		CreatedAt: sb.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt.UTC(), EndedAt: ended, OnTimeout: sb.OnTimeout,
		Limits: wire.SandboxLimits{MemoryMB: l.MemoryMB, CPUs: l.CPUs, Pids: l.Pids, HomeMB: l.HomeMB, TmpMB: l.TmpMB,
			OutputBytes: l.OutputBytes, MaxLifetimeS: l.MaxLifetimeS, MaxFileMB: l.MaxFileMB, FileSizeBytes: l.FileSizeBytes, Network: nl},
		Metadata: md, AliveSeconds: round3(sb.AliveSeconds), CPUSeconds: round3(sb.CPUSeconds), Network: nu, RequestID: requestID,
	}
}

func (s *Server) writeSandbox(w http.ResponseWriter, r *http.Request, status int, sb sandboxes.Sandbox, err error) error {
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, status, toWireSandbox(sb, infoFrom(r.Context()).id))
}

// createSandbox is POST /v1/sandboxes.
func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, c *Caller) error {
	idemKey, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	var in wire.SandboxRequest
	if err := s.decodeBody(w, r, s.maxBodyBytes(c.Plan), &in); err != nil {
		return err
	}
	req := sandboxes.CreateRequest{Env: in.Env, Metadata: in.Metadata}
	if in.Network != nil {
		req.Network = &sandboxes.NetworkRequest{Allow: in.Network.Allow}
	}
	if in.Image != nil {
		req.Image = *in.Image
	}
	if in.OnTimeout != nil {
		if *in.OnTimeout != "kill" && *in.OnTimeout != "pause" {
			return errorf(KindInvalidRequest, "on_timeout must be \"kill\" or \"pause\", not %q", clip(*in.OnTimeout, 40))
		}
		req.OnTimeout = *in.OnTimeout
	}
	if req.TimeoutS, err = seconds(in.TimeoutS); err != nil {
		return err
	}
	for i, f := range in.Files {
		content := []byte(f.Content)
		switch f.Encoding {
		case "", "utf8":
		case "base64":
			if content, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return errorf(KindInvalidRequest, "files[%d]: content is not valid base64", i)
			}
		default:
			return errorf(KindInvalidRequest, "files[%d]: encoding must be \"utf8\" or \"base64\"", i)
		}
		req.Files = append(req.Files, sandboxes.File{Path: f.Path, Content: content})
	}
	sb, err := s.sbx.Create(r.Context(), *c, idemKey, req)
	if err == nil {
		infoFrom(r.Context()).sandboxID = sb.ID
		w.Header().Set("Location", apiPrefix(r)+"/v1/sandboxes/"+sb.ID)
	}
	return s.writeSandbox(w, r, http.StatusCreated, sb, err)
}

// listSandboxes is GET /v1/sandboxes?status=&metadata.KEY=VALUE&limit=&cursor=.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, c *Caller) error {
	q, err := strictQuery(r)
	if err != nil {
		return err
	}
	req, err := listQuery(q)
	if err != nil {
		return err
	}
	page, err := s.sbx.List(r.Context(), *c, req)
	if err != nil {
		return err
	}
	id := infoFrom(r.Context()).id
	out := wire.SandboxList{Sandboxes: make([]wire.Sandbox, 0, len(page.Sandboxes)), NextCursor: nilIfEmpty(page.Next)}
	for _, sb := range page.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, toWireSandbox(sb, id))
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

// listQuery reads the query of GET /v1/sandboxes; every parameter once,
// none unknown.
func listQuery(q url.Values) (sandboxes.ListRequest, error) {
	var req sandboxes.ListRequest
	for _, name := range slices.Sorted(maps.Keys(q)) { // the first problem by name, every time
		vs := q[name]
		if len(vs) != 1 {
			return req, errorf(KindInvalidRequest, "query parameter %s is given more than once", clip(name, 40))
		}
		v := vs[0]
		key, isMeta := strings.CutPrefix(name, "metadata.")
		if k, ok := strings.CutPrefix(name, "metadata["); ok && strings.HasSuffix(k, "]") {
			key, isMeta = strings.TrimSuffix(k, "]"), true // deepObject, as OpenAPI generators send it
		}
		switch {
		case isMeta && key != "":
			if req.Metadata == nil {
				req.Metadata = map[string]string{}
			}
			req.Metadata[key] = v
		case name == "status":
			switch st := sandboxes.Status(v); st {
			case sandboxes.StatusRunning, sandboxes.StatusPaused, sandboxes.StatusEnded:
				req.Status = st
			default:
				return req, errorf(KindInvalidRequest, "status must be running, paused or ended, not %q", clip(v, 40))
			}
		case name == "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 100 {
				return req, errorf(KindInvalidRequest, "limit must be a whole number from 1 to 100")
			}
			req.Limit = n
		case name == "cursor":
			req.Cursor = v
		default:
			return req, errorf(KindInvalidRequest, "unknown query parameter %q; allowed: status, limit, cursor, metadata.KEY", clip(name, 40))
		}
	}
	return req, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	sb, err := s.sbx.Get(r.Context(), *c, id)
	return s.writeSandbox(w, r, http.StatusOK, sb, err)
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	sb, err := s.sbx.Kill(r.Context(), *c, id)
	return s.writeSandbox(w, r, http.StatusOK, sb, err)
}

// noBody reads the body of a route that takes none: nothing, or an empty
// JSON object as generated clients send; anything else is a 400 rather
// than a silently ignored option.
func (s *Server) noBody(w http.ResponseWriter, r *http.Request) error {
	body, release, err := s.readBody(w, r, smallBodyBytes)
	defer release()
	if err != nil || len(bytes.TrimSpace(body)) == 0 {
		return err
	}
	if err := checkJSONText(body); err != nil {
		return err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return errorf(KindInvalidRequest, "this route takes no body; send none or {}")
	}
	if len(obj) > 0 {
		return errorf(KindInvalidRequest, "unknown field %q; this route takes no body", clip(slices.Sorted(maps.Keys(obj))[0], 40))
	}
	return nil
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	if err := s.noBody(w, r); err != nil {
		return err
	}
	sb, err := s.sbx.Pause(r.Context(), *c, id)
	return s.writeSandbox(w, r, http.StatusOK, sb, err)
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	if err := s.noBody(w, r); err != nil {
		return err
	}
	sb, err := s.sbx.Resume(r.Context(), *c, id)
	return s.writeSandbox(w, r, http.StatusOK, sb, err)
}

func (s *Server) setSandboxTimeout(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in wire.SandboxTimeoutRequest
	if err := s.decodeBody(w, r, smallBodyBytes, &in); err != nil {
		return err
	}
	if in.TimeoutS == nil {
		return errorf(KindInvalidTimeout, "timeout_s is required")
	}
	n, err := seconds(in.TimeoutS)
	if err != nil {
		return err
	}
	sb, err := s.sbx.SetTimeout(r.Context(), *c, id, time.Duration(n)*time.Second)
	return s.writeSandbox(w, r, http.StatusOK, sb, err)
}

// runCommand is POST /v1/sandboxes/{id}/commands: a foreground command
// answers its result (200), as JSON or, with Accept: text/event-stream,
// as a stream of its output and then the result; a background one
// answers at once with the started command (201).
func (s *Server) runCommand(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in wire.CommandRequest
	if err := s.decodeBody(w, r, s.maxBodyBytes(c.Plan), &in); err != nil {
		return err
	}
	req := sandboxes.CommandRequest{Argv: in.Argv, Env: in.Env, Background: in.Background != nil && *in.Background}
	if in.Cmd != nil {
		req.Cmd = *in.Cmd
	}
	if (req.Cmd == "") == (len(req.Argv) == 0) {
		return errorf(KindInvalidRequest, "give exactly one of cmd (a shell line) and argv")
	}
	if in.Cwd != nil {
		req.Cwd = *in.Cwd
	}
	if in.Stdin != nil {
		req.Stdin = *in.Stdin
	}
	var err error
	if req.TimeoutS, err = seconds(in.TimeoutS); err != nil {
		return err
	}
	ctx := r.Context()
	if req.Background {
		cmd, err := s.sbx.StartCommand(ctx, *c, id, req)
		if err != nil {
			return err
		}
		w.Header().Set("Location", apiPrefix(r)+"/v1/sandboxes/"+id+"/commands/"+strconv.Itoa(cmd.PID)+"/events")
		return s.writeJSON(w, r, http.StatusCreated, toWireCommand(cmd))
	}
	if wantsEventStream(r) {
		return s.streamEvents(w, r, func(ctx context.Context, emit func(streamEvent) error) error {
			res, err := s.sbx.Run(ctx, *c, id, req, func(ev sandboxes.Event) {
				if ev.Type == "stdout" || ev.Type == "stderr" {
					_ = emit(toSSE(ev))
				}
			})
			if err != nil {
				return err
			}
			return emit(streamEvent{id: "end", kind: "result", data: toWireResult(res, infoFrom(ctx).id)})
		})
	}
	res, err := s.sbx.Run(ctx, *c, id, req, nil)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toWireResult(res, infoFrom(ctx).id))
}

func toWireResult(res sandboxes.CommandResult, requestID string) wire.CommandResult {
	return wire.CommandResult{PID: res.PID, Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: res.ExitCode,
		DurationMS: res.DurationMS, Truncated: res.Truncated, Usage: wire.CommandUsage{CPUSeconds: round3(res.CPUSeconds)}, RequestID: requestID}
}

func toWireCommand(cmd sandboxes.Command) wire.Command {
	var ended *time.Time
	if cmd.EndedAt != nil {
		t := cmd.EndedAt.UTC()
		ended = &t
	}
	argv := cmd.Argv
	if argv == nil {
		argv = []string{}
	}
	return wire.Command{PID: cmd.PID, Cmd: nilIfEmpty(cmd.Cmd), Argv: argv, Running: cmd.Running, ExitCode: cmd.ExitCode,
		StartedAt: cmd.StartedAt.UTC(), EndedAt: ended}
}

// toSSE is a command's event on the wire: its id is its sequence number,
// stdout and stderr carry {text} as an execution's output does, exit
// carries {exit_code}.
func toSSE(ev sandboxes.Event) streamEvent {
	out := streamEvent{id: strconv.FormatInt(ev.Seq, 10), kind: ev.Type}
	if ev.Type == "exit" {
		out.data = wire.ExitEvent{ExitCode: ev.ExitCode}
	} else {
		out.data = wire.OutputEvent{Text: ev.Data}
	}
	return out
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	cmds, err := s.sbx.Commands(r.Context(), *c, id)
	if err != nil {
		return err
	}
	out := wire.CommandList{Commands: make([]wire.Command, 0, len(cmds))}
	for _, cmd := range cmds {
		out.Commands = append(out.Commands, toWireCommand(cmd))
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

func (s *Server) ack(w http.ResponseWriter, r *http.Request) error {
	return s.writeJSON(w, r, http.StatusOK, wire.Ack{OK: true, RequestID: infoFrom(r.Context()).id})
}

// commandStdin is POST .../commands/{pid}/stdin with {data, eof}: JSON,
// so that one body can write and close, and text stays text.
func (s *Server) commandStdin(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	pid, err := pathPID(r)
	if err != nil {
		return err
	}
	var in wire.StdinRequest
	if err := s.decodeBody(w, r, int64(6*s.exec.MaxStdinBytes())+smallBodyBytes, &in); err != nil {
		return err
	}
	if in.Data == nil && in.EOF == nil {
		return errorf(KindInvalidRequest, "give data, eof or both")
	}
	var data []byte
	if in.Data != nil {
		data = []byte(*in.Data)
	}
	if err := s.sbx.SendStdin(r.Context(), *c, id, pid, data, in.EOF != nil && *in.EOF); err != nil {
		return err
	}
	return s.ack(w, r)
}

func (s *Server) signalCommand(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	pid, err := pathPID(r)
	if err != nil {
		return err
	}
	var in wire.SignalRequest
	if err := s.decodeBody(w, r, smallBodyBytes, &in); err != nil {
		return err
	}
	if in.Signal == nil || *in.Signal == "" {
		return errorf(KindInvalidRequest, "signal is required, e.g. \"TERM\"")
	}
	if err := s.sbx.Signal(r.Context(), *c, id, pid, strings.TrimPrefix(strings.ToUpper(*in.Signal), "SIG")); err != nil {
		return err
	}
	return s.ack(w, r)
}

// commandEvents is GET .../commands/{pid}/events: the command's events
// after Last-Event-ID (a sequence number; anything else is from the
// start), then live until its exit event.
func (s *Server) commandEvents(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	pid, err := pathPID(r)
	if err != nil {
		return err
	}
	after, err := strconv.ParseInt(r.Header.Get("Last-Event-ID"), 10, 64)
	if err != nil || after < 0 {
		after = 0
	}
	return s.streamEvents(w, r, func(ctx context.Context, emit func(streamEvent) error) error {
		return s.sbx.Events(ctx, *c, id, pid, after, func(ev sandboxes.Event) error { return emit(toSSE(ev)) })
	})
}

// strictQuery is r's query, or a 400 when any part of it is malformed:
// url.Values silently drops a pair it cannot decode, which would turn a
// filter into none, or ?path=a%zz&path=b into path b.
func strictQuery(r *http.Request) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, errorf(KindInvalidRequest, "the query string is malformed (a bad %%-escape, or a ';'): %s", clip(err.Error(), 80))
	}
	return q, nil
}

// filePath is the ?path= of a files route.
func filePath(r *http.Request, name string) (string, error) {
	q, err := strictQuery(r)
	if err != nil {
		return "", err
	}
	vs := q[name]
	if len(vs) != 1 || vs[0] == "" {
		return "", errorf(KindInvalidRequest, "give the query parameter %s once, e.g. ?%s=/home/user/data.csv", name, name)
	}
	return vs[0], nil
}

func toWireEntry(fi sandboxes.FileInfo) wire.FileEntry {
	return wire.FileEntry{Name: fi.Name, Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fi.Mode, ModTime: fi.ModTime.UTC()}
}

// readFile is GET .../files?path=: a directory answers its listing as
// JSON, anything else its bytes as application/octet-stream.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	p, err := filePath(r, "path")
	if err != nil {
		return err
	}
	ctx := r.Context()
	fi, err := s.sbx.Stat(ctx, *c, id, p)
	if err != nil {
		return err
	}
	if fi.Type == "dir" {
		list, err := s.sbx.ListDir(ctx, *c, id, p)
		if err != nil {
			return err
		}
		out := wire.FileList{Path: fi.Path, Entries: make([]wire.FileEntry, 0, len(list))}
		for _, e := range list {
			out.Entries = append(out.Entries, toWireEntry(e))
		}
		return s.writeJSON(w, r, http.StatusOK, out)
	}
	return s.sendFile(w, r, c, id, fi)
}

// sendFile answers the bytes of the file fi of sandbox id.
func (s *Server) sendFile(w http.ResponseWriter, r *http.Request, c *Caller, id string, fi sandboxes.FileInfo) error {
	ctx := r.Context()
	fw := &fileWriter{w: w, name: path.Base(fi.Path)}
	if _, err := s.sbx.ReadFile(ctx, *c, id, fi.Path, fw); err != nil {
		if !fw.started {
			return err // before the first byte: in the error shape
		}
		// After it the status is sent: the connection is cut without the
		// body's end, so the client sees a broken download, never a
		// whole-looking one (a file that grew past the cap, or a stream
		// the code forged in its agent's place, docs/SANDBOXES.md).
		_ = http.NewResponseController(w).Flush() // what was sent, then the cut
		info := infoFrom(ctx)
		info.err, info.abort = fmt.Errorf("download cut short: %w", err), true
		return nil
	}
	fw.start()
	return nil
}

// fileWriter sends a download's headers with its first byte, so that a
// read that fails before any is still an ordinary error answer.
type fileWriter struct {
	w       http.ResponseWriter
	name    string
	started bool
}

func (f *fileWriter) start() {
	if f.started {
		return
	}
	f.started = true
	h := f.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": f.name}))
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	f.w.WriteHeader(http.StatusOK)
}

func (f *fileWriter) Write(b []byte) (int, error) {
	f.start()
	return f.w.Write(b)
}

// writeFile is PUT .../files?path= with the raw bytes as the body; the
// parents are made. The body is streamed to the sandbox, never held, and
// capped at the sandbox's max_file_mb (the plan's files cap when the
// sandbox gives none).
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	p, err := filePath(r, "path")
	if err != nil {
		return err
	}
	ctx := r.Context()
	limit, err := s.fileLimit(ctx, c, id)
	if err != nil {
		return err
	}
	if r.ContentLength > limit {
		return errorf(KindPayloadTooLarge, "the file is over %d bytes, this sandbox's max_file_mb", limit)
	}
	fi, err := s.sbx.WriteFile(ctx, *c, id, p, http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return errorf(KindPayloadTooLarge, "the file is over %d bytes, this sandbox's max_file_mb", limit)
	}
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toWireEntry(fi))
}

// fileLimit is the most one upload to sandbox id may hold: its
// max_file_mb, or the plan's files cap when it gives none.
func (s *Server) fileLimit(ctx context.Context, c *Caller, id string) (int64, error) {
	sb, err := s.sbx.Get(ctx, *c, id)
	if err != nil {
		return 0, err
	}
	if limit := sb.Limits.MaxFileMB << 20; limit > 0 {
		return limit, nil
	}
	return c.Plan.FilesBytes(), nil
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	p, err := filePath(r, "path")
	if err != nil {
		return err
	}
	if err := s.sbx.Remove(r.Context(), *c, id, p); err != nil {
		return err
	}
	return s.ack(w, r)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in wire.PathRequest
	if err := s.decodeBody(w, r, smallBodyBytes, &in); err != nil {
		return err
	}
	if in.Path == nil || *in.Path == "" {
		return errorf(KindInvalidRequest, "path is required")
	}
	fi, err := s.sbx.Mkdir(r.Context(), *c, id, *in.Path)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusCreated, toWireEntry(fi))
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in wire.MoveRequest
	if err := s.decodeBody(w, r, smallBodyBytes, &in); err != nil {
		return err
	}
	if in.From == nil || *in.From == "" || in.To == nil || *in.To == "" {
		return errorf(KindInvalidRequest, "from and to are both required")
	}
	fi, err := s.sbx.Move(r.Context(), *c, id, *in.From, *in.To)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toWireEntry(fi))
}

// sandboxUsage is the sandboxes part of GET /v1/usage; nil when the
// server has no sandboxes.
func (s *Server) sandboxUsage(ctx context.Context, c *Caller) (*wire.SandboxUsage, error) {
	if s.sbx == nil {
		return nil, nil
	}
	u, err := s.sbx.Usage(ctx, *c)
	if err != nil {
		return nil, err
	}
	return &wire.SandboxUsage{SandboxSeconds: round3(u.SandboxSeconds), CPUSeconds: round3(u.SandboxCPUSeconds),
		NetworkBytesIn: u.NetworkBytesIn, NetworkBytesOut: u.NetworkBytesOut, Running: u.Running, Paused: u.Paused}, nil
}

// streamEvent is one server-sent event: id, event name and the JSON data.
type streamEvent struct {
	id, kind string
	data     any
}

// streamEvents answers with the events fn emits, as server-sent events.
// The stream starts with the first event (or the first heartbeat, or fn's
// end), so a refusal before anything happened is an ordinary error answer;
// a failure after the start is an error event, as in an execution's stream.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, emit func(streamEvent) error) error) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	events := make(chan streamEvent)
	done := make(chan error, 1)
	go func() {
		done <- fn(ctx, func(ev streamEvent) error {
			select {
			case events <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	var st *eventStream
	start := func() {
		if st == nil {
			st = s.startStream(w, r)
		}
	}
	t := time.NewTicker(s.heartbeat)
	defer t.Stop()
	fail := func(err error) error {
		cancel()
		<-done
		return err
	}
	for {
		select {
		case ev := <-events:
			start()
			if err := st.send(ev.id, ev.kind, ev.data); err != nil {
				return fail(err)
			}
			t.Reset(s.heartbeat)
		case <-t.C:
			start()
			if err := st.write([]byte(": heartbeat\n\n")); err != nil {
				return fail(err)
			}
		case err := <-done:
			if (err != nil && st == nil) || errors.Is(err, context.Canceled) {
				return err
			}
			start()
			if err != nil {
				return st.send("end", "error", st.errorData(asError(err)))
			}
			return nil
		}
	}
}
