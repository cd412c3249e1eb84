// Package sandboxfake is an in-memory stand-in for the sandboxes service
// at the API's seam (api.Sandboxes), for the handlers' and the clients'
// unit tests. It keeps tenants apart, statuses, commands and files as the
// real service promises, and scripts commands by their text:
//
//	"echo WORDS"  succeeds, stdout "WORDS\n" (as two events: "WORDS", "\n")
//	"exit N"      fails with exit code N, stderr "boom\n"
//	"crash"       the platform fails (an internal error)
//	"partial"     writes "half\n" to stdout, then the platform fails
//	"cat"         (background) echoes its stdin as stdout until EOF, then exits 0
//	"exit N"      (background, also as the script of "sh -c SCRIPT") writes
//	              "boom\n" to stderr and exits N at once
//	anything else succeeds with stdout "ran: " + the command + "\n"
//
// Paths are resolved against /home/user; the fake's filesystem holds only
// what was written under /home/user and /tmp.
package sandboxfake

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// Start is the fake's clock: every sandbox is created at it.
var Start = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

// MaxRunning is how many running sandboxes a tenant may have.
const MaxRunning = 3

// Fake is the fake service. The zero value is not usable; call New.
type Fake struct {
	mu        sync.Mutex
	n         int
	contextN  int             // code contexts made
	sandboxes map[string]*box // by id
	idem      map[string]idem
	// Last is what the last call was given, for tests to check.
	LastCreate  sandboxes.CreateRequest
	LastIdemKey string
	LastList    sandboxes.ListRequest
	LastCommand sandboxes.CommandRequest
	// CutReadAfter, when set, makes ReadFile fail after that many bytes,
	// as a read that breaks mid-stream does.
	CutReadAfter int
	// Owners maps sandbox ids to the address Owner answers for them, as
	// if another node held them.
	Owners map[string]string
	// Busy makes Create refuse as a full share of the node's slots does.
	Busy bool
}

type idem struct {
	id  string
	req sandboxes.CreateRequest
}

type box struct {
	tenant string
	sb     sandboxes.Sandbox
	cmds   []*command
	files  map[string][]byte
	dirs   map[string]bool
	// code contexts by id
	contexts map[string]*fakeContext
}

type command struct {
	c       sandboxes.Command
	events  []sandboxes.Event
	changed chan struct{} // closed and replaced at each event
}

// New returns an empty fake.
func New() *Fake {
	return &Fake{sandboxes: map[string]*box{}, idem: map[string]idem{}}
}

func notFound(what string) error { return execution.Errorf(execution.KindNotFound, "no such %s", what) }

func (f *Fake) box(c execution.Caller, id string) (*box, error) {
	b, ok := f.sandboxes[id]
	if !ok || b.tenant != c.Key.Tenant {
		return nil, notFound("sandbox " + id)
	}
	return b, nil
}

// running is box for a call that needs a running sandbox: a paused one is
// resumed, an ended one refused.
func (f *Fake) running(c execution.Caller, id string) (*box, error) {
	b, err := f.box(c, id)
	if err != nil {
		return nil, err
	}
	switch b.sb.Status {
	case sandboxes.StatusEnded:
		return nil, execution.Errorf(execution.KindSandboxNotRunning, "sandbox %s has ended (%s)", id, b.sb.Reason)
	case sandboxes.StatusPaused:
		b.sb.Status = sandboxes.StatusRunning
	}
	return b, nil
}

