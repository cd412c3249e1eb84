package sandboxes

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// fakeStarter starts fakeLives, each with a fakeAgent.
type fakeStarter struct {
	mu    sync.Mutex
	specs []engine.LiveSpec
	lives []*fakeLive
	fail  atomic.Bool
	// gate, if set, says what a Start must wait for first (nil: nothing).
	gate func(engine.LiveSpec) <-chan struct{}
}

func (f *fakeStarter) Start(ctx context.Context, spec engine.LiveSpec) (engine.Live, error) {
	if f.fail.Load() {
		return nil, errors.New("fake: the runtime failed")
	}
	// The drivers refuse an incomplete spec; so does the fake.
	if err := spec.Limits.Validate(); err != nil {
		return nil, err
	}
	if f.gate != nil {
		if ch := f.gate(spec); ch != nil {
			<-ch
		}
	}
	l := &fakeLive{done: make(chan struct{}), ag: newFakeAgent(spec.Deadline)}
	l.cpuMilli.Store(40) // the start's own CPU, which no tenant pays for
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.lives = append(f.lives, l)
	f.mu.Unlock()
	return l, nil
}

func (f *fakeStarter) last() *fakeLive {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lives[len(f.lives)-1]
}

// all is a copy of what was started so far, specs and lives alike.
func (f *fakeStarter) all() ([]engine.LiveSpec, []*fakeLive) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.specs), slices.Clone(f.lives)
}

// byID is the sandbox started as id, nil if none.
func (f *fakeStarter) byID(id string) *fakeLive {
	specs, lives := f.all()
	for i, s := range specs {
		if s.ID == id {
			return lives[i]
		}
	}
	return nil
}

func (f *fakeStarter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lives)
}

type fakeLive struct {
	done      chan struct{}
	once      sync.Once
	discarded atomic.Bool
	cpuMilli  atomic.Int64
	ag        *fakeAgent
}

func (l *fakeLive) Conn() io.ReadWriteCloser { return nil }
func (l *fakeLive) Done() <-chan struct{}    { return l.done }
func (l *fakeLive) Usage() engine.Usage {
	return engine.Usage{CPUSeconds: float64(l.cpuMilli.Load()) / 1000}
}

// addCPU makes the sandbox's cgroup count ms more milliseconds of CPU.
func (l *fakeLive) addCPU(ms int64)    { l.cpuMilli.Add(ms) }
func (l *fakeLive) MemoryBytes() int64 { return 1 << 20 }
func (l *fakeLive) Discard(context.Context) error {
	l.discarded.Store(true)
	l.die()
	return nil
}
func (l *fakeLive) die() { l.once.Do(func() { close(l.done) }) }

// fakeAgent keeps the home in memory and runs a few scripted commands:
// "echo X" (X on stdout), "exit N", "big N" (N bytes on stdout and
// stderr), "cat" (stdin to stdout at EOF), "sleep" (until a signal),
// "die" (its events end without an exit, as when the agent is gone),
// "hang" (until the connection is closed, then no exit).
type fakeAgent struct {
	mu       sync.Mutex
	files    map[string][]byte
	deadline time.Time
	env      map[string]string
	egress   []string // the relays asked for, "socket:port"
	pid      int
	closed   bool
	saved    []byte // the last SaveHome archive
	restored []byte // the last RestoreHome archive
	stuck    chan struct{}
}

func newFakeAgent(deadline time.Time) *fakeAgent {
	return &fakeAgent{files: map[string][]byte{}, deadline: deadline, pid: 100}
}

func (a *fakeAgent) Ping(context.Context) error { return nil }

// Unresponsive is closed by stall.
func (a *fakeAgent) Unresponsive() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stuck == nil {
		a.stuck = make(chan struct{})
	}
	return a.stuck
}

// stall makes the agent as one whose reply timed out.
func (a *fakeAgent) stall() {
	a.Unresponsive()
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stuck:
	default:
		close(a.stuck)
	}
}
func (a *fakeAgent) Close() error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	return nil
}

