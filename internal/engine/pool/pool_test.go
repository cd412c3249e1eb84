package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
)

// fakeCold is the base driver: it answers "cold:<code>" and keeps the
// specs it ran.
type fakeCold struct {
	runs atomic.Int64

	mu    sync.Mutex
	specs []engine.Spec
}

func (d *fakeCold) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	d.runs.Add(1)
	d.mu.Lock()
	d.specs = append(d.specs, spec)
	d.mu.Unlock()
	return engine.Result{Status: engine.StatusSucceeded, Stdout: "cold:" + spec.Code}, nil
}

func (d *fakeCold) ran() []engine.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]engine.Spec(nil), d.specs...)
}
func (d *fakeCold) Reap(ctx context.Context) (int, error) { return 7, nil }
func (d *fakeCold) Name() string                          { return "fake/cold" }

// fakePre pre-starts fakeWarm sandboxes.
type fakePre struct {
	mu    sync.Mutex
	n     int
	all   []*fakeWarm
	mem   int64
	err   error         // returned by Prestart when set
	gate  chan struct{} // when set, Prestart waits for a receive
	calls atomic.Int64
}

func (f *fakePre) Prestart(ctx context.Context, lang engine.Language, l engine.Limits) (Warm, error) {
	f.calls.Add(1)
	f.mu.Lock()
	gate, err := f.gate, f.err
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	w := &fakeWarm{id: fmt.Sprintf("w%d", f.n), lang: lang, limits: l, mem: f.mem, done: make(chan struct{})}
	f.all = append(f.all, w)
	return w, nil
}

func (f *fakePre) sandboxes() []*fakeWarm {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeWarm(nil), f.all...)
}

type fakeWarm struct {
	id     string
	lang   engine.Language
	limits engine.Limits
	mem    int64
	dead   bool // Exec fails with ErrNotStarted

	mu        sync.Mutex
	execs     int
	discards  int
	done      chan struct{}
	closeOnce sync.Once
}

func (w *fakeWarm) Exec(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.execs++
	if w.execs > 1 || w.discards > 0 {
		return engine.Result{}, fmt.Errorf("sandbox %s reused (execs %d, discards %d)", w.id, w.execs, w.discards)
	}
	defer w.end()
	if w.dead {
		return engine.Result{}, fmt.Errorf("%w: dead", ErrNotStarted)
	}
	sl, wl := spec.Limits, w.limits
	sl.OutputBytes, wl.OutputBytes = 0, 0
	if w.limits.Lifetime <= 0 {
		return engine.Result{}, fmt.Errorf("sandbox for %s was pre-started without a deadline of its own", w.lang.Name)
	}
	sl.Lifetime, wl.Lifetime = 0, 0
	if sl != wl || spec.Language.Name != w.lang.Name {
		return engine.Result{}, fmt.Errorf("sandbox for %s %+v got %s %+v", w.lang.Name, w.limits, spec.Language.Name, spec.Limits)
	}
	return engine.Result{Status: engine.StatusSucceeded, Stdout: "warm:" + w.id + ":" + spec.Code}, nil
}

func (w *fakeWarm) end()                  { w.closeOnce.Do(func() { close(w.done) }) }
func (w *fakeWarm) Done() <-chan struct{} { return w.done }
func (w *fakeWarm) MemoryBytes() int64    { return w.mem }
func (w *fakeWarm) Discard(ctx context.Context) error {
	w.mu.Lock()
	w.discards++
	w.mu.Unlock()
	w.end()
	return nil
}

func (w *fakeWarm) counts() (execs, discards int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.execs, w.discards
}

var (
	python = engine.Language{Name: "python", Image: "/img", File: "main.py", Command: []string{"python3"}}
	node   = engine.Language{Name: "javascript", Image: "/img", File: "main.js", Command: []string{"node"}}
)

// eventually waits for cond; the bound only stops a broken test.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func statsOf(p *Pool, lang string) Stats {
	for _, s := range p.Stats() {
		if s.Language == lang {
			return s
		}
	}
	return Stats{Language: lang}
}

// full makes s whole as execution.prepare would: the pool refuses a Spec
// that is not.
var full = enginetest.Complete