func (f *Fake) Create(ctx context.Context, c execution.Caller, idemKey string, r sandboxes.CreateRequest) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.LastCreate, f.LastIdemKey = r, idemKey
	if f.Busy {
		return sandboxes.Sandbox{}, execution.Busy()
	}
	if idemKey != "" {
		if prev, ok := f.idem[c.Key.Tenant+"/"+idemKey]; ok {
			if !reflect.DeepEqual(prev.req, r) {
				return sandboxes.Sandbox{}, execution.Errorf(execution.KindIdempotencyConflict, "this Idempotency-Key was used with another request")
			}
			return f.sandboxes[prev.id].sb, nil
		}
	}
	if r.Image != "" && r.Image != "default" {
		return sandboxes.Sandbox{}, execution.Errorf(execution.KindInvalidRequest, "unknown image %q", r.Image)
	}
	if r.TimeoutS > 3600 {
		return sandboxes.Sandbox{}, execution.Errorf(execution.KindInvalidTimeout, "timeout_s is over the plan's lifetime of 3600 s")
	}
	if err := f.limit(c); err != nil {
		return sandboxes.Sandbox{}, err
	}
	f.n++
	timeout := time.Duration(max(r.TimeoutS, 300)) * time.Second
	md := r.Metadata
	if md == nil {
		md = map[string]string{}
	}
	sb := sandboxes.Sandbox{
		ID: fmt.Sprintf("sbx_%032x", f.n), Status: sandboxes.StatusRunning, Image: "default", ImageVersion: "20261201T080500Z-1",
		CreatedAt: Start.Add(time.Duration(f.n) * time.Second), OnTimeout: "kill", Metadata: md,
		Limits: sandboxes.Limits{MemoryMB: 512, CPUs: 1, Pids: 256, HomeMB: 256, TmpMB: 64, OutputBytes: 65536,
			MaxLifetimeS: 3600, MaxFileMB: 1, FileSizeBytes: 256 << 20},
	}
	sb.ExpiresAt = sb.CreatedAt.Add(timeout)
	if r.OnTimeout != "" {
		sb.OnTimeout = r.OnTimeout
	}
	sb.AccessToken, sb.KeyID, sb.LiveSince = r.AccessToken, c.Key.ID, sb.CreatedAt
	b := &box{tenant: c.Key.Tenant, sb: sb, files: map[string][]byte{}, dirs: map[string]bool{"/home/user": true, "/tmp": true}}
	for _, file := range r.Files {
		p := resolve(file.Path)
		b.files[p] = file.Content
		b.mkdirAll(path.Dir(p))
	}
	f.sandboxes[sb.ID] = b
	if idemKey != "" {
		f.idem[c.Key.Tenant+"/"+idemKey] = idem{sb.ID, r}
	}
	return sb, nil
}

// limit refuses another running sandbox past MaxRunning; f.mu is held.
func (f *Fake) limit(c execution.Caller) error {
	n := 0
	for _, b := range f.sandboxes {
		if b.tenant == c.Key.Tenant && b.sb.Status == sandboxes.StatusRunning {
			n++
		}
	}
	if n >= MaxRunning {
		return execution.Errorf(execution.KindSandboxLimit, "%d sandboxes are running, the plan's limit", n)
	}
	return nil
}

func (f *Fake) Get(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c, id)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	return b.sb, nil
}

func (f *Fake) List(ctx context.Context, c execution.Caller, r sandboxes.ListRequest) (sandboxes.Page, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.LastList = r
	var all []sandboxes.Sandbox
	for _, b := range f.sandboxes {
		if b.tenant != c.Key.Tenant || (r.Status != "" && b.sb.Status != r.Status) {
			continue
		}
		match := true
		for k, v := range r.Metadata {
			match = match && b.sb.Metadata[k] == v
		}
		if match {
			all = append(all, b.sb)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].CreatedAt.After(all[j].CreatedAt) })
	start := 0
	if r.Cursor != "" {
		n, err := strconv.Atoi(r.Cursor)
		if err != nil || n < 0 || n > len(all) {
			return sandboxes.Page{}, execution.Errorf(execution.KindInvalidRequest, "cursor is not one this server gave")
		}
		start = n
	}
	limit := r.Limit
	if limit == 0 {
		limit = 50
	}
	end := min(start+limit, len(all))
	p := sandboxes.Page{Sandboxes: all[start:end]}
	if end < len(all) {
		p.Next = strconv.Itoa(end)
	}
	return p, nil
}

func (f *Fake) Kill(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c, id)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	if b.sb.Status != sandboxes.StatusEnded {
		t := b.sb.CreatedAt.Add(time.Minute)
		b.sb.Status, b.sb.Reason, b.sb.EndedAt = sandboxes.StatusEnded, sandboxes.ReasonKilled, &t
		b.sb.AliveSeconds = 60
		for _, cmd := range b.cmds {
			cmd.exit(137, t)
		}
	}
	return b.sb, nil
}

