package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// The bounds of a command's event log (for Events' replay) and of the
// finished commands a sandbox remembers.
const (
	maxLogEvents = 1024
	maxLogBytes  = 1 << 20
	// A sandbox's logs together: past it, a command that logs more keeps
	// only its newest minLogBytes, and finished commands are forgotten
	// oldest first. The logs are the server's memory, outside every
	// cgroup and the node's sandbox memory budget.
	maxBoxLogBytes = 8 << 20
	// maxFollowers is how many …/events streams one sandbox may have open.
	maxFollowers   = 8
	minLogBytes    = 64 << 10
	keepFinished   = 64
	defaultCommand = 60 * time.Second // a foreground command's timeout when it names none
)

// proc is one command of a live sandbox.
type proc struct {
	p       agent.Process
	out     *rate.Limiter // its sandbox's (box.out)
	boxLogs *atomic.Int64 // its sandbox's logs' bytes (box.logBytes)
	box     *box

	mu      sync.Mutex
	cmd     Command
	events  []Event // the newest, bounded by maxLogEvents and maxLogBytes
	bytes   int
	seq     int64
	done    bool
	changed chan struct{} // closed and replaced on every append
}

func (pr *proc) append(e Event, at time.Time) Event {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.seq++
	e.Seq = pr.seq
	pr.events = append(pr.events, e)
	pr.bytes += len(e.Data)
	pr.boxLogs.Add(int64(len(e.Data)))
	for len(pr.events) > maxLogEvents || (pr.bytes > maxLogBytes && len(pr.events) > 1) ||
		(pr.boxLogs.Load() > maxBoxLogBytes && pr.bytes > minLogBytes && len(pr.events) > 1) {
		pr.bytes -= len(pr.events[0].Data)
		pr.boxLogs.Add(-int64(len(pr.events[0].Data)))
		pr.events = pr.events[1:]
	}
	if e.Type == "exit" {
		code := e.ExitCode
		pr.cmd.Running, pr.cmd.ExitCode, pr.done = false, &code, true
		pr.cmd.EndedAt = &at
	}
	close(pr.changed)
	pr.changed = make(chan struct{})
	return e
}

func (pr *proc) snapshot() Command {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.cmd
}

// commandLine is r's argv and working directory, or the request's error:
// checked before anything is admitted or counted.
func commandLine(r CommandRequest) (argv []string, cwd string, err error) {
	argv = r.Argv
	switch {
	case r.Cmd != "" && len(r.Argv) > 0, r.Cmd == "" && len(r.Argv) == 0:
		return nil, "", execution.Errorf(execution.KindInvalidRequest, "give exactly one of cmd and argv")
	case r.Cmd != "":
		argv = []string{"/bin/sh", "-c", r.Cmd}
	}
	if err := checkArgv(argv, r.Cmd != ""); err != nil {
		return nil, "", err
	}
	if err := execution.CheckEnv(r.Env, false); err != nil {
		return nil, "", err
	}
	cwd = r.Cwd
	if cwd == "" {
		cwd = engine.HomeDir
	}
	if cwd, err = homePath(cwd); err != nil {
		return nil, "", err
	}
	return argv, cwd, nil
}

// spawn starts r in b and registers it.
func (s *Service) spawn(ctx context.Context, b *box, r CommandRequest, keepStdin bool) (*proc, error) {
	argv, cwd, err := commandLine(r)
	if err != nil {
		return nil, err
	}
	p, err := b.ag.Spawn(ctx, agent.SpawnRequest{Argv: argv, Cwd: cwd, Env: r.Env, Stdin: keepStdin || r.Stdin != ""})
	if err != nil {
		return nil, spawnErr(err, argv[0], cwd)
	}
	pr := &proc{p: p, out: b.out, boxLogs: &b.logBytes, box: b, changed: make(chan struct{}), cmd: Command{PID: p.PID(), Cmd: r.Cmd, Argv: r.Argv, Running: true, StartedAt: s.now().UTC()}}
	b.mu.Lock()
	b.procs[pr.cmd.PID] = pr
	b.forgetFinishedLocked(0)
	b.mu.Unlock()
	if r.Stdin != "" {
		if err := p.Write(ctx, []byte(r.Stdin)); err == nil {
			_ = p.CloseStdin(ctx)
		}
	}
	return pr, nil
}

