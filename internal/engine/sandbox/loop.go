package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Process is one sandbox's program as the execution loop drives it. Every
// driver implements it twice, for a cold sandbox (created for the
// execution) and a warm one (pre-started, handed the code); Supervise is
// the one loop that runs them all: timer, kill, drain, OOM
// classification, usage, returned files and the Result.
//
// A Process is ready to Start when Supervise gets it: its sandbox exists
// or is about to, and its output can be read.
type Process interface {
	// Start makes the program run; the timeout counts from here. The cold
	// oci path starts the runtime, the cold docker path the container, a
	// warm sandbox reads the go line. An error means no user code ran.
	Start(ctx context.Context) error
	// Stdin is where the program's stdin goes. Supervise writes
	// Spec.Stdin and closes it, after Start; errors there mean the program
	// exited without reading it all.
	Stdin() io.WriteCloser
	// CopyOutput copies the program's stdout and stderr into the writers
	// until both end. Supervise calls it once, in a goroutine of its own,
	// before Start.
	CopyOutput(stdout, stderr io.Writer) error
	// Wait blocks until the program's exit is known and returns its exit
	// status (128+signal when killed); an error means the platform failed.
	Wait() (int, error)
	// Kill ends every process of the sandbox at once. It may be called at
	// any time, more than once, from any goroutine; an error means the
	// sandbox could not be killed.
	Kill() error
	// CloseOutput makes CopyOutput return now: something kept the output
	// open after the exit and the kill.
	CloseOutput()
	// Finish is called once, after the exit and the drain, with what the
	// loop saw. It adds what only the driver knows (an OOM kill, CPU and
	// peak memory) and returns an error if the platform failed instead of
	// the program (the runtime never created the sandbox).
	Finish(ctx context.Context, e Exit) (Exit, error)
	// Workdir is the host path of the sandbox's CodeDir, which ReturnFiles
	// are collected from after Finish; "" if the driver has none.
	Workdir() string
}

// Exit is how a program ended, as the loop and then the driver saw it.
type Exit struct {
	Code      int
	TimedOut  bool
	OOMKilled bool
	// CPUSeconds and PeakMemoryBytes are filled in by Process.Finish.
	CPUSeconds      float64
	PeakMemoryBytes int64
}

// DrainTimeout bounds how long output may keep arriving after the
// program exited. The streams end with the sandbox's last process, so it
// matters only if a process escaped the kill or a daemon misbehaves.
const DrainTimeout = 5 * time.Second

// LoopOptions are the loop's clock, for tests; the zero value is real time.
type LoopOptions struct {
	Now   func() time.Time
	After func(d time.Duration, f func()) (stop func() bool)
	// Collect gathers spec.ReturnFiles from a host directory; nil means
	// CollectFiles.
	Collect func(dir string, globs []string, l engine.Limits) ([]engine.File, bool, error)
}

