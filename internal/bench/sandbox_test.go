package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/client"
)

// fakeSandboxes is a SandboxAPI holding up to limit sandboxes, logging
// every call.
type fakeSandboxes struct {
	mu    sync.Mutex
	limit int
	next  int
	live  map[string]bool
	calls []string
	out   string // what a command prints; "" is "1\n"
}

// recorder is a step that records name in f's calls and counts itself in n.
func (f *fakeSandboxes) recorder(name string, n *int) func(context.Context) error {
	return func(context.Context) error {
		f.mu.Lock()
		f.calls = append(f.calls, name)
		f.mu.Unlock()
		*n++
		return nil
	}
}

func newFake(limit int) *fakeSandboxes { return &fakeSandboxes{limit: limit, live: map[string]bool{}} }

func (f *fakeSandboxes) Create(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "create")
	if len(f.live) >= f.limit {
		return "", &client.Error{StatusCode: 429, Code: "sandbox_limit", Message: fmt.Sprintf("your plan allows %d sandboxes", f.limit)}
	}
	f.next++
	id := fmt.Sprintf("sbx_%08x", f.next)
	f.live[id] = true
	return id, nil
}

func (f *fakeSandboxes) Command(_ context.Context, id, cmd string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cmd == PythonCommand {
		f.calls = append(f.calls, "python")
		return "2\n", nil
	}
	f.calls = append(f.calls, "command")
	if !f.live[id] {
		return "", errors.New("no such sandbox")
	}
	if f.out != "" {
		return f.out, nil
	}
	return "1\n", nil
}

func (f *fakeSandboxes) StartContext(_ context.Context, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "context")
	return "ctx_1", nil
}

func (f *fakeSandboxes) DeleteContext(context.Context, string, string) error { return nil }

func (f *fakeSandboxes) Cell(_ context.Context, id, language, code string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "cell "+language)
	if !f.live[id] {
		return "", errors.New("no such sandbox")
	}
	return "2", nil
}

func (f *fakeSandboxes) Kill(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "kill")
	if !f.live[id] {
		return errors.New("no such sandbox")
	}
	delete(f.live, id)
	return nil
}