// testLimits are the limits the test pools are kept for: those of full.
var testLimits = full(engine.Spec{}).Limits

// sized gives opts the server's default sizes (config.Default) and
// testLimits where it names none: the pool takes them as given.
func sized(opts Options) Options {
	if opts.Min == 0 {
		opts.Min = 1
	}
	if opts.Max == 0 {
		opts.Max = 4
	}
	if opts.MemoryBytes == 0 {
		opts.MemoryBytes = 1 << 30
	}
	if opts.Limits == (engine.Limits{}) {
		opts.Limits = testLimits
	}
	return opts
}

func newTestPool(t *testing.T, pre *fakePre, opts Options) (*Pool, *fakeCold) {
	t.Helper()
	cold := &fakeCold{}
	p := New(cold, pre, sized(opts))
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		// Every sandbox is destroyed exactly once... or more: Discard
		// is idempotent; but never executed twice.
		for _, w := range pre.sandboxes() {
			if execs, discards := w.counts(); execs > 1 || discards == 0 {
				t.Errorf("sandbox %s: %d execs, %d discards; want at most 1 exec and a discard", w.id, execs, discards)
			}
		}
	})
	return p, cold
}

func run(t *testing.T, p *Pool, lang engine.Language, code string) engine.Result {
	t.Helper()
	res, err := p.Run(context.Background(), full(engine.Spec{ID: "exe_1", Language: lang, Code: code}))
	if err != nil {
		t.Fatalf("Run(%q): %v", code, err)
	}
	return res
}

func TestRunTakesAWarmSandboxAndRefills(t *testing.T) {
	pre := &fakePre{}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })

	res := run(t, p, python, "print(1)")
	if res.Stdout != "warm:w1:print(1)" {
		t.Errorf("stdout = %q; want the warm sandbox w1 to run the code", res.Stdout)
	}
	eventually(t, "w1 discarded", func() bool { _, d := pre.sandboxes()[0].counts(); return d > 0 })
	eventually(t, "refilled", func() bool { return statsOf(p, "python").Ready == 1 })
	res = run(t, p, python, "print(2)")
	if res.Stdout != "warm:w2:print(2)" {
		t.Errorf("stdout = %q; want a new sandbox, w2", res.Stdout)
	}
	if cold.runs.Load() != 0 {
		t.Errorf("cold runs = %d; want 0", cold.runs.Load())
	}
	s := statsOf(p, "python")
	if s.Hits != 2 || s.Misses != 0 {
		t.Errorf("hits, misses = %d, %d; want 2, 0", s.Hits, s.Misses)
	}
}

// TestEnvArgsOrEgressRunCold: a launcher started with the fixed
// environment and command line, and without the egress mount, so a
// request with env, args or egress goes to the cold path as it is,
// leaves the ready sandbox for another request, and is no miss (the pool
// does not grow for it).
func TestEnvArgsOrEgressRunCold(t *testing.T) {
	pre := &fakePre{}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })
	var want []engine.Spec
	for _, spec := range []engine.Spec{
		{ID: "exe_1", Language: python, Code: "a", Env: map[string]string{"A": "1"}},
		{ID: "exe_2", Language: python, Code: "b", Args: []string{"x"}},
		{ID: "exe_3", Language: python, Code: "c", EgressDir: "/run/vertal/egress/exe_3", Agent: "/usr/local/bin/vertal-agent"},
	} {
		spec = full(spec)
		want = append(want, spec)
		res, err := p.Run(context.Background(), spec)
		if err != nil || res.Stdout != "cold:"+spec.Code {
			t.Fatalf("Run(%q) = %q, %v; want the cold path", spec.Code, res.Stdout, err)
		}
	}
	s := statsOf(p, "python")
	if cold.runs.Load() != 3 || s.Bypassed != 3 || s.Misses != 0 || s.Ready != 1 || s.Target != 1 {
		t.Errorf("cold runs %d, stats %+v; want 3 cold, 3 bypassed, no miss, the warm sandbox still ready, target 1", cold.runs.Load(), s)
	}
	if diff := cmp.Diff(want, cold.ran()); diff != "" {
		t.Errorf("specs the cold driver ran (-want +got):\n%s", diff)
	}
	for _, w := range pre.sandboxes() {
		if execs, _ := w.counts(); execs != 0 {
			t.Errorf("warm sandbox %s ran %d executions; want none", w.id, execs)
		}
	}
}