// Supervise runs p for spec: it starts the program, feeds its stdin,
// captures its output (capped, and passed on to spec.Output as it
// arrives), kills it at spec.Timeout or when ctx ends, and builds the
// Result. When ctx ends first it returns ctx's error and no Result.
// Destroying the sandbox is left to the caller, and so is checking spec
// (Spec.Validate), which the loop takes as given.
func Supervise(ctx context.Context, spec engine.Spec, p Process, o LoopOptions) (engine.Result, error) {
	now, after, collect := o.Now, o.After, o.Collect
	if now == nil {
		now = time.Now
	}
	if after == nil {
		after = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
	}
	if collect == nil {
		collect = CollectFiles
	}
	if err := ctx.Err(); err != nil {
		return engine.Result{}, err
	}

	stdout, stderr := newStreams(spec)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_ = p.CopyOutput(stdout, stderr)
	}()
	if err := p.Start(ctx); err != nil {
		p.CloseOutput()
		<-copied
		return engine.Result{}, err
	}
	// Stdin only after Start: a warm sandbox reads its go line from the
	// same pipe, so the user's stdin (or its end) must not come first.
	// The writer ends by itself: the write fails once the program exits,
	// and the sandbox's teardown closes the pipe.
	go func() {
		in := p.Stdin()
		if in == nil {
			return
		}
		_, _ = io.WriteString(in, spec.Stdin)
		_ = in.Close()
	}()
	// Duration and the timeout count from the same moment: once the
	// program was started (the runtime launched, the container started,
	// the go line written).
	start := now()

	var (
		mu       sync.Mutex
		finished bool
		why      string // "timeout" or "canceled", set once
		killErr  error
	)
	stop := func(reason string) {
		mu.Lock()
		defer mu.Unlock()
		if finished || why != "" {
			return
		}
		why = reason
		killErr = p.Kill()
	}
	stopTimer := after(spec.Timeout, func() { stop("timeout") })
	watched := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop("canceled")
		case <-watched:
		}
	}()
	code, waitErr := p.Wait()
	duration := now().Sub(start)
	mu.Lock()
	finished = true
	reason, kerr := why, killErr
	mu.Unlock()
	stopTimer()
	close(watched)

	// Output ends when the last sandbox process is gone; if something kept
	// it open, kill again and close it.
	select {
	case <-copied:
	case <-time.After(DrainTimeout):
		_ = p.Kill()
		p.CloseOutput()
		<-copied
	}

	switch {
	case reason == "canceled":
		return engine.Result{}, ctx.Err()
	case kerr != nil:
		return engine.Result{}, fmt.Errorf("killing the sandbox at its timeout: %w", kerr)
	case waitErr != nil:
		return engine.Result{}, waitErr
	}
	exit := Exit{Code: code, TimedOut: reason == "timeout"}
	if exit.TimedOut {
		exit.Code = 128 + int(syscall.SIGKILL)
	}
	exit, err := p.Finish(ctx, exit)
	if err != nil {
		if msg := setupMessage(stderr.String()); errors.Is(err, engine.ErrSetup) && msg != "" {
			err = fmt.Errorf("%w; the runtime said: %s", err, msg)
		}
		return engine.Result{}, err
	}
	res := engine.Result{
		Status:    Classify(exit.Code, exit.TimedOut, exit.OOMKilled),
		Stdout:    stdout.String(),
		Stderr:    stderr.String(),
		ExitCode:  exit.Code,
		Duration:  duration,
		Truncated: stdout.Truncated() || stderr.Truncated(),
		Usage: engine.Usage{
			SandboxSeconds:  duration.Seconds(),
			CPUSeconds:      max(exit.CPUSeconds, 0),
			PeakMemoryBytes: exit.PeakMemoryBytes,
		},
	}
	if len(spec.ReturnFiles) > 0 {
		dir := p.Workdir()
		if dir == "" {
			return engine.Result{}, errors.New("this driver cannot return files")
		}
		if res.Files, res.FilesTruncated, err = collect(dir, spec.ReturnFiles, spec.Limits); err != nil {
			return engine.Result{}, fmt.Errorf("collecting returned files: %w", err)
		}
	}
	return res, nil
}

// newStreams returns the capped buffers of stdout and stderr, which pass
// what they keep on to spec.Output one call at a time.
func newStreams(spec engine.Spec) (stdout, stderr *CappedBuffer) {
	stdout = &CappedBuffer{Max: spec.Limits.OutputBytes}
	stderr = &CappedBuffer{Max: spec.Limits.OutputBytes}
	if spec.Output != nil {
		var mu sync.Mutex
		emit := func(s engine.Stream) func([]byte) {
			return func(p []byte) {
				mu.Lock()
				defer mu.Unlock()
				spec.Output(s, p)
			}
		}
		stdout.onKeep, stderr.onKeep = emit(engine.Stdout), emit(engine.Stderr)
	}
	return stdout, stderr
}

// setupMessage is the end of what a runtime that failed to set a sandbox
// up wrote on its stderr: its last line or two, at most 300 bytes.
func setupMessage(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	msg := strings.Join(lines[max(0, len(lines)-2):], " | ")
	if len(msg) > 300 {
		msg = "..." + msg[len(msg)-297:]
	}
	return strings.ToValidUTF8(msg, "?")
}
