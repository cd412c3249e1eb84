package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
)

// fakeProcess is a program the loop drives without any sandbox: it
// writes its output, then exits with code, or waits until killed.
type fakeProcess struct {
	stdout, stderr []string // written in turn, stdout first
	code           int
	hang           bool // never exits by itself
	holdOutput     bool // keeps output open after the exit until CloseOutput
	startErr       error
	killErr        error
	waitErr        error
	finishErr      error
	oom            bool

	mu        sync.Mutex
	kills     int
	started   bool
	early     bool // stdin was written or closed before Start
	stdinGot  strings.Builder
	exited    chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func (p *fakeProcess) init() *fakeProcess {
	p.exited = make(chan struct{})
	p.closed = make(chan struct{})
	return p
}

func (p *fakeProcess) Start(ctx context.Context) error {
	if p.startErr != nil {
		return p.startErr
	}
	// Give a stdin writer that runs too early the time to show it.
	time.Sleep(5 * time.Millisecond)
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
	if !p.hang {
		go func() { time.Sleep(10 * time.Millisecond); p.exit() }()
	}
	return nil
}

func (p *fakeProcess) exit() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
	default:
		close(p.exited)
	}
}

type stdinRecorder struct{ p *fakeProcess }

func (w stdinRecorder) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	w.p.early = w.p.early || !w.p.started
	return w.p.stdinGot.Write(b)
}

func (w stdinRecorder) Close() error {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	w.p.early = w.p.early || !w.p.started
	return nil
}

func (p *fakeProcess) Stdin() io.WriteCloser { return stdinRecorder{p} }

func (p *fakeProcess) CopyOutput(stdout, stderr io.Writer) error {
	for i := range max(len(p.stdout), len(p.stderr)) {
		if i < len(p.stdout) {
			io.WriteString(stdout, p.stdout[i])
		}
		if i < len(p.stderr) {
			io.WriteString(stderr, p.stderr[i])
		}
	}
	if p.holdOutput {
		<-p.closed
	}
	return nil
}

