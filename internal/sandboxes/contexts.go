package sandboxes

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// Code contexts: long-lived interpreters inside a live sandbox that keep
// their state (variables, imports, open files) from one cell to the next.
// Each is a process the agent started, running a small kernel of ours
// (kernels/python.py, kernels/node.js) with the image's own interpreter;
// no Jupyter server. The kernel reads one JSON request per line on its
// stdin and answers on its stdout in lines of kernelwire.go's format.
//
// A cell runs one at a time per context (a second waits for the first).
// Its timeout, or the caller going away, interrupts it with SIGINT to the
// kernel's process group: KeyboardInterrupt in Python, an interrupted
// script or a rejected await in Node; the context and its state stay.
// When a cell does not stop within interruptGrace (it catches the
// interrupt, or runs a synchronous loop after an await in Node), the
// kernel is killed and the context starts afresh on its next cell: the
// cell's error says the state was lost. So does the error of a cell whose
// kernel exited under it (os._exit, out of memory).
//
// Contexts live in the box: a pause, which keeps only the home's files,
// ends them (the ids then answer 404), and so does the sandbox's end.

//go:embed kernels/python.py
var pythonKernel string

//go:embed kernels/node.js
var nodeKernel string

const (
	maxContexts    = 8                // per sandbox
	interruptGrace = 5 * time.Second  // from SIGINT to the cell's end before the kernel is killed
	kernelStart    = 30 * time.Second // from spawn to the kernel's ready (gVisor starts slower)
	maxResultBytes = 16 << 20         // a cell's results together; past it they are dropped
	maxCodeBytes   = 1 << 20          // a cell's source
)

// Languages of code contexts, with the names they are also known by.
var contextLanguages = map[string]string{"python": "python", "py": "python", "python3": "python",
	"javascript": "javascript", "js": "javascript", "node": "javascript"}

// CodeContext is one code context of a sandbox.
type CodeContext struct {
	ID        string
	Language  string // python or javascript
	Cwd       string
	Default   bool // the language's default, used by a run that names no context
	CreatedAt time.Time
}

// ContextRequest is POST /v1/sandboxes/{id}/contexts.
type ContextRequest struct {
	Language string // "" is python
	Cwd      string // "" is the home
}

// RunCodeRequest is POST /v1/sandboxes/{id}/run: ContextID, or else
// Language's default context ("" is python).
type RunCodeRequest struct {
	Code      string
	ContextID string
	Language  string
	Env       map[string]string // set for this cell only
	TimeoutS  int               // 0 is 60 s; capped by the sandbox's expiry
}

// CodeError is an exception a cell raised (or threw).
type CodeError struct {
	Name      string
	Value     string
	Traceback string
}

// CodeOutput is one result of a cell: a MIME bundle (text/plain always,
// images base64). Main is the last expression's value; the others are
// figures displayed by the cell (open matplotlib figures at its end).
type CodeOutput struct {
	Main bool
	Data map[string]string
}

// CodeEvent is one event of a running cell: stdout or stderr (Data), a
// result (Result) or an error (Error).
type CodeEvent struct {
	Type   string
	Data   string
	Result *CodeOutput
	Error  *CodeError
}

// CodeResult is a cell's outcome. Status is succeeded, failed (it raised)
// or timed_out.
type CodeResult struct {
	ContextID      string
	Status         string
	Stdout, Stderr string
	Results        []CodeOutput
	Error          *CodeError
	ExecutionCount int
	DurationMS     int64
	Truncated      bool
	CPUSeconds     float64
}

// kernel is a context's interpreter; p is nil until it is started, and
// again after it died or was killed.
type kernel struct {
	info CodeContext
	busy chan struct{} // a token held by the running cell
	b    *box
	// ended is closed when the context is deleted or its sandbox ends:
	// nothing of it may run or wait after that.
	ended   chan struct{}
	endOnce sync.Once
	// active is set while a cell runs: between cells the reader drops
	// what a leftover thread writes, so nothing piles up in the server.
	active atomic.Bool

	mu   sync.Mutex
	p    agent.Process
	msgs chan kernelMsg // the reader's; closed when the process's events end
	gone chan struct{}  // closed when p is dropped: its reader stops sending
	seq  int64
}