// Caps on a command's argv (or cmd, run as /bin/sh -c cmd), from the
// kernel's: execve refuses one string over 128 KiB (MAX_ARG_STRLEN), and
// the arguments and environment together over a quarter of the stack
// limit; 512 KiB keeps well inside it beside env's 32 KiB.
const (
	maxArgBytes  = 128<<10 - 1
	maxArgvBytes = 512 << 10
	maxArgs      = 4096
)

// checkArgv refuses what execve would, with the reason; fromCmd says argv
// is sh -c and the request's cmd.
func checkArgv(argv []string, fromCmd bool) error {
	if len(argv) > maxArgs {
		return execution.Errorf(execution.KindInvalidRequest, "argv has %d entries; the limit is %d", len(argv), maxArgs)
	}
	if argv[0] == "" {
		return execution.Errorf(execution.KindInvalidRequest, "argv[0], the program, must not be empty")
	}
	total := 0
	for i, a := range argv {
		switch {
		case strings.ContainsRune(a, 0):
			return execution.Errorf(execution.KindInvalidRequest, "%s must not contain a NUL byte", argName(i, fromCmd))
		case len(a) > maxArgBytes:
			return execution.Errorf(execution.KindInvalidRequest, "%s is %d bytes; one argument may be at most %d (the kernel's limit): pass big input as stdin or a file", argName(i, fromCmd), len(a), maxArgBytes)
		}
		total += len(a) + 1
	}
	if total > maxArgvBytes {
		return execution.Errorf(execution.KindInvalidRequest, "the command's arguments are %d bytes; the limit is %d: pass big input as stdin or a file", total, maxArgvBytes)
	}
	return nil
}

// argName names argv[i] as the request gave it: a cmd is argv[2] of sh -c.
func argName(i int, fromCmd bool) string {
	if fromCmd {
		return "cmd"
	}
	return fmt.Sprintf("argv[%d]", i)
}

// spawnErr is the error of a command the agent could not start: a
// missing or unrunnable program is named as well as the cwd, since either
// can be what is missing.
func spawnErr(err error, program, cwd string) error {
	switch {
	case errors.Is(err, agent.ErrNotExist):
		return execution.Errorf(execution.KindNotFound, "cannot start %q in %s: no such program or directory", program, cwd)
	case errors.Is(err, agent.ErrAgain):
		return execution.Errorf(execution.KindSandboxLimit, "cannot start %q: the sandbox is at its limit of processes; end some (signal them) or kill the sandbox", program)
	case errors.Is(err, agent.ErrPermission):
		return execution.Errorf(execution.KindForbidden, "cannot start %q in %s: permission denied (note that /home/user and /tmp are noexec; run a script through its interpreter)", program, cwd)
	}
	return fileErr(err, cwd)
}

// forgetFinishedLocked keeps the keepFinished newest finished commands,
// and fewer while the sandbox's logs with need more bytes would be over
// maxBoxLogBytes.
func (b *box) forgetFinishedLocked(need int64) {
	var done []*proc
	for _, pr := range b.procs {
		if c := pr.snapshot(); !c.Running {
			done = append(done, pr)
		}
	}
	sort.Slice(done, func(i, j int) bool { return done[i].snapshot().EndedAt.Before(*done[j].snapshot().EndedAt) })
	for i, pr := range done {
		if len(done)-i <= keepFinished && b.logBytes.Load()+need <= maxBoxLogBytes {
			return
		}
		delete(b.procs, pr.cmd.PID)
		pr.mu.Lock()
		b.logBytes.Add(-int64(pr.bytes))
		pr.bytes, pr.events = 0, nil
		pr.mu.Unlock()
	}
}