func (p *fakeProcess) Wait() (int, error) {
	<-p.exited
	if p.waitErr != nil {
		return 0, p.waitErr
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kills > 0 {
		return 137, nil
	}
	return p.code, nil
}

func (p *fakeProcess) Kill() error {
	p.mu.Lock()
	p.kills++
	p.mu.Unlock()
	if p.killErr != nil {
		return p.killErr
	}
	p.exit()
	return nil
}

func (p *fakeProcess) CloseOutput() { p.closeOnce.Do(func() { close(p.closed) }) }

func (p *fakeProcess) Finish(ctx context.Context, e Exit) (Exit, error) {
	e.OOMKilled = p.oom
	e.CPUSeconds, e.PeakMemoryBytes = 0.25, 1<<20
	return e, p.finishErr
}

func (p *fakeProcess) Workdir() string { return "/work/dir" }

func TestSupervise(t *testing.T) {
	errBoom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		p       *fakeProcess
		spec    engine.Spec
		cancel  bool // cancel ctx right after the start
		want    engine.Result
		wantErr error
		wantMsg string // the error's whole text, when set
		kills   bool
	}{
		{name: "succeeds", p: &fakeProcess{stdout: []string{"a", "b"}, stderr: []string{"e"}},
			want: engine.Result{Status: engine.StatusSucceeded, Stdout: "ab", Stderr: "e"}},
		{name: "fails", p: &fakeProcess{code: 3}, want: engine.Result{Status: engine.StatusFailed, ExitCode: 3}},
		{name: "oom", p: &fakeProcess{code: 137, oom: true}, want: engine.Result{Status: engine.StatusMemoryExceeded, ExitCode: 137}},
		{name: "timeout kills", p: &fakeProcess{hang: true}, spec: engine.Spec{Timeout: 20 * time.Millisecond},
			want: engine.Result{Status: engine.StatusTimedOut, ExitCode: 137}, kills: true},
		{name: "output capped", p: &fakeProcess{stdout: []string{"12345", "678"}}, spec: engine.Spec{Limits: engine.Limits{OutputBytes: 4}},
			want: engine.Result{Status: engine.StatusSucceeded, Stdout: "1234", Truncated: true}},
		{name: "cancel kills and returns ctx error", p: &fakeProcess{hang: true}, cancel: true,
			wantErr: context.Canceled, kills: true},
		{name: "start fails", p: &fakeProcess{startErr: errBoom}, wantErr: errBoom},
		{name: "wait fails", p: &fakeProcess{waitErr: errBoom}, wantErr: errBoom},
		{name: "finish fails", p: &fakeProcess{code: 1, finishErr: errBoom}, wantErr: errBoom},
		{name: "setup fails, runtime's message in the error", p: &fakeProcess{code: 1, stderr: []string{"bwrap: warming up\n", "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n"},
			finishErr: fmt.Errorf("%w (exit status 1)", engine.ErrSetup)}, wantErr: engine.ErrSetup,
			wantMsg: "engine: the sandbox could not be set up (exit status 1); the runtime said: bwrap: warming up | bwrap: Can't mount proc on /newroot/proc: Operation not permitted"},
		{name: "setup fails silently", p: &fakeProcess{code: 1, finishErr: engine.ErrSetup}, wantErr: engine.ErrSetup, wantMsg: "engine: the sandbox could not be set up"},
		{name: "kill fails at timeout", p: &fakeProcess{hang: true, killErr: errBoom}, spec: engine.Spec{Timeout: 20 * time.Millisecond},
			wantErr: errBoom, kills: true},
		{name: "returned files", p: &fakeProcess{}, spec: engine.Spec{ReturnFiles: []string{"*.png"}},
			want: engine.Result{Status: engine.StatusSucceeded, Files: []engine.File{{Path: "/work/dir:*.png"}}, FilesTruncated: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p.init()
			if tc.name == "kill fails at timeout" {
				// The kill fails; the program ends anyway a little later.
				go func() { time.Sleep(100 * time.Millisecond); p.exit() }()
			}
			spec := enginetest.Complete(tc.spec)
			spec.Stdin = "input"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				time.AfterFunc(20*time.Millisecond, cancel)
			}
			collect := func(dir string, globs []string, l engine.Limits) ([]engine.File, bool, error) {
				return []engine.File{{Path: dir + ":" + strings.Join(globs, ",")}}, true, nil
			}
			got, err := Supervise(ctx, spec, p, LoopOptions{Collect: collect})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v; want %v", err, tc.wantErr)
			}
			if tc.wantMsg != "" && err.Error() != tc.wantMsg {
				t.Errorf("error text %q; want %q", err, tc.wantMsg)
			}
			if (p.kills > 0) != tc.kills {
				t.Errorf("kills = %d; want killed %v", p.kills, tc.kills)
			}
			if err != nil {
				return
			}
			if got.Duration <= 0 || got.Usage.SandboxSeconds <= 0 {
				t.Errorf("duration %v, sandbox seconds %v; want both > 0", got.Duration, got.Usage.SandboxSeconds)
			}
			if got.Usage.CPUSeconds != 0.25 || got.Usage.PeakMemoryBytes != 1<<20 {
				t.Errorf("usage %+v; want Finish's", got.Usage)
			}
			got.Duration, got.Usage = 0, engine.Usage{}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			// A warm sandbox reads its go line from the stdin pipe:
			// nothing of the user's stdin may come before Start.
			if p.early {
				t.Errorf("stdin was written or closed before Start")
			}
			if s := p.stdinGot.String(); s != "input" {
				t.Errorf("stdin got %q; want the spec's", s)
			}
		})
	}
}

// TestSuperviseDrainBound: output held open after the exit (a process
// that escaped the kill) is cut after DrainTimeout, not waited for.
func TestSuperviseDrainBound(t *testing.T) {
	p := (&fakeProcess{stdout: []string{"x"}, holdOutput: true}).init()
	res, err := Supervise(context.Background(), enginetest.Complete(engine.Spec{}), p, LoopOptions{})
	if err != nil || res.Stdout != "x" || p.kills == 0 {
		t.Fatalf("res %+v err %v kills %d; want stdout x, no error, killed", res, err, p.kills)
	}
}

// TestSuperviseOutputSink: the live sink gets exactly what is kept, in
// order per stream, with nothing past the cap.
func TestSuperviseOutputSink(t *testing.T) {
	p := (&fakeProcess{stdout: []string{"ab", "cd", "ef"}, stderr: []string{"1", "2"}}).init()
	var mu sync.Mutex
	got := map[engine.Stream]string{}
	spec := enginetest.Complete(engine.Spec{Limits: engine.Limits{OutputBytes: 5}, Output: func(s engine.Stream, b []byte) {
		mu.Lock()
		defer mu.Unlock()
		got[s] += string(b)
	}})
	res, err := Supervise(context.Background(), spec, p, LoopOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[engine.Stream]string{engine.Stdout: "abcde", engine.Stderr: "12"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sink (-want +got):\n%s", diff)
	}
	if res.Stdout != got[engine.Stdout] || res.Stderr != got[engine.Stderr] {
		t.Errorf("result %q/%q differs from the sink", res.Stdout, res.Stderr)
	}
}