func TestDryPoolRunsColdAndGrows(t *testing.T) {
	pre := &fakePre{gate: make(chan struct{})} // nothing gets ready
	p, cold := newTestPool(t, pre, Options{Max: 3, Parallel: 4})
	for i := range 5 {
		res := run(t, p, node, fmt.Sprint(i))
		if res.Stdout != "cold:"+fmt.Sprint(i) {
			t.Errorf("run %d: stdout = %q; want the cold path", i, res.Stdout)
		}
	}
	if got := cold.runs.Load(); got != 5 {
		t.Errorf("cold runs = %d; want 5", got)
	}
	s := statsOf(p, "javascript")
	if s.Misses != 5 || s.Target != 3 {
		t.Errorf("misses, target = %d, %d; want 5 and the target grown to Max (3)", s.Misses, s.Target)
	}
	eventually(t, "3 starting", func() bool { return statsOf(p, "javascript").Starting == 3 })
	close(pre.gate)
	eventually(t, "3 ready", func() bool { return statsOf(p, "javascript").Ready == 3 })
	if n := pre.calls.Load(); n != 3 {
		t.Errorf("pre-starts = %d; want 3 (Max)", n)
	}
}

func TestWaitReadyTakesTheSandboxBeingStarted(t *testing.T) {
	pre := &fakePre{gate: make(chan struct{})}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}, WaitReady: time.Minute})
	eventually(t, "starting", func() bool { return statsOf(p, "python").Starting == 1 })
	go func() { pre.gate <- struct{}{} }()
	res := run(t, p, python, "x")
	if !strings.HasPrefix(res.Stdout, "warm:") || cold.runs.Load() != 0 {
		t.Errorf("stdout = %q, cold runs %d; want the run to wait for the warm sandbox", res.Stdout, cold.runs.Load())
	}
	close(pre.gate)
}

func TestEverySandboxServesOnce(t *testing.T) {
	pre := &fakePre{}
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}, Max: 4, Parallel: 2, WaitReady: time.Minute})
	var wg sync.WaitGroup
	seen := sync.Map{}
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := p.Run(context.Background(), full(engine.Spec{Language: python, Code: fmt.Sprint(i)}))
			if err != nil {
				t.Errorf("Run: %v", err)
				return
			}
			if id, ok := strings.CutPrefix(res.Stdout, "warm:"); ok {
				id, _, _ = strings.Cut(id, ":")
				if prev, dup := seen.LoadOrStore(id, i); dup {
					t.Errorf("sandbox %s served runs %v and %d", id, prev, i)
				}
			}
		}()
	}
	wg.Wait()
	// newTestPool's cleanup checks each sandbox ran at most once and was
	// discarded.
}

func TestCrashedSandboxIsReplacedNotHandedOut(t *testing.T) {
	pre := &fakePre{}
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })
	w1 := pre.sandboxes()[0]
	w1.end() // the sandbox's processes die while it waits
	eventually(t, "replacement ready", func() bool {
		s := statsOf(p, "python")
		return s.Crashed == 1 && s.Ready == 1
	})
	res := run(t, p, python, "x")
	if res.Stdout != "warm:w2:x" {
		t.Errorf("stdout = %q; want the replacement w2", res.Stdout)
	}
	if execs, discards := w1.counts(); execs != 0 || discards != 1 {
		t.Errorf("crashed sandbox: %d execs, %d discards; want 0, 1", execs, discards)
	}
}