func (a *fakeAgent) Spawn(ctx context.Context, r agent.SpawnRequest) (agent.Process, error) {
	a.mu.Lock()
	a.pid++
	p := &fakeProc{pid: a.pid, events: make(chan agent.Event, 16), signal: make(chan syscall.Signal, 4), stdinEOF: make(chan struct{})}
	a.mu.Unlock()
	line := strings.Join(r.Argv, " ")
	if len(r.Argv) == 3 && r.Argv[0] == "/bin/sh" && r.Argv[1] == "-c" {
		line = r.Argv[2]
	}
	word, arg, _ := strings.Cut(line, " ")
	if word == "nope" {
		return nil, agent.ErrNotExist
	}
	if word == "forkfail" {
		return nil, fmt.Errorf("fork/exec: %w", agent.ErrAgain)
	}
	if word == "hang" {
		go func() { // until the connection closes, then no exit: as a real one
			for {
				a.mu.Lock()
				closed := a.closed
				a.mu.Unlock()
				if closed {
					close(p.events)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		return p, nil
	}
	go p.run(word, arg)
	return p, nil
}

type fakeProc struct {
	pid      int
	events   chan agent.Event
	signal   chan syscall.Signal
	mu       sync.Mutex
	stdin    bytes.Buffer
	stdinEOF chan struct{}
	eofOnce  sync.Once
	exited   atomic.Bool
	signals  []syscall.Signal
}

func (p *fakeProc) run(word, arg string) {
	exit := func(code, sig int) {
		p.exited.Store(true)
		p.events <- agent.Event{ExitCode: code, Signal: sig}
		close(p.events)
	}
	switch word {
	case "echo":
		p.events <- agent.Event{Stream: 1, Data: []byte(arg + "\n")}
		exit(0, 0)
	case "exit":
		n, _ := strconv.Atoi(arg)
		exit(n, 0)
	case "big":
		n, _ := strconv.Atoi(arg)
		for sent := 0; sent < n; sent += 1000 {
			p.events <- agent.Event{Stream: 1, Data: bytes.Repeat([]byte("o"), min(1000, n-sent))}
			p.events <- agent.Event{Stream: 2, Data: bytes.Repeat([]byte("e"), min(1000, n-sent))}
		}
		exit(0, 0)
	case "cat":
		select {
		case <-p.stdinEOF:
			p.mu.Lock()
			data := append([]byte(nil), p.stdin.Bytes()...)
			p.mu.Unlock()
			p.events <- agent.Event{Stream: 1, Data: data}
			exit(0, 0)
		case sig := <-p.signal:
			exit(128+int(sig), int(sig))
		}
	case "sleep":
		sig := <-p.signal
		exit(128+int(sig), int(sig))
	case "die":
		close(p.events)
	default:
		p.events <- agent.Event{Stream: 2, Data: []byte(word + ": not found\n")}
		exit(127, 0)
	}
}

func (p *fakeProc) PID() int                   { return p.pid }
func (p *fakeProc) Events() <-chan agent.Event { return p.events }
func (p *fakeProc) Write(ctx context.Context, b []byte) error {
	if p.exited.Load() {
		return agent.ErrExited
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stdin.Write(b)
	return nil
}
func (p *fakeProc) CloseStdin(ctx context.Context) error {
	p.eofOnce.Do(func() { close(p.stdinEOF) })
	return nil
}
func (p *fakeProc) Signal(ctx context.Context, sig syscall.Signal) error {
	if p.exited.Load() {
		return agent.ErrExited
	}
	p.mu.Lock()
	p.signals = append(p.signals, sig)
	p.mu.Unlock()
	select {
	case p.signal <- sig:
	default:
	}
	return nil
}

func (a *fakeAgent) Stat(ctx context.Context, path string) (agent.FileInfo, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[path]
	if !ok {
		return agent.FileInfo{}, agent.ErrNotExist
	}
	return agent.FileInfo{Name: path[strings.LastIndexByte(path, '/')+1:], Type: "file", Size: int64(len(b)), Mode: 0o644}, nil
}

func (a *fakeAgent) List(ctx context.Context, dir string) ([]agent.FileInfo, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []agent.FileInfo
	for p, b := range a.files {
		if strings.HasPrefix(p, dir+"/") && !strings.Contains(p[len(dir)+1:], "/") {
			out = append(out, agent.FileInfo{Name: p[len(dir)+1:], Type: "file", Size: int64(len(b)), Mode: 0o644})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (a *fakeAgent) ReadFile(ctx context.Context, path string, max int64, w io.Writer) (int64, error) {
	a.mu.Lock()
	b, ok := a.files[path]
	a.mu.Unlock()
	if !ok {
		return 0, agent.ErrNotExist
	}
	if int64(len(b)) > max {
		return 0, agent.ErrTooLarge
	}
	n, err := w.Write(b)
	return int64(n), err
}

func (a *fakeAgent) WriteFile(ctx context.Context, path string, r io.Reader, max int64, mode os.FileMode) (int64, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return 0, err
	}
	if int64(len(b)) > max {
		return 0, agent.ErrTooLarge
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.files[path] = b
	return int64(len(b)), nil
}

func (a *fakeAgent) Remove(ctx context.Context, path string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.files[path]; !ok {
		return agent.ErrNotExist
	}
	delete(a.files, path)
	return nil
}

func (a *fakeAgent) Mkdir(ctx context.Context, path string) error { return agent.ErrPermission }

func (a *fakeAgent) Move(ctx context.Context, from, to string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[from]
	if !ok {
		return agent.ErrNotExist
	}
	delete(a.files, from)
	a.files[to] = b
	return nil
}

func (a *fakeAgent) SaveHome(ctx context.Context, max int64, w io.Writer) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(a.files))
	for p := range a.files {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		b := a.files[p]
		if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(p, engine.HomeDir+"/"), Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return 0, err
		}
		tw.Write(b)
	}
	tw.Close()
	if int64(buf.Len()) > max {
		return 0, agent.ErrTooLarge
	}
	a.saved = buf.Bytes()
	n, err := w.Write(buf.Bytes())
	return int64(n), err
}

func (a *fakeAgent) RestoreHome(ctx context.Context, r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(bytes.NewReader(data))
	a.mu.Lock()
	defer a.mu.Unlock()
	a.restored = data
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(tr)
		a.files[engine.HomeDir+"/"+h.Name] = b
	}
}

func (a *fakeAgent) SetDeadline(ctx context.Context, t time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deadline = t
	return nil
}

func (a *fakeAgent) SetEnv(ctx context.Context, env map[string]string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.env = maps.Clone(env)
	return nil
}

func (a *fakeAgent) Egress(ctx context.Context, socket string, port int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.egress = append(a.egress, socket+":"+strconv.Itoa(port))
	return nil
}

func (a *fakeAgent) getEgress() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.egress)
}

func (a *fakeAgent) getEnv() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.env
}

func (a *fakeAgent) getDeadline() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.deadline
}