// end marks k deleted, or its sandbox gone.
func (k *kernel) end() { k.endOnce.Do(func() { close(k.ended) }) }

// drop forgets k's process, if it is still p (nil: whatever it is), and
// returns the one it dropped.
func (k *kernel) drop(p agent.Process) agent.Process {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.p == nil || (p != nil && k.p != p) {
		return nil
	}
	old := k.p
	close(k.gone)
	k.p, k.msgs, k.gone = nil, nil, nil
	return old
}

func newContextID() string { return "ctx_" + strings.TrimPrefix(newID(), "sbx_") }

// ValidContextID reports whether id looks like a context id.
func ValidContextID(id string) bool {
	return strings.HasPrefix(id, "ctx_") && ValidID("sbx_"+strings.TrimPrefix(id, "ctx_"))
}

func contextLanguage(l string) (string, error) {
	if l == "" {
		return "python", nil
	}
	if v, ok := contextLanguages[strings.ToLower(l)]; ok {
		return v, nil
	}
	return "", execution.Errorf(execution.KindUnsupportedLanguage, "code contexts run python or javascript, not %q", clip(l, 40))
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// start starts k's kernel process and waits for it to be ready.
func (s *Service) startKernel(ctx context.Context, k *kernel) error {
	argv := []string{"python3", "-u", "-c", pythonKernel}
	if k.info.Language == "javascript" {
		// One V8 worker thread, not one per CPU: a sandbox's pids are
		// few, and a context is one of several.
		argv = []string{"node", "--v8-pool-size=1", "--expose-internals", "-e", nodeKernel}
	}
	p, err := k.b.ag.Spawn(ctx, agent.SpawnRequest{Argv: argv, Cwd: k.info.Cwd, Stdin: true})
	if err != nil {
		return spawnErr(err, argv[0], k.info.Cwd)
	}
	// A few messages in flight: each may be up to maxKernelLine.
	msgs, gone := make(chan kernelMsg, 4), make(chan struct{})
	go s.readKernel(k, p, msgs, gone)
	t := time.NewTimer(kernelStart)
	defer t.Stop()
	var early strings.Builder
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return startErr(k.info.Language, early.String())
			}
			if m.T == "ready" {
				// One process per context: one a queued cell or another
				// restart started meanwhile is replaced and killed, and a
				// context deleted meanwhile gets none.
				k.mu.Lock()
				select {
				case <-k.ended:
					k.mu.Unlock()
					close(gone)
					s.killKernel(p)
					return noContext(k.info.ID)
				default:
				}
				old, oldGone := k.p, k.gone
				k.p, k.msgs, k.gone = p, msgs, gone
				k.mu.Unlock()
				if old != nil {
					close(oldGone)
					go s.killKernel(old)
				}
				return nil
			}
			if early.Len() < 4096 {
				early.WriteString(m.D)
			}
		case <-t.C:
			close(gone)
			s.killKernel(p)
			return &execution.Error{Kind: execution.KindSandboxError, Msg: fmt.Sprintf("the %s interpreter did not start within %s", k.info.Language, kernelStart)}
		case <-ctx.Done():
			close(gone)
			s.killKernel(p)
			return ctx.Err()
		}
	}
}

// startErr is the error of an interpreter that exited before it was
// ready, with what it printed: out of threads or processes is the
// sandbox's limit, said so.
func startErr(language, early string) error {
	for _, sign := range []string{"uv_thread_create", "Resource temporarily unavailable", "can't start new thread", "EAGAIN"} {
		if strings.Contains(early, sign) {
			return execution.Errorf(execution.KindSandboxLimit, "the %s interpreter could not start: the sandbox is at its limit of processes and threads; delete a context or end some processes", language)
		}
	}
	return &execution.Error{Kind: execution.KindSandboxError,
		Msg: fmt.Sprintf("the %s interpreter exited as it started: %s", language, clip(strings.TrimSpace(early), 500))}
}