// TestOutdatedImageSandboxIsDropped: an image directory's rootfs is a
// link to its current version; once a rebuild switches it, a sandbox
// warmed on the old version is dropped unused and the execution runs on
// one started on the new version.
func TestOutdatedImageSandboxIsDropped(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"v1", "v2"} {
		if err := os.MkdirAll(filepath.Join(dir, "versions", v, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(v string) {
		tmp := filepath.Join(dir, "current.new")
		if err := os.Symlink(filepath.Join("versions", v), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "current")); err != nil {
			t.Fatal(err)
		}
	}
	link("v1")
	if err := os.Symlink(filepath.Join("current", "rootfs"), filepath.Join(dir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	lang := python
	lang.Image = filepath.Join(dir, "rootfs")

	pre := &fakePre{}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{lang}, WaitReady: 10 * time.Second})
	eventually(t, "one ready on v1", func() bool { return statsOf(p, "python").Ready == 1 })
	link("v2") // vertal image build or update switches the version
	res := run(t, p, lang, "x")
	if res.Stdout != "warm:w2:x" {
		t.Errorf("stdout = %q; want w2, started on v2 (w1 was warmed on v1)", res.Stdout)
	}
	w1 := pre.sandboxes()[0]
	eventually(t, "the v1 sandbox discarded", func() bool { _, d := w1.counts(); return d > 0 })
	if execs, _ := w1.counts(); execs != 0 {
		t.Errorf("the v1 sandbox ran %d executions; want none", execs)
	}
	if s := statsOf(p, "python"); s.Outdated != 1 || s.Crashed != 0 || cold.runs.Load() != 0 {
		t.Errorf("outdated %d, crashed %d, cold runs %d; want 1, 0, 0", s.Outdated, s.Crashed, cold.runs.Load())
	}
	// Unchanged from here on: the next one runs warm, as usual (on a
	// sandbox started after the switch; the miss raised the target, so
	// more than one may be ready).
	eventually(t, "refilled", func() bool { return statsOf(p, "python").Ready >= 1 })
	if res := run(t, p, lang, "y"); !strings.HasPrefix(res.Stdout, "warm:w") || strings.HasPrefix(res.Stdout, "warm:w1:") || strings.HasPrefix(res.Stdout, "warm:w2:") {
		t.Errorf("stdout = %q; want a sandbox started after w2", res.Stdout)
	}
	if s := statsOf(p, "python"); s.Outdated != 1 {
		t.Errorf("outdated %d after the refill; want still 1", s.Outdated)
	}
}

func TestSandboxThatCannotTakeTheCodeFallsBackCold(t *testing.T) {
	pre := &fakePre{}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })
	pre.sandboxes()[0].dead = true
	res := run(t, p, python, "x")
	if res.Stdout != "cold:x" || cold.runs.Load() != 1 {
		t.Errorf("stdout = %q, cold runs %d; want the cold path", res.Stdout, cold.runs.Load())
	}
	s := statsOf(p, "python")
	if s.Hits != 0 || s.Misses != 1 || s.Crashed != 1 {
		t.Errorf("hits, misses, crashed = %d, %d, %d; want 0, 1, 1", s.Hits, s.Misses, s.Crashed)
	}
}

func TestLimitsSelectTheirOwnSandboxes(t *testing.T) {
	pre := &fakePre{}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })
	big := engine.Limits{MemoryBytes: 512 << 20}
	res, err := p.Run(context.Background(), full(engine.Spec{Language: python, Code: "x", Limits: big}))
	if err != nil || res.Stdout != "cold:x" {
		t.Fatalf("Run with other limits = %q, %v; want the cold path", res.Stdout, err)
	}
	if cold.runs.Load() != 1 || statsOf(p, "python").Ready < 1 {
		t.Errorf("the sandbox with the default limits was used for other limits")
	}
	// The output cap is the host's business: any sandbox serves it.
	res, err = p.Run(context.Background(), full(engine.Spec{Language: python, Code: "z", Limits: engine.Limits{OutputBytes: 10}}))
	if err != nil || !strings.HasPrefix(res.Stdout, "warm:") {
		t.Errorf("Run with another output cap = %q, %v; want warm", res.Stdout, err)
	}
	// The new limits get a pool of their own.
	eventually(t, "two ready", func() bool { return statsOf(p, "python").Ready == 2 })
	res, err = p.Run(context.Background(), full(engine.Spec{Language: python, Code: "y", Limits: big}))
	if err != nil || !strings.HasPrefix(res.Stdout, "warm:") {
		t.Errorf("second Run with other limits = %q, %v; want warm", res.Stdout, err)
	}
}