// follow reads pr's events into its log until the exit, calling fn with
// each. It kills the command's process group after timeout (if > 0) or
// when ctx ends. exited is false when the events ended without an exit:
// the connection to the agent, or the sandbox, went away.
func (s *Service) follow(ctx context.Context, pr *proc, timeout time.Duration, fn func(Event)) (exit agent.Event, timedOut, exited, stuck bool) {
	var killed sync.Once
	kill := func() {
		killed.Do(func() {
			kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = pr.p.Signal(kctx, syscall.SIGKILL)
		})
	}
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	// Once it is killed, its exit must come within killGrace: an agent
	// that code stopped (SIGSTOP, same uid) sends nothing, and the caller
	// holds a slot of the node's. Past that the command counts as not
	// exited, and the caller ends the sandbox.
	var grace <-chan time.Time
	startGrace := func() {
		if grace == nil {
			grace = time.After(killGrace)
		}
	}
	done := ctx.Done()
	events := pr.p.Events()
	// Output is read at the sandbox's output rate: while paced is nil
	// the next frame waits in the agent's window, and the agent's reader
	// on its full pipe.
	read, paced := events, (<-chan time.Time)(nil)
	for {
		select {
		case <-paced:
			read, paced = events, nil
		case <-tc:
			timedOut, tc = true, nil
			startGrace()
			go kill()
		case <-done:
			done = nil
			startGrace()
			go kill()
		case <-grace:
			s.log.Warn("a killed command's exit did not come; its agent is stopped or hung", "pid", pr.cmd.PID)
			return exit, timedOut, false, true
		case ev, ok := <-read:
			if !ok {
				if !exited {
					pr.append(Event{Type: "exit", ExitCode: -1}, s.now().UTC())
				}
				return exit, timedOut, exited, false
			}
			var e Event
			switch ev.Stream {
			case 0:
				e = Event{Type: "exit", ExitCode: ev.ExitCode}
				exit, exited = ev, true
			case 1:
				e = Event{Type: "stdout", Data: string(ev.Data)}
			default:
				e = Event{Type: "stderr", Data: string(ev.Data)}
			}
			if pr.box != nil && pr.boxLogs.Load()+int64(len(e.Data)) > maxBoxLogBytes {
				// Finished commands' logs go first, oldest first.
				pr.box.mu.Lock()
				pr.box.forgetFinishedLocked(int64(len(e.Data)))
				pr.box.mu.Unlock()
			}
			e = pr.append(e, s.now().UTC())
			if fn != nil {
				fn(e)
			}
			if d := pace(pr.out, len(ev.Data)); d > 0 {
				read, paced = nil, time.After(d)
			}
		}
	}
}

// frameCost is the least a frame of output is charged against the output
// rate: a frame costs the server about as much to relay whatever it
// carries, so a writer of single bytes, one frame each, would otherwise
// pass the byte rate at thousands of frames a second. Paced, the agent
// waits for credit while the pipe fills, and its next read takes up to a
// whole chunk: tiny writes coalesce into few frames.
const frameCost = 16 << 10

// pace takes a frame of n bytes from l and says how long to wait before
// reading more; a nil l paces nothing.
func pace(l *rate.Limiter, n int) time.Duration {
	if l == nil || n == 0 { // an exit
		return 0
	}
	r := l.ReserveN(time.Now(), min(max(n, frameCost), l.Burst()))
	if !r.OK() {
		return 0
	}
	return r.Delay()
}

// killGrace is how long a killed command's exit may take to arrive.
const killGrace = 10 * time.Second

// Run runs a foreground command; onEvent, if set, gets its events as they
// come (for SSE) before Run returns the result. It counts one execution
// toward the daily quota, given back when the platform fails.
func (s *Service) Run(ctx context.Context, c execution.Caller, id string, r CommandRequest, onEvent func(Event)) (CommandResult, error) {
	if err := checkForegroundTimeout(c, r.TimeoutS); err != nil {
		return CommandResult{}, err
	}
	if _, _, err := commandLine(r); err != nil {
		return CommandResult{}, err // not counted: nothing ran
	}
	b, rec, err := s.running(ctx, c, id)
	if err != nil {
		return CommandResult{}, err
	}
	timeout, release, refund, err := s.foreground(ctx, c, rec, r.TimeoutS)
	if err != nil {
		return CommandResult{}, err
	}
	defer release()
	lim := parseLimits(rec)
	cpu0 := b.live.Usage().CPUSeconds
	start := s.now()
	pr, err := s.spawn(ctx, b, r, false)
	if err != nil {
		if b.refundable(err) {
			refund()
		}
		return CommandResult{}, err
	}
	var out [2]strings.Builder
	truncated := false
	exit, timedOut, exited, stuck := s.follow(ctx, pr, timeout, func(e Event) {
		i := 0
		switch e.Type {
		case "stderr":
			i = 1
		case "exit":
			if onEvent != nil {
				onEvent(e)
			}
			return
		}
		data := e.Data
		if room := lim.OutputBytes - out[i].Len(); len(data) > room {
			data, truncated = data[:max(0, room)], true
		}
		out[i].WriteString(data)
		if onEvent != nil && data != "" {
			e.Data = data
			onEvent(e)
		}
	})
	if !exited {
		if b.endedByOwner() {
			return CommandResult{}, execution.Errorf(execution.KindSandboxNotRunning,
				"sandbox %s was paused, killed or expired (as asked, or at its timeout) during the command; the command counts against your quota", rec.ID)
		}
		refund()
		if b.ending.Load() {
			return CommandResult{}, execution.Errorf(execution.KindSandboxNotRunning,
				"sandbox %s was paused or ended by the server during the command; it was not counted against your quota", rec.ID)
		}
		if stuck {
			// Its agent stopped (code can SIGSTOP it) or hung: the sandbox
			// is ended, so that nothing of the node's waits on it. (A reply
			// that times out does the same through watch.)
			go s.endUnresponsive(c, rec.ID, b)
			return CommandResult{}, &execution.Error{Kind: execution.KindSandboxError,
				Msg: "the sandbox stopped answering during the command, and was ended; it was not counted against your quota", Err: errors.New("no exit after the kill")}
		}
		return CommandResult{}, &execution.Error{Kind: execution.KindSandboxError,
			Msg: "the sandbox stopped during the command; it was not counted against your quota", Err: errors.New("no exit event")}
	}
	res := CommandResult{
		PID: pr.cmd.PID, Stdout: out[0].String(), Stderr: out[1].String(), ExitCode: exit.ExitCode,
		DurationMS: s.now().Sub(start).Milliseconds(), Truncated: truncated,
		CPUSeconds: max(0, b.live.Usage().CPUSeconds-cpu0),
	}
	switch {
	case timedOut:
		res.Status = "timed_out"
	case exit.ExitCode == 0:
		res.Status = "succeeded"
	default:
		res.Status = "failed"
	}
	return res, nil
}