func (s *Service) killKernel(p agent.Process) {
	kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = p.Signal(kctx, syscall.SIGKILL)
}

// readKernel turns p's events into messages on msgs, at the sandbox's
// output rate, and closes msgs at the exit. A stderr chunk is a message
// of T "stderr" (the kernel writes cells' stderr on its stdout; this is a
// child's, or the interpreter's own), the exit one of T "exit". Once gone
// is closed it only reads p's events to their end. After the kernel's
// ready, it sends only while a cell runs (k.active), and the exit.
func (s *Service) readKernel(k *kernel, p agent.Process, msgs chan<- kernelMsg, gone <-chan struct{}) {
	defer close(msgs)
	b := k.b
	var sp kernelSplitter
	ready := false
	send := func(m kernelMsg) {
		if m.T == "ready" {
			ready = true
		} else if ready && m.T != "exit" && !k.active.Load() {
			return
		}
		select {
		case msgs <- m:
		case <-gone:
		case <-k.ended:
		}
	}
	for ev := range p.Events() {
		switch ev.Stream {
		case 0:
			if r := sp.rest(); r != "" {
				send(kernelMsg{T: "raw", D: r})
			}
			send(kernelMsg{T: "exit", Count: ev.ExitCode})
		case 1:
			for _, m := range sp.feed(ev.Data) {
				send(m)
			}
		default:
			send(kernelMsg{T: "stderr", D: string(ev.Data)})
		}
		n := len(ev.Data)
		if ready && !k.active.Load() {
			n *= 8 // output between cells, which is dropped, at an eighth of the rate
		}
		if d := pace(b.out, n); d > 0 {
			time.Sleep(d)
		}
	}
}

// contexts is b's code contexts.
func (b *box) kernels() map[string]*kernel {
	if b.contexts == nil {
		b.contexts = map[string]*kernel{}
	}
	return b.contexts
}

// CreateContext starts a code context.
func (s *Service) CreateContext(ctx context.Context, c execution.Caller, id string, r ContextRequest) (CodeContext, error) {
	lang, err := contextLanguage(r.Language)
	if err != nil {
		return CodeContext{}, err
	}
	cwd := r.Cwd
	if cwd == "" {
		cwd = engine.HomeDir
	}
	if cwd, err = homePath(cwd); err != nil {
		return CodeContext{}, err
	}
	b, _, err := s.running(ctx, c, id)
	if err != nil {
		return CodeContext{}, err
	}
	k, err := s.newKernel(b, lang, cwd, false)
	if err != nil {
		return CodeContext{}, err
	}
	if err := s.startKernel(ctx, k); err != nil {
		s.dropKernel(b, k)
		return CodeContext{}, err
	}
	return k.info, nil
}

// newKernel registers a context in b, within maxContexts.
func (s *Service) newKernel(b *box, lang, cwd string, dflt bool) (*kernel, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.kernels()
	if dflt {
		for _, k := range m {
			if k.info.Default && k.info.Language == lang {
				return k, nil
			}
		}
	}
	if len(m) >= maxContexts {
		return nil, execution.Errorf(execution.KindSandboxLimit, "the sandbox has %d code contexts, the most it may have; delete one first", maxContexts)
	}
	k := &kernel{b: b, busy: make(chan struct{}, 1), ended: make(chan struct{}),
		info: CodeContext{ID: newContextID(), Language: lang, Cwd: cwd, Default: dflt, CreatedAt: s.now().UTC()}}
	m[k.info.ID] = k
	return k, nil
}

func (s *Service) dropKernel(b *box, k *kernel) {
	k.end()
	b.mu.Lock()
	delete(b.kernels(), k.info.ID)
	b.mu.Unlock()
	if p := k.drop(nil); p != nil {
		s.killKernel(p)
	}
}