// The latency benchmark interleaves bare, command and create blocks,
// times create and delete apart, checks the command's output and leaves
// no sandbox behind.
func TestMeasureSandboxLatency(t *testing.T) {
	f := newFake(2)
	var bareCalls int
	bare := f.recorder("bare", &bareCalls)
	l, err := MeasureSandboxLatency(context.Background(), f, nil, nil, nil, bare, 3, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]Stats{"bare": l.Bare, "command": l.Command, "create": l.Create, "delete": l.Delete, "python": l.PythonCommand, "cell": l.Cell} {
		if s.N != 3 || s.Errors != 0 || s.P50 <= 0 {
			t.Errorf("%s: %+v", name, s)
		}
	}
	// Round one: 2 of each plus a warm-up of each; round two: 1 of each.
	want := []string{"create", // the live sandbox for the commands
		"cell python", "cell javascript", // its contexts' start
		"bare", "bare", "bare", "command", "command", "command", "python", "python", "python",
		"cell python", "cell python", "cell python", "cell javascript", "cell javascript", "cell javascript",
		"context", "context", "context",
		"create", "kill", "create", "kill", "create", "kill",
		"bare", "command", "python", "cell python", "cell javascript", "context", "create", "kill",
		"kill"} // the live one
	if diff := cmp.Diff(want, f.calls); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if len(f.live) != 0 {
		t.Errorf("left behind: %v", f.live)
	}

	// With the pool: waitWarm before every create of api (untimed), and
	// the cold server's creates and deletes after them in each round.
	f, cold := newFake(2), newFake(2)
	waits := 0
	waitWarm := f.recorder("wait", &waits)
	l, err = MeasureSandboxLatency(context.Background(), f, cold, nil, waitWarm, bare, 2, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if waits != 2 || l.Create.N != 2 || l.ColdCreate.N != 2 || l.ColdCreate.Errors != 0 {
		t.Errorf("waits %d, create %+v, cold %+v", waits, l.Create, l.ColdCreate)
	}
	if got := f.calls[len(f.calls)-7:]; fmt.Sprint(got) != "[wait create kill wait create kill kill]" {
		t.Errorf("calls end with %v", got)
	}
	if fmt.Sprint(cold.calls) != "[create kill create kill]" || len(cold.live) != 0 {
		t.Errorf("the cold server got %v, left %v", cold.calls, cold.live)
	}

	f = newFake(2)
	f.out = "2\n"
	l, err = MeasureSandboxLatency(context.Background(), f, nil, nil, nil, bare, 2, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if l.Command.Errors != 2 || !strings.Contains(l.Command.FirstErr, `"2\n"`) {
		t.Errorf("a wrong output is an error: %+v", l.Command)
	}

	// A create that is refused is an error of the create, and no delete.
	f = newFake(1)
	l, err = MeasureSandboxLatency(context.Background(), f, nil, nil, nil, bare, 2, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if l.Create.Errors != 2 || !strings.Contains(l.Create.FirstErr, "sandbox_limit") || l.Delete.N != 0 {
		t.Errorf("refused creates: create %+v, delete %+v", l.Create, l.Delete)
	}
}

// fakeHost writes a /proc and cgroup tree: one agent per id, each in its
// own v1 memory cgroup with a second process (its bwrap).
func fakeHost(t *testing.T, ids []string, availKB int64) HostProbe {
	t.Helper()
	root := t.TempDir()
	h := HostProbe{Proc: filepath.Join(root, "proc"), Cgroup: filepath.Join(root, "cgroup")}
	write := func(path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(h.Proc, "meminfo"), fmt.Sprintf("MemTotal:       24000000 kB\nMemAvailable:   %d kB\n", availKB))
	// A process of no sandbox, and one whose cmdline only resembles.
	write(filepath.Join(h.Proc, "1", "cmdline"), "/sbin/init\x00")
	write(filepath.Join(h.Proc, "2", "cmdline"), "/usr/bin/vertal\x00serve\x00")
	pid := 100
	for _, id := range ids {
		cg := "/vertal/" + id + "/sandbox"
		agent, wrap := fmt.Sprint(pid), fmt.Sprint(pid+1)
		pid += 2
		write(filepath.Join(h.Proc, agent, "cmdline"), "/.vertal/agent\x00serve\x00--deadline\x001\x00")
		for _, p := range []string{agent, wrap} {
			write(filepath.Join(h.Proc, p, "cgroup"), "10:hugetlb:/\n4:memory:"+cg+"\n0::/\n")
			write(filepath.Join(h.Proc, p, "status"), "Name:\tx\nVmRSS:\t    4096 kB\n")
			write(filepath.Join(h.Proc, p, "smaps_rollup"), "Rss:   4096 kB\nPss:   1024 kB\n")
		}
		write(filepath.Join(h.Cgroup, "memory", cg, "cgroup.procs"), agent+"\n"+wrap+"\n")
		write(filepath.Join(h.Cgroup, "memory", cg, "memory.usage_in_bytes"), "3145728\n")
	}
	return h
}

func TestHostProbeMemory(t *testing.T) {
	h := fakeHost(t, []string{"sbx_aaaaaaaa", "sbx_bbbbbbbb"}, 1000)
	got, err := h.Memory("sbx_bbbbbbbb")
	if err != nil {
		t.Fatal(err)
	}
	want := SandboxMemory{Procs: 2, PSS: 2 << 20, RSS: 8 << 20, Cgroup: 3 << 20}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := h.Memory("sbx_cccccccc"); err == nil || !strings.Contains(err.Error(), "/.vertal/agent") {
		t.Errorf("an unknown sandbox: %v", err)
	}
	if avail, err := h.MemAvailable(); err != nil || avail != 1000<<10 {
		t.Errorf("MemAvailable = %d, %v", avail, err)
	}
}

// On cgroup v2 the usage is memory.current of the unified hierarchy.
func TestMemoryCgroupV2(t *testing.T) {
	root := t.TempDir()
	h := HostProbe{Cgroup: root}
	dir := filepath.Join(root, "unified", "vertal", "sbx_1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.current"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gotDir, file, err := h.memoryCgroup("0::/vertal/sbx_1\n")
	if err != nil || gotDir != dir || file != "memory.current" {
		t.Errorf("memoryCgroup = %q, %q, %v", gotDir, file, err)
	}
	if _, _, err := h.memoryCgroup("0::/elsewhere\n"); err == nil {
		t.Error("no memory.current: want an error")
	}
}

// The fill stops at the tenant's cap, reports what the next create and
// another tenant got, reads every sandbox's memory and kills them all.
func TestFill(t *testing.T) {
	f, other := newFake(3), newFake(1)
	h := fakeHost(t, []string{"sbx_00000001", "sbx_00000002", "sbx_00000003"}, 8<<20)
	c, err := Fill(context.Background(), f, h, FillOptions{N: 3, Other: other, ServerRSS: func() (int64, error) { return 50 << 20, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if c.Held != 3 || c.Stopped != "" || c.Unread != 0 || c.Sum.Procs != 6 || c.Sum.PSS != 6<<20 || c.Create.N != 3 {
		t.Errorf("capacity %+v", c)
	}
	if !strings.HasPrefix(c.Next, "429 sandbox_limit") || !strings.HasPrefix(c.Other, "201 created") {
		t.Errorf("next %q, other %q", c.Next, c.Other)
	}
	if len(f.live) != 0 || len(other.live) != 0 {
		t.Errorf("left behind: %v %v", f.live, other.live)
	}

	// Below the floor nothing is created.
	f = newFake(3)
	c, err = Fill(context.Background(), f, h, FillOptions{N: 3, Floor: 9 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if c.Held != 0 || !strings.Contains(c.Stopped, "floor") || c.Next != "" || len(f.calls) != 0 {
		t.Errorf("below the floor: %+v, calls %v", c, f.calls)
	}
}

// The report states the figures, the ratios to bare and the issue's
// targets.
func TestWriteSandboxes(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x*1e6))
		}
		return out
	}
	l := SandboxLatency{
		Bare:          Summarize(Sample{Parallel: 1, Latencies: ms(1, 1, 2)}),
		Command:       Summarize(Sample{Parallel: 1, Latencies: ms(2.5, 3, 4)}),
		Create:        Summarize(Sample{Parallel: 1, Latencies: ms(40, 50, 60), Errors: 1, FirstErr: errors.New("boom")}),
		Delete:        Summarize(Sample{Parallel: 1, Latencies: ms(10, 12, 14)}),
		ColdCreate:    Summarize(Sample{Parallel: 1, Latencies: ms(70, 80, 90)}),
		PythonCommand: Summarize(Sample{Parallel: 1, Latencies: ms(20, 20, 20)}),
		Cell:          Summarize(Sample{Parallel: 1, Latencies: ms(5, 5, 5)}),
	}
	idle := &SandboxMemory{Procs: 4, PSS: 4 << 20, RSS: 8 << 20, Cgroup: 2 << 20}
	capa := &Capacity{Asked: 10, Held: 10, Next: "429 sandbox_limit: your plan allows 10", Other: "201 created (sbx_1)",
		AvailBefore: 1000 << 20, AvailHeld: 900 << 20, ServerBefore: 50 << 20, ServerHeld: 60 << 20,
		Sum: SandboxMemory{Procs: 40, PSS: 20 << 20, RSS: 80 << 20, Cgroup: 15 << 20}, Create: Summarize(Sample{Latencies: ms(70, 80)})}
	var buf bytes.Buffer
	WriteSandboxes(&buf, l, idle, &SandboxMemory{Procs: 5, PSS: 15 << 20, RSS: 20 << 20, Cgroup: 12 << 20}, &SandboxMemory{Procs: 5, PSS: 60 << 20, RSS: 70 << 20, Cgroup: 55 << 20}, capa)
	// Table cells are compared without their padding.
	pad := regexp.MustCompile(` +\|`)
	got := pad.ReplaceAllString(buf.String(), " |")
	for _, want := range []string{
		"| bare /bin/sh -c 'echo 1' (host)              | 3 | 1.0 ms  | 2.0 ms  | 1.00       | 0        |",
		"| echo 1 as a command in a live sandbox (API)  | 3 | 3.0 ms  | 4.0 ms  | 3.00       | 0        |",
		"| create a sandbox (API, pool warm)            | 4 | 50.0 ms | 60.0 ms | 50.00      | 1 (boom) |",
		"| create a sandbox (API, pool off)             | 3 | 80.0 ms | 90.0 ms | 80.00      | 0        |",
		"| 1 + 1 as a cell in a Python context (API)    | 3 | 5.0 ms  | 5.0 ms  | 5.00       | 0        |",
		"- command p50 − bare p50 = 2.0 ms (issue 22: command p50 ≤ 3.0 ms through the API: met at 3.0 ms)",
		"- a cell in a code context: p50 5.0 ms, 0.25× the same work as a python3 command (20.0 ms), which starts the interpreter each time",
		"(issue 23: a warm cell p50 ≤ 2.0 ms through the API: Python missed, JavaScript missed)",
		"- idle sandbox with a Python context started: 5 processes, PSS 15.0 MiB, RSS 20.0 MiB, cgroup 12.0 MiB (issue 23: ≤ 20.0 MiB by PSS: met)",
		"- idle sandbox (datasci image) with a Python context that imported pandas: 5 processes, PSS 60.0 MiB, 4.00× the bare context's, RSS 70.0 MiB, cgroup 55.0 MiB (issue 23: measured)",
		"- create p50 = 50.0 ms with the pool warm (issue 22: ≤ 25.0 ms: missed); 80.0 ms with the pool off, 1.60× the warm create",
		"PSS 4.0 MiB, RSS 8.0 MiB, cgroup memory usage 2.0 MiB (issue 22: ≤ 10.0 MiB by PSS: met)",
		"- per sandbox, with 10 held: PSS 2.0 MiB, RSS 8.0 MiB, cgroup 1.5 MiB (4 processes each)",
		"1000.0 MiB → 900.0 MiB: 10.0 MiB per sandbox",
		"by memory alone, the memory available before the fill holds about 100 idle sandboxes",
		"- the next create of the same tenant got: 429 sandbox_limit",
		"(no server-wide cap: only each tenant's plan limits the sandboxes a node holds)",
	} {
		want = pad.ReplaceAllString(want, " |")
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