func TestShrinksWhenIdle(t *testing.T) {
	pre := &fakePre{gate: make(chan struct{})}
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}, Min: 1, Max: 4, Parallel: 4, ShrinkEvery: time.Hour})
	for range 4 {
		run(t, p, python, "x") // misses: python's target grows to 4, node's to 2
	}
	run(t, p, node, "y")
	run(t, p, node, "y")
	close(pre.gate)
	eventually(t, "full", func() bool { return statsOf(p, "python").Ready == 4 && statsOf(p, "javascript").Ready == 2 })

	p.shrink() // the period that had the misses: keeps its size
	if s := statsOf(p, "python"); s.Target != 4 {
		t.Fatalf("after a busy period target = %d; want 4", s.Target)
	}
	for i, want := range []int{3, 2, 1, 1, 1} {
		p.shrink()
		if s := statsOf(p, "python"); s.Target != want || s.Ready != want {
			t.Errorf("idle period %d: target, ready = %d, %d; want %d (down to Min)", i+1, s.Target, s.Ready, want)
		}
	}
	if s := statsOf(p, "javascript"); s.Target != 0 || s.Ready != 0 {
		t.Errorf("javascript (not configured) after idle periods: %+v; want nothing left", s)
	}
	p.mu.Lock()
	n := len(p.buckets)
	p.mu.Unlock()
	if n != 1 {
		t.Errorf("buckets = %d; want only the configured one left", n)
	}
}

func TestBusyPoolWithSpareSandboxesShrinks(t *testing.T) {
	pre := &fakePre{}
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}, Min: 3, Max: 3, ShrinkEvery: time.Hour})
	eventually(t, "full", func() bool { return statsOf(p, "python").Ready == 3 })
	p.shrink() // start a period with the pool full
	run(t, p, python, "x")
	eventually(t, "refilled", func() bool { return statsOf(p, "python").Ready == 3 })
	p.shrink()
	if s := statsOf(p, "python"); s.Target != 3 {
		t.Errorf("target = %d; Min 3 is a floor", s.Target)
	}
}

func TestMemoryBudget(t *testing.T) {
	pre := &fakePre{mem: 100 << 20}
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python, node}, Min: 4, Max: 4, MemoryBytes: 350 << 20, Parallel: 1})
	eventually(t, "budget used", func() bool {
		return statsOf(p, "python").Ready+statsOf(p, "javascript").Ready == 3
	})
	p.fill()
	var mem int64
	for _, s := range p.Stats() {
		mem += s.MemoryBytes
	}
	if mem > 350<<20 || pre.calls.Load() != 3 {
		t.Errorf("memory %d MiB after %d pre-starts; want 3 sandboxes within 350 MiB", mem>>20, pre.calls.Load())
	}
}

func TestUnsupportedLanguageRunsCold(t *testing.T) {
	pre := &fakePre{err: fmt.Errorf("bash: %w", ErrUnsupported)}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "marked unsupported", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, b := range p.buckets {
			return b.unsupported
		}
		return false
	})
	for range 3 {
		if res := run(t, p, python, "x"); res.Stdout != "cold:x" {
			t.Errorf("stdout = %q; want cold", res.Stdout)
		}
	}
	if n := pre.calls.Load(); n != 1 {
		t.Errorf("pre-starts = %d; want 1: an unsupported language is not retried", n)
	}
	if cold.runs.Load() != 3 || statsOf(p, "python").Misses != 3 {
		t.Errorf("cold runs %d, stats %+v", cold.runs.Load(), statsOf(p, "python"))
	}
}

func TestFailedPrestartBacksOff(t *testing.T) {
	pre := &fakePre{err: errors.New("runtime broke")}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}, Now: clock})
	eventually(t, "first failure", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return pre.calls.Load() == 1 && p.starting == 0
	})
	if wait := p.fill(); wait != time.Second || pre.calls.Load() != 1 {
		t.Errorf("fill after a failure: retry in %v, %d pre-starts; want 1s and no new attempt", wait, pre.calls.Load())
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	p.fill()
	eventually(t, "second attempt", func() bool { return pre.calls.Load() == 2 })
	eventually(t, "second failure", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.starting == 0
	})
	if wait := p.fill(); wait != 2*time.Second {
		t.Errorf("after two failures: retry in %v; want 2s", wait)
	}
}