// Contexts lists the sandbox's code contexts, oldest first.
func (s *Service) Contexts(ctx context.Context, c execution.Caller, id string) ([]CodeContext, error) {
	b, err := s.liveOnly(ctx, c, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	out := make([]CodeContext, 0, len(b.contexts))
	for _, k := range b.contexts {
		out = append(out, k.info)
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (s *Service) kernel(ctx context.Context, c execution.Caller, id, cid string) (*box, *kernel, error) {
	b, err := s.liveOnly(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	k := b.contexts[cid]
	b.mu.Unlock()
	if k == nil {
		return nil, nil, noContext(cid)
	}
	return b, k, nil
}

func noContext(cid string) error {
	return execution.Errorf(execution.KindNotFound, "no code context %q in this sandbox (contexts end when the sandbox is paused)", clip(cid, 80))
}

// DeleteContext ends a code context and its state.
func (s *Service) DeleteContext(ctx context.Context, c execution.Caller, id, cid string) error {
	b, k, err := s.kernel(ctx, c, id, cid)
	if err != nil {
		return err
	}
	s.dropKernel(b, k)
	return nil
}

// RestartContext starts a context's interpreter afresh: its state is
// gone; a running cell ends with an error saying so.
func (s *Service) RestartContext(ctx context.Context, c execution.Caller, id, cid string) (CodeContext, error) {
	_, k, err := s.kernel(ctx, c, id, cid)
	if err != nil {
		return CodeContext{}, err
	}
	if p := k.drop(nil); p != nil {
		s.killKernel(p)
	}
	// The running cell, if any, sees its kernel's end; wait for its token.
	select {
	case k.busy <- struct{}{}:
	case <-ctx.Done():
		return CodeContext{}, ctx.Err()
	}
	defer func() { <-k.busy }()
	if err := s.startKernel(ctx, k); err != nil {
		return CodeContext{}, err
	}
	return k.info, nil
}

// checkRunCode refuses a malformed cell before anything is admitted.
func checkRunCode(c execution.Caller, r RunCodeRequest) error {
	if err := checkForegroundTimeout(c, r.TimeoutS); err != nil {
		return err
	}
	if len(r.Code) > maxCodeBytes {
		return execution.Errorf(execution.KindPayloadTooLarge, "the code is %d bytes; a cell may be at most %d", len(r.Code), maxCodeBytes)
	}
	if strings.ContainsRune(r.Code, 0) {
		return execution.Errorf(execution.KindInvalidRequest, "the code must not contain a NUL byte")
	}
	if r.ContextID != "" && !ValidContextID(r.ContextID) {
		return noContext(r.ContextID)
	}
	if _, err := contextLanguage(r.Language); err != nil {
		return err
	}
	return execution.CheckEnv(r.Env, false)
}

// RunCode runs one cell in a context: the one named, or the language's
// default (created on first use). onEvent, if set, gets its events as
// they come. It counts one execution toward the daily quota, given back
// when the platform fails.
func (s *Service) RunCode(ctx context.Context, c execution.Caller, id string, r RunCodeRequest, onEvent func(CodeEvent)) (CodeResult, error) {
	if err := checkRunCode(c, r); err != nil {
		return CodeResult{}, err
	}
	lang, _ := contextLanguage(r.Language)
	b, rec, err := s.running(ctx, c, id)
	if err != nil {
		return CodeResult{}, err
	}
	var k *kernel
	if r.ContextID != "" {
		b.mu.Lock()
		k = b.contexts[r.ContextID]
		b.mu.Unlock()
		if k == nil {
			return CodeResult{}, noContext(r.ContextID)
		}
		if r.Language != "" && k.info.Language != lang {
			return CodeResult{}, execution.Errorf(execution.KindInvalidRequest, "context %s runs %s, not %s", k.info.ID, k.info.Language, lang)
		}
	} else if k, err = s.newKernel(b, lang, engine.HomeDir, true); err != nil {
		return CodeResult{}, err
	}
	// One cell at a time: a second waits, holding nothing of the node's.
	select {
	case k.busy <- struct{}{}:
	case <-ctx.Done():
		return CodeResult{}, execution.Errorf(execution.KindSandboxError, "the request ended while waiting for the context's previous cell")
	}
	defer func() { <-k.busy }()
	timeout, release, refund, err := s.foreground(ctx, c, rec, r.TimeoutS)
	if err != nil {
		return CodeResult{}, err
	}
	defer release()
	cpu0 := b.live.Usage().CPUSeconds
	start := s.now()
	res, err := s.cell(ctx, k, r, timeout, parseLimits(rec), onEvent, "")
	if err != nil {
		if b.refundable(err) {
			refund()
		}
		return CodeResult{}, err
	}
	res.ContextID = k.info.ID
	res.DurationMS = s.now().Sub(start).Milliseconds()
	res.CPUSeconds = max(0, b.live.Usage().CPUSeconds-cpu0)
	return res, nil
}

// cell runs r in k, which the caller holds (k.busy).
// note, if set, is told on stderr first: the cell runs in a kernel that
// replaced one that had exited.
func (s *Service) cell(ctx context.Context, k *kernel, r RunCodeRequest, timeout time.Duration, lim Limits, onEvent func(CodeEvent), note string) (CodeResult, error) {
	k.mu.Lock()
	p, msgs, gone := k.p, k.msgs, k.gone
	k.mu.Unlock()
	if p == nil {
		if err := s.startKernel(ctx, k); err != nil {
			return CodeResult{}, err
		}
		k.mu.Lock()
		p, msgs, gone = k.p, k.msgs, k.gone
		k.mu.Unlock()
	}
	// Output a thread of an earlier cell wrote after that cell's end is
	// not this cell's.
	for drained := false; !drained; {
		select {
		case m, ok := <-msgs:
			if !ok || m.T == "exit" {
				return s.lostKernel(ctx, k, r, timeout, lim, onEvent, note)
			}
		default:
			drained = true
		}
	}
	k.active.Store(true)
	defer k.active.Store(false)
	k.seq++
	n := k.seq
	line, err := json.Marshal(map[string]any{"n": n, "code": r.Code, "env": r.Env})
	if err != nil {
		return CodeResult{}, execution.Internal(err)
	}
	if err := p.Write(ctx, append(line, '\n')); err != nil {
		if errors.Is(err, agent.ErrExited) {
			return s.lostKernel(ctx, k, r, timeout, lim, onEvent, note)
		}
		return CodeResult{}, procErr(err, p.PID())
	}
	var res CodeResult
	var out [2]strings.Builder
	resultBytes, droppedNote := 0, false
	emit := func(e CodeEvent) {
		if onEvent != nil {
			onEvent(e)
		}
	}
	text := func(i int, data string) {
		if data == "" {
			return
		}
		if room := lim.OutputBytes - out[i].Len(); len(data) > room {
			data, res.Truncated = data[:max(0, room)], true
		}
		if data == "" {
			return
		}
		out[i].WriteString(data)
		emit(CodeEvent{Type: [2]string{"stdout", "stderr"}[i], Data: data})
	}
	fail := func(ce *CodeError) {
		res.Error = ce
		emit(CodeEvent{Type: "error", Error: ce})
	}
	if note != "" {
		text(1, note)
	}
	tc := time.NewTimer(timeout)
	defer tc.Stop()
	done := ctx.Done()
	var grace <-chan time.Time
	interrupted, timedOut := false, false
	interrupt := func() {
		if interrupted {
			return
		}
		interrupted = true
		grace = time.After(interruptGrace)
		ictx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Signal(ictx, syscall.SIGINT)
	}
	finish := func() (CodeResult, error) {
		res.Stdout, res.Stderr = out[0].String(), out[1].String()
		switch {
		case timedOut:
			res.Status = "timed_out"
		case res.Error != nil:
			res.Status = "failed"
		default:
			res.Status = "succeeded"
		}
		return res, nil
	}
	for {
		select {
		case <-tc.C:
			timedOut = true
			interrupt()
		case <-done:
			done = nil
			interrupt()
		case <-gone:
			fail(&CodeError{Name: "ContextRestarted", Value: "the context was restarted or deleted during the cell; its state is lost"})
			return finish()
		case <-grace:
			// It did not stop: kill it; the context starts afresh.
			s.forget(k, p)
			fail(&CodeError{Name: "ContextRestarted", Value: fmt.Sprintf("the cell did not stop within %s of the interrupt, so the context's interpreter was killed; its state is lost and the next cell starts afresh", interruptGrace)})
			return finish()
		case m, ok := <-msgs:
			if !ok {
				m = kernelMsg{T: "exit", Count: -1}
			}
			switch m.T {
			case "raw":
				text(0, m.D)
			case "stdout":
				text(0, m.D)
			case "stderr":
				text(1, m.D)
			case "result":
				if m.Data == nil {
					m.Data = mimeBundle{}
				}
				size := 0
				for mime, v := range m.Data {
					size += len(mime) + len(v) + 64 // and the map's entry
				}
				if resultBytes+size > maxResultBytes {
					if !droppedNote {
						text(1, fmt.Sprintf("vertal: results past %d MiB in all were dropped\n", maxResultBytes>>20))
						droppedNote = true
					}
					res.Truncated = true
					continue
				}
				resultBytes += size
				o := CodeOutput{Main: m.Main, Data: map[string]string(m.Data)}
				res.Results = append(res.Results, o)
				emit(CodeEvent{Type: "result", Result: &o})
			case "dropped":
				res.Truncated = true
				text(1, fmt.Sprintf("vertal: a result over %d MiB was dropped\n", maxKernelLine>>20))
			case "error":
				fail(&CodeError{Name: m.Name, Value: m.Value, Traceback: m.Traceback})
			case "end":
				if m.N != n {
					continue // an end the cell forged, or an earlier cell's
				}
				res.ExecutionCount = m.Count
				return finish()
			case "exit":
				s.forget(k, p)
				if k.b.endedByOwner() {
					return CodeResult{}, execution.Errorf(execution.KindSandboxNotRunning, "the sandbox was paused, killed or expired (as asked, or at its timeout) during the cell; the cell counts against your quota")
				}
				if k.b.ending.Load() {
					return CodeResult{}, execution.Errorf(execution.KindSandboxNotRunning, "the sandbox was paused or ended by the server during the cell; it was not counted against your quota")
				}
				if timedOut || interrupted {
					fail(&CodeError{Name: "ContextRestarted", Value: "the interpreter exited on the interrupt; its state is lost and the next cell starts afresh"})
				} else {
					fail(&CodeError{Name: "ContextDied", Value: fmt.Sprintf("the interpreter exited during the cell (status %d; out of memory, or the code ended it); its state is lost and the next cell starts afresh", m.Count)})
				}
				return finish()
			}
		}
	}
}

// forget drops k's kernel process p (killing it), so the next cell starts
// a new one.
func (s *Service) forget(k *kernel, p agent.Process) {
	k.drop(p)
	go s.killKernel(p)
}

// lostKernel runs r in a new kernel for k, whose process ended between
// cells; the cell is told on stderr that the state is gone. A kernel that
// ends again at once is the sandbox's failure.
func (s *Service) lostKernel(ctx context.Context, k *kernel, r RunCodeRequest, timeout time.Duration, lim Limits, onEvent func(CodeEvent), note string) (CodeResult, error) {
	if note != "" {
		return CodeResult{}, execution.Errorf(execution.KindSandboxError, "the context's %s interpreter exits as soon as it starts", k.info.Language)
	}
	k.drop(nil)
	if err := s.startKernel(ctx, k); err != nil {
		return CodeResult{}, err
	}
	return s.cell(ctx, k, r, timeout, lim, onEvent, "vertal: the context's interpreter had exited since the last cell; it was started afresh, without its state\n")
}
