package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLimitsWithDefaults(t *testing.T) {
	got := Limits{MemoryBytes: 512 << 20}.WithDefaults(3 * time.Second)
	want := Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 64, FileSizeBytes: 1 << 20, TmpBytes: 16 << 20, OutputBytes: 64 << 10,
		WorkdirBytes: 16 << 20, ReturnFiles: 20, ReturnBytes: 10 << 20, Lifetime: 8 * time.Second}
	if got != want {
		t.Fatalf("WithDefaults() = %+v, want %+v", got, want)
	}
	if d := DefaultLimits(3 * time.Second); d != (Limits{MemoryBytes: DefaultMemoryBytes}).WithDefaults(3*time.Second) {
		t.Fatalf("DefaultLimits = %+v, not every default", d)
	}
	if err := DefaultLimits(time.Second).Validate(); err != nil {
		t.Fatalf("DefaultLimits does not validate: %v", err)
	}
}

func TestSpecValidate(t *testing.T) {
	full := Spec{ID: "exe_1", Timeout: time.Second, Limits: DefaultLimits(time.Second)}
	for _, tc := range []struct {
		name   string
		change func(s *Spec)
		want   string // "" means valid
	}{
		{"complete", func(*Spec) {}, ""},
		{"no timeout", func(s *Spec) { s.Timeout = 0 }, "has no timeout"},
		{"negative timeout", func(s *Spec) { s.Timeout = -time.Second }, "has no timeout"},
		{"no memory", func(s *Spec) { s.Limits.MemoryBytes = 0 }, "MemoryBytes is not set"},
		{"no cpus", func(s *Spec) { s.Limits.CPUs = 0 }, "CPUs is not set"},
		{"no output cap", func(s *Spec) { s.Limits.OutputBytes = 0 }, "OutputBytes is not set"},
		{"no lifetime", func(s *Spec) { s.Limits.Lifetime = 0 }, "Lifetime is not set"},
		{"lifetime under timeout", func(s *Spec) { s.Timeout = time.Minute }, "shorter than its timeout"},
		{"no limits at all", func(s *Spec) { s.Limits = Limits{} }, "is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := full
			tc.change(&s)
			err := s.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// newEngine is New for a test, which fails if opts are refused.
func newEngine(t *testing.T, d Driver, opts Options) *Engine {
	t.Helper()
	e, err := New(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// New takes the queue options as given: config decides the defaults, so
// one left unset is refused, not filled in.
func TestNewRefusesIncompleteOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"none", Options{}},
		{"no slots", Options{MaxQueue: 4, QueueTimeout: time.Second}},
		{"negative slots", Options{MaxConcurrent: -1, MaxQueue: 4, QueueTimeout: time.Second}},
		{"no queue", Options{MaxConcurrent: 1, QueueTimeout: time.Second}},
		{"no queue timeout", Options{MaxConcurrent: 1, MaxQueue: 4}},
		{"negative queue timeout", Options{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if e, err := New(&blockingDriver{}, tc.opts); err == nil {
				t.Fatalf("New(%+v) = %+v, want an error", tc.opts, e.opts)
			}
		})
	}
}

// blockingDriver holds every Run until release is closed.
type blockingDriver struct {
	release chan struct{}
	mu      sync.Mutex
	specs   []Spec
}

func (d *blockingDriver) Run(ctx context.Context, s Spec) (Result, error) {
	d.mu.Lock()
	d.specs = append(d.specs, s)
	d.mu.Unlock()
	select {
	case <-d.release:
		return Result{Status: StatusSucceeded}, nil
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}
func (d *blockingDriver) Reap(context.Context) (int, error) { return 0, nil }
func (d *blockingDriver) Name() string                      { return "blocking" }

func TestEngineBusyWhenQueueFull(t *testing.T) {
	d := &blockingDriver{release: make(chan struct{})}
	e := newEngine(t, d, Options{MaxConcurrent: 1, MaxQueue: 1, QueueTimeout: time.Hour})
	done := make(chan error, 2)
	go func() { _, err := e.Run(context.Background(), Spec{}); done <- err }()
	waitFor(t, func() bool { return e.Stats().Running == 1 })
	go func() { _, err := e.Run(context.Background(), Spec{}); done <- err }()
	waitFor(t, func() bool { return e.Stats().Waiting == 1 })

	// The queue is full: the third caller is refused at once, not after
	// the hour-long queue timeout.
	if _, err := e.Run(context.Background(), Spec{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("third Run error = %v, want ErrBusy", err)
	}
	close(d.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("queued Run: %v", err)
		}
	}
	if s := e.Stats(); s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("after all runs: %+v", s)
	}
}

func TestEngineQueueTimeout(t *testing.T) {
	d := &blockingDriver{release: make(chan struct{})}
	defer close(d.release)
	e := newEngine(t, d, Options{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 10 * time.Millisecond})
	go e.Run(context.Background(), Spec{})
	waitFor(t, func() bool { return e.Stats().Running == 1 })
	if _, err := e.Run(context.Background(), Spec{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("Run error = %v, want ErrBusy after the queue timeout", err)
	}
}

func TestEngineCancelledWaiterLeavesQueue(t *testing.T) {
	d := &blockingDriver{release: make(chan struct{})}
	defer close(d.release)
	e := newEngine(t, d, Options{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Hour})
	go e.Run(context.Background(), Spec{})
	waitFor(t, func() bool { return e.Stats().Running == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := e.Run(ctx, Spec{}); errc <- err }()
	waitFor(t, func() bool { return e.Stats().Waiting == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run error = %v, want context.Canceled", err)
	}
	if w := e.Stats().Waiting; w != 0 {
		t.Fatalf("Waiting = %d after cancel, want 0", w)
	}
}

// The engine passes the Spec on as given: the defaults were applied
// where the request became a Spec, and nothing below fills one in.
func TestExecutePassesSpecAsGiven(t *testing.T) {
	d := &blockingDriver{release: make(chan struct{})}
	close(d.release)
	e := newEngine(t, d, Options{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: 30 * time.Second})
	for _, spec := range []Spec{
		{ID: "exe_1"},
		{ID: "exe_2", Timeout: 3 * time.Second, Limits: Limits{MemoryBytes: 1 << 30}},
	} {
		if _, err := e.Run(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []Spec{{ID: "exe_1"}, {ID: "exe_2", Timeout: 3 * time.Second, Limits: Limits{MemoryBytes: 1 << 30}}} {
		if got := d.specs[i]; got.ID != want.ID || got.Timeout != want.Timeout || got.Limits != want.Limits {
			t.Fatalf("driver saw %s timeout %v limits %+v; want the Spec as given, %+v", got.ID, got.Timeout, got.Limits, want)
		}
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	e := newEngine(t, &blockingDriver{}, Options{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: 30 * time.Second})
	release, err := e.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	release()
	release() // a second call must not free a slot someone else holds
	r2, err := e.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer r2()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.Acquire(ctx); err == nil {
		t.Fatal("a second slot was handed out with MaxConcurrent 1")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestAdmitFairness: a tenant that saturates its share neither holds the
// slots another tenant may use nor keeps them when a slot frees up; the
// slots go round the waiting tenants in turn.
func TestAdmitFairness(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, &blockingDriver{}, Options{MaxConcurrent: 3, MaxQueue: 12, QueueTimeout: time.Minute})
	admit := func(tenant string, limit int) (func(), error) {
		return e.Admit(ctx, Admission{Tenant: tenant, Limit: limit})
	}
	// a holds its whole share (2 of 3 slots) and queues more.
	var aSlots []func()
	for range 2 {
		r, err := admit("a", 2)
		if err != nil {
			t.Fatal(err)
		}
		aSlots = append(aSlots, r)
	}
	var wg sync.WaitGroup
	wait := func(tenant string, limit int) {
		wg.Go(func() {
			r, err := admit(tenant, limit)
			if err != nil {
				t.Error(err)
				return
			}
			r()
		})
	}
	for i := range 3 {
		wait("a", 2)
		waitFor(t, func() bool { return e.Stats().Waiting == i+1 })
	}
	// The third slot is free and a may not take it: b gets it at once.
	rb, err := admit("b", 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Stats{MaxConcurrent: 3, Running: 3, Waiting: 3}, e.Stats()); diff != "" {
		t.Fatalf("Stats (-want +got):\n%s", diff)
	}
	// b, at its limit too, queues behind a; every waiter is served once
	// the slots are freed (TestAdmitTurns checks in which order).
	wait("b", 1)
	waitFor(t, func() bool { return e.Stats().Waiting == 4 })
	rb()
	for _, r := range aSlots {
		r()
	}
	wg.Wait()
	if diff := cmp.Diff(Stats{MaxConcurrent: 3}, e.Stats()); diff != "" {
		t.Errorf("Stats after all released (-want +got):\n%s", diff)
	}
}

// TestAdmitTurns checks the order in which waiting tenants are served,
// one slot at a time.
func TestAdmitTurns(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, &blockingDriver{}, Options{MaxConcurrent: 1, MaxQueue: 10, QueueTimeout: time.Minute})
	first, err := e.Admit(ctx, Admission{Tenant: "a", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan string)
	arrivals := []string{"a", "a", "a", "b", "c", "b"}
	for i, tenant := range arrivals {
		go func() {
			r, err := e.Admit(ctx, Admission{Tenant: tenant, Limit: 1})
			if err != nil {
				t.Error(err)
				granted <- "error"
				return
			}
			granted <- tenant
			// The test releases the slot by reading the next grant.
			<-granted
			r()
		}()
		waitFor(t, func() bool { return e.Stats().Waiting == i+1 })
	}
	first()
	var got []string
	for range arrivals {
		tenant := <-granted
		got = append(got, tenant)
		granted <- "release"
	}
	want := []string{"a", "b", "c", "a", "b", "a"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order served (-want +got):\n%s", diff)
	}
}

// TestAdmitTenantQueueShare: a tenant gets 4 queue places per slot of its
// limit; beyond them it is refused while others still queue.
func TestAdmitTenantQueueShare(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// 4 queue places per slot: MaxQueue / MaxConcurrent.
	e := newEngine(t, &blockingDriver{}, Options{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: time.Minute})
	for _, tenant := range []string{"a", "c"} {
		r, err := e.Admit(ctx, Admission{Tenant: tenant, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer r()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range 4 {
		wg.Go(func() { _, _ = e.Admit(ctx, Admission{Tenant: "a", Limit: 1}) })
		waitFor(t, func() bool { return e.Stats().Waiting == i+1 })
	}
	if _, err := e.Admit(ctx, Admission{Tenant: "a", Limit: 1}); !errors.Is(err, ErrBusy) {
		t.Errorf("fifth queue place of a: err = %v, want ErrBusy", err)
	}
	wg.Go(func() { _, _ = e.Admit(ctx, Admission{Tenant: "b", Limit: 1}) })
	waitFor(t, func() bool { return e.Stats().Waiting == 5 })
}

// TestAdmitNodeShare: a plan's share may exceed the node's (a pro plan's 4
// slots and 16 queue places on a 2-slot, 8-place node). Each case fills
// the node with holders and waiters, then a newcomer arrives; the test
// checks what the newcomer gets, whose waiter was refused to make room,
// and which tenant the next freed slot goes to.
func TestAdmitNodeShare(t *testing.T) {
	type group struct {
		tenant string
		limit  int
		n      int
	}
	for _, tc := range []struct {
		name             string
		slots, queue     int
		running, waiting []group
		newcomer         group  // n unused
		want             string // "run", "queue" or "busy"
		wantEvicted      []string
		wantNext         string // who gets the slot freed first; "" to skip
	}{
		{
			name:  "pro tenant fills a small node, newcomer takes a place and the next slot",
			slots: 2, queue: 8,
			running:  []group{{"a", 4, 2}},
			waiting:  []group{{"a", 4, 8}},
			newcomer: group{"b", 4, 0},
			want:     "queue", wantEvicted: []string{"a"}, wantNext: "b",
		},
		{
			name:  "heavy tenant is refused once others are active",
			slots: 2, queue: 8,
			running:  []group{{"a", 4, 1}, {"b", 4, 1}},
			waiting:  []group{{"a", 4, 4}},
			newcomer: group{"a", 4, 0},
			want:     "busy",
		},
		{
			name:  "alone, a tenant may use the whole queue",
			slots: 2, queue: 8,
			running:  []group{{"a", 4, 2}},
			waiting:  []group{{"a", 4, 7}},
			newcomer: group{"a", 4, 0},
			want:     "queue",
		},
		{
			name:  "plan share still bounds a tenant below the node's",
			slots: 2, queue: 8,
			running:  []group{{"a", 1, 1}},
			waiting:  []group{{"a", 1, 4}},
			newcomer: group{"a", 1, 0},
			want:     "busy",
		},
		{
			name:  "a third tenant takes the newest place of one above its share",
			slots: 2, queue: 4,
			running:  []group{{"a", 4, 1}, {"b", 4, 1}},
			waiting:  []group{{"a", 4, 2}, {"b", 4, 2}},
			newcomer: group{"c", 4, 0},
			// a's slot frees: a and c hold none, a waited longer.
			want: "queue", wantEvicted: []string{"a"}, wantNext: "a",
		},
		{
			name:  "at one place each, a full queue refuses the newcomer",
			slots: 1, queue: 2,
			running:  []group{{"a", 1, 1}},
			waiting:  []group{{"b", 1, 1}, {"c", 1, 1}},
			newcomer: group{"d", 1, 0},
			want:     "busy",
		},
		{
			name:  "a free slot the heavy tenant may not take goes to the newcomer",
			slots: 3, queue: 8,
			running:  []group{{"a", 2, 2}},
			waiting:  []group{{"a", 2, 3}},
			newcomer: group{"b", 1, 0},
			want:     "run",
		},
		{
			name:  "the freed slot goes to the tenant holding fewest, not the first in turn",
			slots: 2, queue: 8,
			running:  []group{{"a", 4, 2}},
			waiting:  []group{{"a", 4, 2}},
			newcomer: group{"b", 4, 0},
			want:     "queue", wantNext: "b",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			e := newEngine(t, &blockingDriver{}, Options{MaxConcurrent: tc.slots, MaxQueue: tc.queue, QueueTimeout: time.Minute})
			var mu sync.Mutex
			var held []func()
			hold := func(r func()) { mu.Lock(); held = append(held, r); mu.Unlock() }
			for _, g := range tc.running {
				for range g.n {
					r, err := e.Admit(ctx, Admission{Tenant: g.tenant, Limit: g.limit})
					if err != nil {
						t.Fatal(err)
					}
					hold(r)
				}
			}
			type outcome struct {
				tenant string
				err    error
			}
			results := make(chan outcome, 64)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			wait := func(g group) {
				wg.Go(func() {
					r, err := e.Admit(ctx, Admission{Tenant: g.tenant, Limit: g.limit})
					if err == nil {
						hold(r)
					}
					results <- outcome{g.tenant, err}
				})
			}
			queued := 0
			for _, g := range tc.waiting {
				for range g.n {
					wait(g)
					queued++
					waitFor(t, func() bool { return e.Stats().Waiting == queued })
				}
			}
			before := e.Stats()
			got := ""
			nc := make(chan error, 1)
			wg.Go(func() {
				r, err := e.Admit(ctx, Admission{Tenant: tc.newcomer.tenant, Limit: tc.newcomer.limit})
				if err == nil {
					hold(r)
				}
				nc <- err
			})
			waitFor(t, func() bool {
				s := e.Stats()
				return s.Running > before.Running || s.Waiting > before.Waiting || len(nc) > 0 || len(results) > 0
			})
			var evicted []string
			select {
			case err := <-nc:
				switch {
				case err == nil:
					got = "run"
				case errors.Is(err, ErrBusy):
					got = "busy"
				default:
					t.Fatal(err)
				}
			default:
				got = "queue"
				// Room was made by refusing someone, or there was room.
				waitFor(t, func() bool { return e.Stats().Waiting >= before.Waiting })
				for len(results) > 0 {
					o := <-results
					if !errors.Is(o.err, ErrBusy) {
						t.Fatalf("waiter of %s: %v, want ErrBusy", o.tenant, o.err)
					}
					evicted = append(evicted, o.tenant)
				}
			}
			if got != tc.want {
				t.Fatalf("newcomer got %q, want %q", got, tc.want)
			}
			if diff := cmp.Diff(tc.wantEvicted, evicted); diff != "" {
				t.Errorf("refused waiters (-want +got):\n%s", diff)
			}
			if tc.wantNext != "" {
				mu.Lock()
				r := held[0]
				held = held[1:]
				mu.Unlock()
				r()
				next := ""
				select {
				case err := <-nc:
					if err != nil {
						t.Fatal(err)
					}
					next = tc.newcomer.tenant
				case o := <-results:
					next = o.tenant
				}
				if next != tc.wantNext {
					t.Errorf("freed slot went to %s, want %s", next, tc.wantNext)
				}
			}
			mu.Lock()
			for _, r := range held {
				r()
			}
			held = nil
			mu.Unlock()
		})
	}
}