// foreground admits a foreground call (a command or a cell) of c's to rec
// and counts it toward the daily quota: its timeout (timeoutS, 0 for the
// default, capped by the sandbox's expiry), the node slot's release and
// the quota's refund.
func (s *Service) foreground(ctx context.Context, c execution.Caller, rec store.Sandbox, timeoutS int) (timeout time.Duration, release, refund func(), err error) {
	timeout = time.Duration(timeoutS) * time.Second
	if timeout == 0 {
		timeout = defaultCommand
		if c.Plan.MaxTimeoutS > 0 {
			timeout = min(timeout, time.Duration(c.Plan.MaxTimeoutS)*time.Second)
		}
	}
	timeout = min(timeout, max(time.Second, rec.ExpiresAt.Sub(s.now())))
	if release, err = s.admit(ctx, c); err != nil {
		return 0, nil, nil, err
	}
	if refund, err = s.reserve(ctx, c); err != nil {
		release()
		return 0, nil, nil, err
	}
	return timeout, release, refund, nil
}

// checkForegroundTimeout refuses a foreground command's or a cell's
// timeout_s past the plan's max_timeout_s, as for an execution: the run
// holds one of the node's slots for as long as it lasts, so a plan's
// bound on one run must bound it too (else two tenants could hold a
// 2-slot node for a sandbox's whole life). Background commands hold no
// slot and run until the sandbox ends.
func checkForegroundTimeout(c execution.Caller, timeoutS int) error {
	switch {
	case timeoutS < 0:
		return execution.Errorf(execution.KindInvalidTimeout, "timeout_s must not be negative")
	case c.Plan.MaxTimeoutS > 0 && timeoutS > c.Plan.MaxTimeoutS:
		return execution.InvalidTimeout(c)
	}
	return nil
}

// StartCommand starts a background command and answers at once. It counts
// one execution toward the daily quota.
func (s *Service) StartCommand(ctx context.Context, c execution.Caller, id string, r CommandRequest) (Command, error) {
	if r.TimeoutS < 0 {
		return Command{}, execution.Errorf(execution.KindInvalidTimeout, "timeout_s must not be negative")
	}
	if _, _, err := commandLine(r); err != nil {
		return Command{}, err // not counted: nothing ran
	}
	b, _, err := s.running(ctx, c, id)
	if err != nil {
		return Command{}, err
	}
	release, err := s.admit(ctx, c)
	if err != nil {
		return Command{}, err
	}
	refund, err := s.reserve(ctx, c)
	if err != nil {
		release()
		return Command{}, err
	}
	pr, err := s.spawn(ctx, b, r, r.Stdin == "")
	release() // a background command holds no slot once started
	if err != nil {
		if b.refundable(err) {
			refund()
		}
		return Command{}, err
	}
	go s.follow(context.Background(), pr, time.Duration(r.TimeoutS)*time.Second, nil)
	return pr.snapshot(), nil
}