func (f *Fake) SetTimeout(ctx context.Context, c execution.Caller, id string, timeout time.Duration) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c, id)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	if b.sb.Status == sandboxes.StatusEnded {
		return sandboxes.Sandbox{}, execution.Errorf(execution.KindSandboxNotRunning, "sandbox %s has ended", id)
	}
	if timeout > time.Duration(b.sb.Limits.MaxLifetimeS)*time.Second {
		return sandboxes.Sandbox{}, execution.Errorf(execution.KindInvalidTimeout, "timeout_s is over the plan's lifetime of %d s", b.sb.Limits.MaxLifetimeS)
	}
	b.sb.ExpiresAt = b.sb.CreatedAt.Add(timeout)
	return b.sb, nil
}

func (f *Fake) Pause(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	return f.setStatus(c, id, sandboxes.StatusPaused)
}

func (f *Fake) Resume(ctx context.Context, c execution.Caller, id string) (sandboxes.Sandbox, error) {
	return f.setStatus(c, id, sandboxes.StatusRunning)
}

func (f *Fake) setStatus(c execution.Caller, id string, st sandboxes.Status) (sandboxes.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c, id)
	if err != nil {
		return sandboxes.Sandbox{}, err
	}
	if b.sb.Status == sandboxes.StatusEnded {
		return sandboxes.Sandbox{}, execution.Errorf(execution.KindSandboxNotRunning, "sandbox %s has ended", id)
	}
	if st == sandboxes.StatusRunning && b.sb.Status == sandboxes.StatusPaused {
		if err := f.limit(c); err != nil {
			return sandboxes.Sandbox{}, err
		}
	}
	b.sb.Status = st
	if st == sandboxes.StatusPaused {
		for _, cmd := range b.cmds {
			cmd.exit(137, b.sb.CreatedAt)
		}
	}
	return b.sb, nil
}

func line(r sandboxes.CommandRequest) string {
	if r.Cmd != "" {
		return r.Cmd
	}
	return strings.Join(r.Argv, " ")
}

func (f *Fake) Run(ctx context.Context, c execution.Caller, id string, r sandboxes.CommandRequest, onEvent func(sandboxes.Event)) (sandboxes.CommandResult, error) {
	f.mu.Lock()
	f.LastCommand = r
	b, err := f.running(c, id)
	if err != nil {
		f.mu.Unlock()
		return sandboxes.CommandResult{}, err
	}
	pid := f.newPID(b)
	f.mu.Unlock()
	res := sandboxes.CommandResult{PID: pid, Status: "succeeded", DurationMS: 12, CPUSeconds: 0.004}
	var events []sandboxes.Event
	switch l := line(r); {
	case l == "crash":
		return sandboxes.CommandResult{}, execution.Internal(fmt.Errorf("agent of %s lost", id))
	case l == "partial":
		if onEvent != nil {
			onEvent(sandboxes.Event{Seq: 1, Type: "stdout", Data: "half\n"})
		}
		return sandboxes.CommandResult{}, execution.Internal(fmt.Errorf("agent of %s lost", id))
	case strings.HasPrefix(l, "echo "):
		words := strings.TrimPrefix(l, "echo ")
		res.Stdout = words + "\n"
		events = []sandboxes.Event{{Seq: 1, Type: "stdout", Data: words}, {Seq: 2, Type: "stdout", Data: "\n"}}
	case strings.HasPrefix(l, "exit "):
		res.Status, res.Stderr = "failed", "boom\n"
		res.ExitCode, _ = strconv.Atoi(strings.TrimPrefix(l, "exit "))
		events = []sandboxes.Event{{Seq: 1, Type: "stderr", Data: "boom\n"}}
	default:
		res.Stdout = "ran: " + l + "\n"
		events = []sandboxes.Event{{Seq: 1, Type: "stdout", Data: res.Stdout}}
	}
	events = append(events, sandboxes.Event{Seq: int64(len(events) + 1), Type: "exit", ExitCode: res.ExitCode})
	if onEvent != nil {
		for _, ev := range events {
			onEvent(ev)
		}
	}
	return res, nil
}

func (f *Fake) newPID(b *box) int {
	return 100 + len(b.cmds)*7 + 1
}