func TestCloseDiscardsEverything(t *testing.T) {
	pre := &fakePre{}
	cold := &fakeCold{}
	p := New(cold, pre, sized(Options{Languages: []engine.Language{python, node}, Min: 2, Parallel: 2}))
	eventually(t, "full", func() bool { return statsOf(p, "python").Ready == 2 && statsOf(p, "javascript").Ready == 2 })
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, w := range pre.sandboxes() {
		if _, d := w.counts(); d == 0 {
			t.Errorf("sandbox %s not discarded by Close", w.id)
		}
	}
	if _, err := p.Run(context.Background(), full(engine.Spec{Language: python})); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v; want ErrClosed", err)
	}
	if n, err := p.Reap(context.Background()); n != 7 || err != nil {
		t.Errorf("Reap = %d, %v; want the base driver's", n, err)
	}
}

func TestCloseCancelsPrestartsInFlight(t *testing.T) {
	pre := &fakePre{gate: make(chan struct{})} // never opened
	p := New(&fakeCold{}, pre, sized(Options{Languages: []engine.Language{python}}))
	eventually(t, "starting", func() bool { return statsOf(p, "python").Starting == 1 })
	done := make(chan error)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a pre-start that never ends")
	}
}

func TestWriteMetrics(t *testing.T) {
	pre := &fakePre{mem: 1000}
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })
	run(t, p, python, "x")
	eventually(t, "refilled", func() bool { return statsOf(p, "python").Ready == 1 })
	var b bytes.Buffer
	p.WriteMetrics(&b)
	var got []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "vertal_pool_") {
			got = append(got, l)
		}
	}
	want := []string{
		`vertal_pool_ready{language="python"} 1`,
		`vertal_pool_starting{language="python"} 0`,
		`vertal_pool_in_use{language="python"} 0`,
		`vertal_pool_target{language="python"} 1`,
		`vertal_pool_memory_bytes{language="python"} 1000`,
		`vertal_pool_hits_total{language="python"} 1`,
		`vertal_pool_misses_total{language="python"} 0`,
		`vertal_pool_bypassed_total{language="python"} 0`,
		`vertal_pool_crashed_total{language="python"} 0`,
		`vertal_pool_outdated_total{language="python"} 0`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if !strings.Contains(b.String(), "# TYPE vertal_pool_hits_total counter") {
		t.Errorf("metrics lack TYPE lines:\n%s", b.String())
	}
}

func TestOldSandboxesAreReplaced(t *testing.T) {
	pre := &fakePre{}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p, _ := newTestPool(t, pre, Options{Languages: []engine.Language{python}, MaxIdle: time.Minute, ShrinkEvery: time.Hour, Now: clock})
	eventually(t, "one ready", func() bool { return statsOf(p, "python").Ready == 1 })
	p.shrink()
	if n := len(pre.sandboxes()); n != 1 {
		t.Fatalf("a young sandbox was replaced (%d pre-starts)", n)
	}
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	p.shrink()
	eventually(t, "replacement ready", func() bool { return len(pre.sandboxes()) == 2 && statsOf(p, "python").Ready == 1 })
	// The old sandbox is discarded in the background, maybe after its
	// replacement is ready.
	eventually(t, "the old sandbox discarded", func() bool { _, d := pre.sandboxes()[0].counts(); return d == 1 })
	if res := run(t, p, python, "x"); res.Stdout != "warm:w2:x" {
		t.Errorf("stdout = %q; want the fresh sandbox", res.Stdout)
	}
}

// TestRunRefusesAnIncompleteSpec: the pool fills nothing in; a Spec
// without a timeout or a limit is refused before it reaches a sandbox.
func TestRunRefusesAnIncompleteSpec(t *testing.T) {
	pre := &fakePre{}
	p, cold := newTestPool(t, pre, Options{Languages: []engine.Language{python}})
	for _, spec := range []engine.Spec{
		{ID: "exe_1", Language: python, Code: "x", Limits: testLimits},
		{ID: "exe_2", Language: python, Code: "x", Timeout: time.Second},
	} {
		if _, err := p.Run(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "exe_") {
			t.Errorf("Run(%s) = %v; want a refusal naming the execution", spec.ID, err)
		}
	}
	if n := cold.runs.Load(); n != 0 {
		t.Errorf("cold runs = %d; want none", n)
	}
}