// Commands lists the sandbox's commands, running and recently finished,
// by pid.
func (s *Service) Commands(ctx context.Context, c execution.Caller, id string) ([]Command, error) {
	b, err := s.liveOnly(ctx, c, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	out := make([]Command, 0, len(b.procs))
	for _, pr := range b.procs {
		out = append(out, pr.snapshot())
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

func (s *Service) proc(ctx context.Context, c execution.Caller, id string, pid int) (*proc, error) {
	b, err := s.liveOnly(ctx, c, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	pr := b.procs[pid]
	b.mu.Unlock()
	if pr == nil {
		return nil, execution.Errorf(execution.KindNotFound, "no command with pid %d", pid)
	}
	return pr, nil
}

func finished(pid int) *execution.Error {
	return execution.Errorf(execution.KindProcessFinished, "the command with pid %d has exited", pid)
}

// SendStdin writes data to a command's stdin, then closes it if eof.
func (s *Service) SendStdin(ctx context.Context, c execution.Caller, id string, pid int, data []byte, eof bool) error {
	pr, err := s.proc(ctx, c, id, pid)
	if err != nil {
		return err
	}
	if pr.snapshot().ExitCode != nil {
		return finished(pid)
	}
	if len(data) > 0 {
		if err := pr.p.Write(ctx, data); err != nil {
			return procErr(err, pid)
		}
	}
	if eof {
		if err := pr.p.CloseStdin(ctx); err != nil {
			return procErr(err, pid)
		}
	}
	return nil
}

var signals = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT,
}

// Signal sends a signal by name (with or without SIG): TERM, KILL, INT,
// HUP, QUIT, USR1, USR2, STOP, CONT, to the command's process group.
func (s *Service) Signal(ctx context.Context, c execution.Caller, id string, pid int, signal string) error {
	sig, ok := signals[strings.TrimPrefix(strings.ToUpper(signal), "SIG")]
	if !ok {
		return execution.Errorf(execution.KindInvalidRequest, "unknown signal %q; use TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT", signal)
	}
	pr, err := s.proc(ctx, c, id, pid)
	if err != nil {
		return err
	}
	if pr.snapshot().ExitCode != nil {
		return finished(pid)
	}
	if err := pr.p.Signal(ctx, sig); err != nil {
		return procErr(err, pid)
	}
	return nil
}

// Events replays a command's events after seq (those the bounded log
// still holds), then follows them until its exit event or ctx ends; fn's
// error stops it.
func (s *Service) Events(ctx context.Context, c execution.Caller, id string, pid int, after int64, fn func(Event) error) error {
	pr, err := s.proc(ctx, c, id, pid)
	if err != nil {
		return err
	}
	// Each follower costs the server its own encoding and writing of the
	// same output, so a sandbox has a few at once, not one per connection.
	if n := pr.box.followers.Add(1); n > maxFollowers {
		pr.box.followers.Add(-1)
		return &execution.Error{Kind: execution.KindRateLimited, RetryAfter: 5,
			Msg: fmt.Sprintf("sandbox %s already has %d event streams open, the most it may have at once; close one first", id, maxFollowers)}
	}
	defer pr.box.followers.Add(-1)
	for {
		pr.mu.Lock()
		var next []Event
		for _, e := range pr.events {
			if e.Seq > after {
				next = append(next, e)
			}
		}
		done, changed := pr.done, pr.changed
		pr.mu.Unlock()
		for _, e := range next {
			if err := fn(e); err != nil {
				return err
			}
			after = e.Seq
			if e.Type == "exit" {
				return nil
			}
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

func procErr(err error, pid int) error {
	switch {
	case errors.Is(err, agent.ErrExited):
		return finished(pid)
	case errors.Is(err, agent.ErrNoProcess):
		return execution.Errorf(execution.KindNotFound, "no command with pid %d", pid)
	case errors.Is(err, agent.ErrClosed):
		return execution.Errorf(execution.KindSandboxNotRunning, "the sandbox stopped")
	}
	return &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox failed to deliver it", Err: err}
}

// platformErr reports whether err is the platform's failure (not the
// request's), which gives the quota back.
func platformErr(err error) bool {
	var xe *execution.Error
	if !errors.As(err, &xe) {
		return true
	}
	switch xe.Kind {
	case execution.KindSandboxError, execution.KindSandboxNotRunning, execution.KindInternal, execution.KindUnavailable:
		return true
	}
	return false
}