func (f *Fake) StartCommand(ctx context.Context, c execution.Caller, id string, r sandboxes.CommandRequest) (sandboxes.Command, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.LastCommand = r
	b, err := f.running(c, id)
	if err != nil {
		return sandboxes.Command{}, err
	}
	cmd := &command{c: sandboxes.Command{PID: f.newPID(b), Cmd: r.Cmd, Argv: r.Argv, Running: true, StartedAt: b.sb.CreatedAt.Add(time.Second)},
		changed: make(chan struct{})}
	b.cmds = append(b.cmds, cmd)
	n, isExit := strings.CutPrefix(script(r), "exit ")
	code, err := strconv.Atoi(n)
	switch l := line(r); {
	case isExit && err == nil:
		cmd.add(sandboxes.Event{Type: "stderr", Data: "boom\n"})
		cmd.exit(code, b.sb.CreatedAt.Add(2*time.Second))
	case l != "cat":
		cmd.add(sandboxes.Event{Type: "stdout", Data: "started " + l + "\n"})
	}
	return cmd.c, nil
}

// script is what a command runs: the SCRIPT of "SHELL [-l] -c SCRIPT", as
// E2B's SDK sends every command, else its whole line.
func script(r sandboxes.CommandRequest) string {
	if n := len(r.Argv); n >= 3 && r.Argv[n-2] == "-c" {
		return r.Argv[n-1]
	}
	return line(r)
}

// add appends an event and wakes its followers; f.mu is held.
func (cmd *command) add(ev sandboxes.Event) {
	ev.Seq = int64(len(cmd.events) + 1)
	cmd.events = append(cmd.events, ev)
	close(cmd.changed)
	cmd.changed = make(chan struct{})
}

func (cmd *command) exit(code int, at time.Time) {
	if !cmd.c.Running {
		return
	}
	cmd.c.Running, cmd.c.ExitCode, cmd.c.EndedAt = false, &code, &at
	cmd.add(sandboxes.Event{Type: "exit", ExitCode: code})
}

func (f *Fake) Commands(ctx context.Context, c execution.Caller, id string) ([]sandboxes.Command, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.box(c, id)
	if err != nil {
		return nil, err
	}
	var out []sandboxes.Command
	for _, cmd := range b.cmds {
		out = append(out, cmd.c)
	}
	return out, nil
}

func (f *Fake) command(c execution.Caller, id string, pid int) (*box, *command, error) {
	b, err := f.box(c, id)
	if err != nil {
		return nil, nil, err
	}
	for _, cmd := range b.cmds {
		if cmd.c.PID == pid {
			return b, cmd, nil
		}
	}
	return nil, nil, notFound("command " + strconv.Itoa(pid))
}

func (f *Fake) SendStdin(ctx context.Context, c execution.Caller, id string, pid int, data []byte, eof bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, cmd, err := f.command(c, id, pid)
	if err != nil {
		return err
	}
	if !cmd.c.Running {
		return execution.Errorf(execution.KindProcessFinished, "command %d has finished", pid)
	}
	if len(data) > 0 {
		cmd.add(sandboxes.Event{Type: "stdout", Data: string(data)})
	}
	if eof {
		cmd.exit(0, b.sb.CreatedAt.Add(2*time.Second))
	}
	return nil
}

