package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name    string
		text    string
		want    CPUTicks
		busy    uint64
		wantErr string
	}{
		{
			name: "kernel 6 with guest fields",
			text: "cpu  798773 23250 340591 1182256 5728 0 5502 463 0 0\n" +
				"cpu0 399308 10708 167386 598061 1705 0 776 214 0 0\n" +
				"cpu1 399464 12542 173204 584195 4022 0 4725 249 0 0\n" +
				"intr 123 0 0\nctxt 456\nbtime 1764580000\n",
			want: CPUTicks{User: 798773, Nice: 23250, System: 340591, Idle: 1182256, IOWait: 5728, SoftIRQ: 5502, Steal: 463},
			busy: 798773 + 23250 + 340591 + 5502 + 463,
		},
		{
			name: "guest time is not counted twice",
			text: "cpu  100 20 30 1000 7 1 2 3 50 10\n",
			want: CPUTicks{User: 100, Nice: 20, System: 30, Idle: 1000, IOWait: 7, IRQ: 1, SoftIRQ: 2, Steal: 3},
			busy: 156,
		},
		{
			name: "old kernel, four fields",
			text: "cpu 10 2 3 400\ncpu0 10 2 3 400\n",
			want: CPUTicks{User: 10, Nice: 2, System: 3, Idle: 400},
			busy: 15,
		},
		{
			name: "aggregate line not first",
			text: "cpu0 1 1 1 1 1 1 1 1\ncpu 5 0 5 90 9 0 0 0\n",
			want: CPUTicks{User: 5, System: 5, Idle: 90, IOWait: 9},
			busy: 10,
		},
		{name: "only per-CPU lines", text: "cpu0 1 2 3 4\ncpu1 1 2 3 4\n", wantErr: `no aggregate "cpu" line`},
		{name: "empty", text: "", wantErr: `no aggregate "cpu" line`},
		{name: "too few fields", text: "cpu 1 2 3\n", wantErr: "3 fields, want at least 4"},
		{name: "not a number", text: "cpu 1 2 x 4\n", wantErr: "cpu field 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProcStat(strings.NewReader(tc.text))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if got.BusyTicks() != tc.busy {
				t.Errorf("busy = %d ticks; want %d", got.BusyTicks(), tc.busy)
			}
		})
	}
}

func TestBusyDuration(t *testing.T) {
	ticks := CPUTicks{User: 150, System: 50, Idle: 1 << 40, IOWait: 1 << 30}
	for _, tc := range []struct {
		hz   int64
		want time.Duration
	}{
		{100, 2 * time.Second},
		{250, 800 * time.Millisecond},
		{0, 2 * time.Second}, // unknown: the Linux ABI's 100
	} {
		if got := ticks.Busy(tc.hz); got != tc.want {
			t.Errorf("Busy(%d) = %v; want %v", tc.hz, got, tc.want)
		}
	}
}