var signals = map[string]int{"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1, "QUIT": 3, "USR1": 10, "USR2": 12, "STOP": 19, "CONT": 18}

func (f *Fake) Signal(ctx context.Context, c execution.Caller, id string, pid int, signal string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, cmd, err := f.command(c, id, pid)
	if err != nil {
		return err
	}
	n, ok := signals[signal]
	if !ok {
		return execution.Errorf(execution.KindInvalidRequest, "unknown signal %q", signal)
	}
	if !cmd.c.Running {
		return execution.Errorf(execution.KindProcessFinished, "command %d has finished", pid)
	}
	if signal != "STOP" && signal != "CONT" {
		cmd.exit(128+n, b.sb.CreatedAt.Add(2*time.Second))
	}
	return nil
}

func (f *Fake) Events(ctx context.Context, c execution.Caller, id string, pid int, after int64, fn func(sandboxes.Event) error) error {
	f.mu.Lock()
	_, cmd, err := f.command(c, id, pid)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	next := after
	for {
		f.mu.Lock()
		pending := append([]sandboxes.Event(nil), cmd.events[min(int(next), len(cmd.events)):]...)
		changed := cmd.changed
		f.mu.Unlock()
		for _, ev := range pending {
			if err := fn(ev); err != nil {
				return err
			}
			next = ev.Seq
			if ev.Type == "exit" {
				return nil
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// resolve makes p absolute under /home/user.
func resolve(p string) string {
	if !path.IsAbs(p) {
		p = path.Join("/home/user", p)
	}
	return path.Clean(p)
}

func writable(p string) bool {
	return strings.HasPrefix(p+"/", "/home/user/") || strings.HasPrefix(p+"/", "/tmp/")
}

func (b *box) mkdirAll(p string) {
	for ; p != "/" && p != "."; p = path.Dir(p) {
		b.dirs[p] = true
	}
}

func (b *box) info(p string) (sandboxes.FileInfo, bool) {
	fi := sandboxes.FileInfo{Name: path.Base(p), Path: p, ModTime: b.sb.CreatedAt}
	if content, ok := b.files[p]; ok {
		fi.Type, fi.Size, fi.Mode = "file", int64(len(content)), "0644"
		return fi, true
	}
	if b.dirs[p] {
		fi.Type, fi.Size, fi.Mode = "dir", 4096, "0755"
		return fi, true
	}
	return sandboxes.FileInfo{}, false
}

func (f *Fake) Stat(ctx context.Context, c execution.Caller, id, p string) (sandboxes.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	fi, ok := b.info(resolve(p))
	if !ok {
		return sandboxes.FileInfo{}, notFound("file " + p)
	}
	return fi, nil
}

// WalkLive walks p as ListDir lists it, depth levels down, without
// resuming a paused sandbox.
func (f *Fake) WalkLive(ctx context.Context, c execution.Caller, id, p string, depth, max int, fn func(sandboxes.FileInfo)) error {
	f.mu.Lock()
	b, err := f.box(c, id)
	if err == nil && b.sb.Status != sandboxes.StatusRunning {
		err = execution.Errorf(execution.KindSandboxNotRunning, "sandbox %s is %s", id, b.sb.Status)
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	n := 0
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		list, err := f.ListDir(ctx, c, id, dir)
		if err != nil {
			return err
		}
		for _, e := range list {
			if n++; n > max {
				return execution.Errorf(execution.KindPayloadTooLarge, "more than %d entries", max)
			}
			fn(e)
			if e.Type == "dir" && level < depth {
				if err := walk(e.Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(p, 1)
}

func (f *Fake) ListDir(ctx context.Context, c execution.Caller, id, p string) ([]sandboxes.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return nil, err
	}
	dir := resolve(p)
	if !b.dirs[dir] {
		return nil, notFound("directory " + p)
	}
	var out []sandboxes.FileInfo
	seen := map[string]bool{}
	for _, m := range []map[string]bool{b.dirs, keys(b.files)} {
		for q := range m {
			if path.Dir(q) == dir && q != dir && !seen[q] {
				seen[q] = true
				fi, _ := b.info(q)
				out = append(out, fi)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func keys(m map[string][]byte) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

func (f *Fake) ReadFile(ctx context.Context, c execution.Caller, id, p string, w io.Writer) (int64, error) {
	f.mu.Lock()
	b, err := f.running(c, id)
	var content []byte
	ok := false
	if err == nil {
		content, ok = b.files[resolve(p)]
	}
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, notFound("file " + p)
	}
	if int64(len(content)) > b.sb.Limits.MaxFileMB<<20 {
		return 0, execution.Errorf(execution.KindPayloadTooLarge, "the file is over max_file_mb")
	}
	if f.CutReadAfter > 0 && f.CutReadAfter < len(content) {
		n, _ := w.Write(content[:f.CutReadAfter])
		return int64(n), execution.Errorf(execution.KindPayloadTooLarge, "the stream went past max_file_mb")
	}
	return io.Copy(w, bytes.NewReader(content))
}

func (f *Fake) WriteFile(ctx context.Context, c execution.Caller, id, p string, r io.Reader) (sandboxes.FileInfo, error) {
	content, err := io.ReadAll(r)
	if err != nil {
		return sandboxes.FileInfo{}, fmt.Errorf("reading the upload: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	q := resolve(p)
	if !writable(q) || b.dirs[q] {
		return sandboxes.FileInfo{}, execution.Errorf(execution.KindInvalidRequest, "%s cannot be written: permission denied", p)
	}
	b.files[q] = content
	b.mkdirAll(path.Dir(q))
	fi, _ := b.info(q)
	return fi, nil
}

func (f *Fake) Remove(ctx context.Context, c execution.Caller, id, p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return err
	}
	q := resolve(p)
	if _, ok := b.info(q); !ok {
		return notFound("file " + p)
	}
	if !writable(q) || q == "/home/user" || q == "/tmp" {
		return execution.Errorf(execution.KindInvalidRequest, "%s cannot be removed: permission denied", p)
	}
	for k := range b.files {
		if k == q || strings.HasPrefix(k, q+"/") {
			delete(b.files, k)
		}
	}
	for k := range b.dirs {
		if k == q || strings.HasPrefix(k, q+"/") {
			delete(b.dirs, k)
		}
	}
	return nil
}

func (f *Fake) Mkdir(ctx context.Context, c execution.Caller, id, p string) (sandboxes.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	q := resolve(p)
	if !writable(q) {
		return sandboxes.FileInfo{}, execution.Errorf(execution.KindInvalidRequest, "%s cannot be made: permission denied", p)
	}
	b.mkdirAll(q)
	fi, _ := b.info(q)
	return fi, nil
}

func (f *Fake) Move(ctx context.Context, c execution.Caller, id, from, to string) (sandboxes.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return sandboxes.FileInfo{}, err
	}
	src, dst := resolve(from), resolve(to)
	content, ok := b.files[src]
	if !ok {
		return sandboxes.FileInfo{}, notFound("file " + from)
	}
	if !writable(src) || !writable(dst) {
		return sandboxes.FileInfo{}, execution.Errorf(execution.KindInvalidRequest, "cannot move %s to %s: permission denied", from, to)
	}
	delete(b.files, src)
	b.files[dst] = content
	b.mkdirAll(path.Dir(dst))
	fi, _ := b.info(dst)
	return fi, nil
}

// ByAccessToken finds the sandbox whose E2B access token is token.
func (f *Fake) ByAccessToken(ctx context.Context, id, token string) (tenant, keyID string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.sandboxes[id]
	if !ok || token == "" || b.sb.AccessToken != token {
		return "", "", execution.Errorf(execution.KindUnauthorized, "missing or wrong access token for this sandbox")
	}
	return b.tenant, b.sb.KeyID, nil
}

func (f *Fake) Owner(ctx context.Context, c execution.Caller, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Owners[id], nil
}

func (f *Fake) Usage(ctx context.Context, c execution.Caller) (sandboxes.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var u sandboxes.Usage
	for _, b := range f.sandboxes {
		if b.tenant != c.Key.Tenant {
			continue
		}
		u.SandboxSeconds += b.sb.AliveSeconds
		switch b.sb.Status {
		case sandboxes.StatusRunning:
			u.Running++
		case sandboxes.StatusPaused:
			u.Paused++
		}
	}
	return u, nil
}

// Code contexts. A cell is scripted by its text, with state per context:
//
//	"NAME = VALUE"  stores VALUE; no result
//	"print(TEXT)"   stdout "TEXT\n"
//	"raise NAME"    fails with error NAME, value "boom"
//	"crash"         the platform fails
//	anything else   the stored value of that name, or the text, as text/plain
type fakeContext struct {
	info  sandboxes.CodeContext
	vars  map[string]string
	count int
}

func (f *Fake) contextsOf(b *box) map[string]*fakeContext {
	if b.contexts == nil {
		b.contexts = map[string]*fakeContext{}
	}
	return b.contexts
}

func (f *Fake) newContext(b *box, lang string, dflt bool) *fakeContext {
	f.contextN++
	cc := &fakeContext{vars: map[string]string{}, info: sandboxes.CodeContext{ID: fmt.Sprintf("ctx_%032x", f.contextN), Language: lang,
		Cwd: "/home/user", Default: dflt, CreatedAt: Start.Add(time.Duration(f.contextN) * time.Second)}}
	f.contextsOf(b)[cc.info.ID] = cc
	return cc
}

func fakeLanguage(l string) (string, error) {
	switch l {
	case "", "python":
		return "python", nil
	case "javascript", "js":
		return "javascript", nil
	}
	return "", execution.Errorf(execution.KindUnsupportedLanguage, "code contexts run python or javascript, not %q", l)
}

func (f *Fake) CreateContext(ctx context.Context, c execution.Caller, id string, r sandboxes.ContextRequest) (sandboxes.CodeContext, error) {
	lang, err := fakeLanguage(r.Language)
	if err != nil {
		return sandboxes.CodeContext{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return sandboxes.CodeContext{}, err
	}
	cc := f.newContext(b, lang, false)
	if r.Cwd != "" {
		cc.info.Cwd = resolve(r.Cwd)
	}
	return cc.info, nil
}

func (f *Fake) Contexts(ctx context.Context, c execution.Caller, id string) ([]sandboxes.CodeContext, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := f.running(c, id)
	if err != nil {
		return nil, err
	}
	var out []sandboxes.CodeContext
	for _, cc := range b.contexts {
		out = append(out, cc.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (f *Fake) context(c execution.Caller, id, cid string) (*box, *fakeContext, error) {
	b, err := f.running(c, id)
	if err != nil {
		return nil, nil, err
	}
	cc := b.contexts[cid]
	if cc == nil {
		return nil, nil, notFound("code context")
	}
	return b, cc, nil
}

func (f *Fake) DeleteContext(ctx context.Context, c execution.Caller, id, cid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, _, err := f.context(c, id, cid)
	if err != nil {
		return err
	}
	delete(b.contexts, cid)
	return nil
}

func (f *Fake) RestartContext(ctx context.Context, c execution.Caller, id, cid string) (sandboxes.CodeContext, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, cc, err := f.context(c, id, cid)
	if err != nil {
		return sandboxes.CodeContext{}, err
	}
	cc.vars, cc.count = map[string]string{}, 0
	return cc.info, nil
}

func (f *Fake) RunCode(ctx context.Context, c execution.Caller, id string, r sandboxes.RunCodeRequest, onEvent func(sandboxes.CodeEvent)) (sandboxes.CodeResult, error) {
	lang, err := fakeLanguage(r.Language)
	if err != nil {
		return sandboxes.CodeResult{}, err
	}
	f.mu.Lock()
	b, err := f.running(c, id)
	var cc *fakeContext
	if err == nil && r.ContextID != "" {
		_, cc, err = f.context(c, id, r.ContextID)
	} else if err == nil {
		for _, x := range f.contextsOf(b) {
			if x.info.Default && x.info.Language == lang {
				cc = x
			}
		}
		if cc == nil {
			cc = f.newContext(b, lang, true)
		}
	}
	if err != nil {
		f.mu.Unlock()
		return sandboxes.CodeResult{}, err
	}
	cc.count++
	res := sandboxes.CodeResult{ContextID: cc.info.ID, Status: "succeeded", ExecutionCount: cc.count, DurationMS: 3}
	var events []sandboxes.CodeEvent
	code := strings.TrimSpace(r.Code)
	switch name, value, isSet := strings.Cut(code, " = "); {
	case code == "crash":
		f.mu.Unlock()
		return sandboxes.CodeResult{}, execution.Errorf(execution.KindSandboxError, "the sandbox failed")
	case isSet:
		cc.vars[name] = value
	case strings.HasPrefix(code, "print(") && strings.HasSuffix(code, ")"):
		res.Stdout = code[len("print("):len(code)-1] + "\n"
		events = append(events, sandboxes.CodeEvent{Type: "stdout", Data: res.Stdout})
	case strings.HasPrefix(code, "raise "):
		res.Status = "failed"
		res.Error = &sandboxes.CodeError{Name: strings.TrimPrefix(code, "raise "), Value: "boom", Traceback: "Traceback (most recent call last):\n  File \"<cell>\", line 1\n"}
		events = append(events, sandboxes.CodeEvent{Type: "error", Error: res.Error})
	default:
		v, ok := cc.vars[code]
		if !ok {
			v = code
		}
		o := sandboxes.CodeOutput{Main: true, Data: map[string]string{"text/plain": v}}
		res.Results = append(res.Results, o)
		events = append(events, sandboxes.CodeEvent{Type: "result", Result: &o})
	}
	f.mu.Unlock()
	for _, e := range events {
		if onEvent != nil {
			onEvent(e)
		}
	}
	return res, nil
}