func TestAuxvValue(t *testing.T) {
	auxv := func(pairs ...uint64) []byte {
		var b []byte
		for _, v := range pairs {
			b = binary.NativeEndian.AppendUint64(b, v)
		}
		return b
	}
	for _, tc := range []struct {
		name   string
		auxv   []byte
		want   uint64
		wantOK bool
	}{
		{"present", auxv(33, 0x7fff, 6, 4096, 17, 100, 3, 0x5555, 0, 0), 100, true},
		{"after AT_NULL is not read", auxv(6, 4096, 0, 0, 17, 100), 0, false},
		{"absent", auxv(6, 4096, 0, 0), 0, false},
		{"truncated", auxv(6, 4096, 17)[:20], 0, false},
		{"empty", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := AuxvValue(tc.auxv, atClkTck)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("= %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// The host's own counters move forward and USER_HZ comes out of the
// auxiliary vector.
func TestHostCPU(t *testing.T) {
	h := NewHostCPU()
	if h.Hz <= 0 {
		t.Fatalf("Hz = %d", h.Hz)
	}
	m0, err := h.Machine()
	if err != nil {
		t.Fatal(err)
	}
	s0, err := h.Self()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	m1, _ := h.Machine()
	s1, _ := h.Self()
	if m1 < m0 || s1 <= s0 {
		t.Errorf("machine %v → %v, self %v → %v: want both to grow", m0, m1, s0, s1)
	}
	if _, err := (HostCPU{Stat: "/nonexistent/stat", Hz: 100}).Machine(); err == nil {
		t.Error("missing /proc/stat: want an error")
	}
}

// fakeCPU is a machine whose only CPU use is what the fake targets charge.
type fakeCPU struct {
	machine, self atomic.Int64
	fail          atomic.Bool
}

func (f *fakeCPU) Machine() (time.Duration, error) {
	if f.fail.Load() {
		return 0, errors.New("no /proc")
	}
	return time.Duration(f.machine.Load()), nil
}

func (f *fakeCPU) Self() (time.Duration, error) { return time.Duration(f.self.Load()), nil }

func (f *fakeCPU) charge(machine, self time.Duration) {
	f.machine.Add(int64(machine))
	f.self.Add(int64(self))
}

// Each target is charged only for the CPU spent during its own blocks:
// interleaved rounds of other targets and the unmeasured warm-up do not
// leak into it, and the total is divided by its successful executions.
func TestRunAccountsCPUPerTarget(t *testing.T) {
	cpu := &fakeCPU{}
	mk := func(name string, machine, self time.Duration, failEvery int) Target {
		var n atomic.Int64
		return Target{Name: name, Bare: name == "bare", Run: func(context.Context, string) error {
			cpu.charge(machine, self)
			if failEvery > 0 && n.Add(1)%int64(failEvery) == 0 {
				return errors.New("failed")
			}
			return nil
		}}
	}
	targets := []Target{
		mk("bare", 2*time.Millisecond, 500*time.Microsecond, 0),
		mk("oci/crun", 15*time.Millisecond, 3*time.Millisecond, 0),
		// Every fourth fails: its CPU still counts, divided by the three
		// that succeeded.
		mk("flaky", 9*time.Millisecond, time.Millisecond, 4),
	}
	rows := Run(context.Background(), targets, nil, Options{N: 8, Rounds: 4, Warmup: 2, Parallel: []int{1, 2}, Langs: []string{"bash"}, CPU: cpu})
	want := map[string][2]time.Duration{
		"bare":     {2 * time.Millisecond, 500 * time.Microsecond},
		"oci/crun": {15 * time.Millisecond, 3 * time.Millisecond},
		"flaky":    {12 * time.Millisecond, time.Millisecond * 4 / 3},
	}
	for _, r := range rows {
		for _, s := range r.Stats {
			w := want[r.Target]
			if !s.HasCPU || s.CPU != w[0] || s.SelfCPU != w[1] {
				t.Errorf("%s ×%d: CPU %v (self %v, measured %v); want %v (self %v)", r.Target, s.Parallel, s.CPU, s.SelfCPU, s.HasCPU, w[0], w[1])
			}
		}
	}
}

// A target that keeps working after it answered (a warm pool refilling)
// is charged for that work when its CPUTail covers it, and the next
// target is not.
func TestRunCPUTail(t *testing.T) {
	cpu := &fakeCPU{}
	refill := Target{Name: "api", CPUTail: 200 * time.Millisecond, Run: func(context.Context, string) error {
		time.AfterFunc(5*time.Millisecond, func() { cpu.charge(10*time.Millisecond, 0) })
		return nil
	}}
	bare := Target{Name: "bare", Bare: true, Run: func(context.Context, string) error { cpu.charge(time.Millisecond, 0); return nil }}
	rows := Run(context.Background(), []Target{refill, bare}, nil, Options{N: 4, Rounds: 2, Parallel: []int{1}, Langs: []string{"bash"}, CPU: cpu})
	if got := rows[0].Stats[0].CPU; got != 10*time.Millisecond {
		t.Errorf("api CPU/exec = %v; want 10ms, the refill included", got)
	}
	if got := rows[1].Stats[0].CPU; got != time.Millisecond {
		t.Errorf("bare CPU/exec = %v; want 1ms, none of the refill", got)
	}
}

// An idle check ends the tail as soon as the target's leftover work is
// done, so an idle machine's background is not charged for the rest.
func TestRunCPUTailEndsWhenIdle(t *testing.T) {
	cpu := &fakeCPU{}
	var pending atomic.Int64
	var checks atomic.Int64
	api := Target{Name: "api", CPUTail: 10 * time.Second,
		Idle: func(context.Context) (bool, error) {
			if checks.Add(1) == 1 {
				return false, errors.New("metrics not up yet") // not an answer: keep waiting
			}
			return pending.Load() == 0, nil
		},
		Run: func(context.Context, string) error {
			pending.Add(1)
			time.AfterFunc(20*time.Millisecond, func() { cpu.charge(10*time.Millisecond, 0); pending.Add(-1) })
			return nil
		}}
	began := time.Now()
	rows := Run(context.Background(), []Target{api}, nil, Options{N: 3, Rounds: 1, Parallel: []int{1}, Langs: []string{"bash"}, CPU: cpu})
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("took %v: the idle check did not end the 10 s tail", d)
	}
	if got := rows[0].Stats[0].CPU; got != 10*time.Millisecond {
		t.Errorf("CPU/exec = %v; want 10ms, the leftover work included", got)
	}
}

func TestBackground(t *testing.T) {
	cpu := &fakeCPU{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // one CPU's worth of busy time, charged every millisecond
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				cpu.charge(time.Millisecond, 0)
			}
		}
	}()
	got, err := Background(context.Background(), cpu, 200*time.Millisecond)
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	// time.After sleeps at least a millisecond, so at most one CPU.
	if got <= 0.2 || got > 1.05 {
		t.Errorf("background = %.2f CPUs; want up to 1", got)
	}
	cpu.fail.Store(true)
	if _, err := Background(context.Background(), cpu, time.Millisecond); err == nil {
		t.Error("failing counters: want an error")
	}
}

// Without counters nothing is claimed; a counter that fails says so
// instead of showing a number.
func TestRunCPUUnavailable(t *testing.T) {
	ok := Target{Name: "bare", Bare: true, Run: func(context.Context, string) error { return nil }}
	rows := Run(context.Background(), []Target{ok}, nil, Options{N: 2, Parallel: []int{1}, Langs: []string{"bash"}})
	if s := rows[0].Stats[0]; s.HasCPU || s.CPUErr != "" {
		t.Errorf("no counters: %+v", s)
	}
	cpu := &fakeCPU{}
	cpu.fail.Store(true)
	rows = Run(context.Background(), []Target{ok}, nil, Options{N: 2, Parallel: []int{1}, Langs: []string{"bash"}, CPU: cpu})
	if s := rows[0].Stats[0]; s.HasCPU || !strings.Contains(s.CPUErr, "no /proc") {
		t.Errorf("failing counters: %+v", s)
	}
}
