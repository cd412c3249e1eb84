package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 20; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 10 * time.Millisecond, 95: 19 * time.Millisecond, 99: 20 * time.Millisecond, 0: time.Millisecond, 100: 20 * time.Millisecond} {
		if got := Percentile(d, p); got != want {
			t.Errorf("p%v = %v; want %v", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty: want 0")
	}
	if got := Percentile([]time.Duration{7}, 95); got != 7 {
		t.Errorf("one sample: %v", got)
	}
}

func TestSummarize(t *testing.T) {
	s := Sample{Parallel: 2, Wall: 2 * time.Second, Errors: 1, FirstErr: errors.New("boom"),
		Latencies: []time.Duration{30, 10, 20, 40}}
	got := Summarize(s)
	want := Stats{N: 5, Parallel: 2, Errors: 1, P50: 20, P95: 40, P99: 40, PerSecond: 2, FirstErr: "boom"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// Measure runs exactly n measured executions plus the warm-up, with at
// most `parallel` in flight, and counts failures apart.
func TestMeasure(t *testing.T) {
	var calls, inFlight, peak atomic.Int64
	fn := func(ctx context.Context) error {
		n := calls.Add(1)
		cur := inFlight.Add(1)
		for {
			p := peak.Load()
			if cur <= p || peak.CompareAndSwap(p, cur) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		inFlight.Add(-1)
		if n%5 == 0 {
			return errors.New("every fifth fails")
		}
		return nil
	}
	s := Measure(context.Background(), fn, 20, 3, 2)
	if calls.Load() != 22 {
		t.Errorf("calls = %d; want 20 + 2 warm-up", calls.Load())
	}
	if peak.Load() > 3 || peak.Load() < 2 {
		t.Errorf("peak in flight = %d; want up to 3", peak.Load())
	}
	if len(s.Latencies)+s.Errors != 20 || s.Errors == 0 || s.FirstErr == nil {
		t.Errorf("sample: %d ok, %d errors, first %v", len(s.Latencies), s.Errors, s.FirstErr)
	}
	if s.Wall <= 0 || s.Parallel != 3 {
		t.Errorf("wall %v parallel %d", s.Wall, s.Parallel)
	}
}

func TestRunInterleavesTargets(t *testing.T) {
	var order []string
	var mu sync.Mutex // the parallel-2 blocks call Run from two goroutines
	var calls []string
	mk := func(name string, bare bool) Target {
		return Target{Name: name, Bare: bare, Run: func(_ context.Context, lang string) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, name)
			return nil
		}}
	}
	rows := Run(context.Background(), []Target{mk("bare", true), mk("oci/crun", false)},
		[]Row{{Target: "oci/runsc", Skipped: "not installed"}},
		Options{N: 3, Rounds: 2, Parallel: []int{1, 2}, Langs: []string{"python", "bash"},
			Progress: func(target, lang string, p int) { order = append(order, target+" "+lang) }})
	// Parallel 1 of python: round one has 2 executions of each target,
	// round two 1, alternating targets between rounds.
	if diff := cmp.Diff([]string{"bare", "bare", "oci/crun", "oci/crun", "bare", "oci/crun"}, calls[:6]); diff != "" {
		t.Errorf("interleaving (-want +got):\n%s", diff)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.Target+"/"+r.Lang+"/"+r.Skipped)
		if r.Skipped == "" && (len(r.Stats) != 2 || r.Stats[1].Parallel != 2 || r.Stats[0].N != 3) {
			t.Errorf("%s %s stats: %+v", r.Target, r.Lang, r.Stats)
		}
	}
	want := []string{"bare/python/", "oci/crun/python/", "oci/runsc/python/not installed", "bare/bash/", "oci/crun/bash/", "oci/runsc/bash/not installed"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if order[0] != "bare python" || order[1] != "oci/crun python" || len(order) != 8 {
		t.Errorf("measurement order %v", order)
	}
}

func stats(p50ms, p95ms float64, perSec ...float64) []Stats {
	var out []Stats
	for i, r := range perSec {
		out = append(out, Stats{N: 50, Parallel: i + 1, P50: time.Duration(p50ms * 1e6), P95: time.Duration(p95ms * 1e6), PerSecond: r})
	}
	return out
}

// withCPU sets the CPU per execution (machine, bench's own) in ms at
// each parallel level, in the order of the stats.
func withCPU(st []Stats, perLevel ...[2]float64) []Stats {
	for i, c := range perLevel {
		st[i].HasCPU = true
		st[i].CPU, st[i].SelfCPU = time.Duration(c[0]*1e6), time.Duration(c[1]*1e6)
	}
	return st
}

func sampleRows() []Row {
	return []Row{
		{Target: "bare", Bare: true, Lang: "python", Stats: withCPU(stats(11, 13, 90, 170), [2]float64{10.2, 0.8}, [2]float64{9.6, 0.9})},
		{Target: "oci/crun", Lang: "python", Stats: withCPU(stats(21, 25, 47, 97), [2]float64{23, 3.1}, [2]float64{24.5, 3.4})},
		{Target: "docker/runc", Lang: "python", Stats: stats(230, 260, 4.3, 4.6)},
		{Target: "docker run runc (CLI)", Lang: "python", Stats: stats(220, 250, 4.5, 5)},
		{Target: "oci/runsc", Lang: "python", Stats: []Stats{{N: 50, Parallel: 1, Errors: 50, FirstErr: "status failed, exit 134"}, {N: 50, Parallel: 2, Errors: 50}}},
		{Target: "docker/runsc", Lang: "python", Skipped: "no runtime runsc"},
		{Target: "api, warm pool (oci/crun)", Lang: "python", Stats: withCPU(stats(9.5, 30, 80, 120), [2]float64{20, 1.1}, [2]float64{22.1, 1.3})},
		{Target: "api, warm pool (oci/bwrap)", Lang: "python", Stats: []Stats{{N: 50, Parallel: 1, P50: 9e6, P95: 12e6, PerSecond: 85, CPUErr: "reading machine CPU time: no such file"}, {N: 50, Parallel: 2, P50: 9e6, P95: 12e6, PerSecond: 150}}},
		{Target: "bare", Bare: true, Lang: "bash", Stats: withCPU(stats(1.5, 2, 600, 1100), [2]float64{1.3, 0.4}, [2]float64{1.2, 0.4})},
		{Target: "api, warm pool (oci/crun)", Lang: "bash", Stats: withCPU(stats(6, 8, 150, 300), [2]float64{3.9, 1}, [2]float64{4.0, 1.1})},
	}
}

// The table is what docs/BENCHMARKS.md shows: a golden file holds it.
func TestWriteMarkdownGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, sampleRows(), []int{1, 2}); err != nil {
		t.Fatal(err)
	}
	WriteRatios(&buf, Ratios(sampleRows()))
	golden := filepath.Join("testdata", "table.golden.md")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), buf.String()); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

func TestRatios(t *testing.T) {
	got := Ratios(sampleRows())
	want := []Ratio{
		{"oci/crun python p50 / bare python3 p50", 21.0 / 11, "≤ 2.0", true},
		{"oci/crun python exec/s ×2 / bare", 97.0 / 170, "≥ 0.7", false},
		{"warm pool API (oci/crun) python p50 / bare p50", 9.5 / 11, "≤ 1.0", true},
		{"warm pool API (oci/crun) python exec/s ×2 / bare", 120.0 / 170, "≥ 0.7", true},
		{"warm pool API (oci/crun) python CPU/exec ×2 / bare (issue 15)", 22.1 / 9.6, "≤ 1.3", false},
		{"warm pool API (oci/crun) python exec/s ×2 / bare (issue 15)", 120.0 / 170, "≥ 0.8", false},
		// bwrap's CPU was not read: only its latency and throughput count.
		{"warm pool API (oci/bwrap) python p50 / bare p50", 9.0 / 11, "≤ 1.0", true},
		{"warm pool API (oci/bwrap) python exec/s ×2 / bare", 150.0 / 170, "≥ 0.7", true},
		{"warm pool API (oci/bwrap) python exec/s ×2 / bare (issue 15)", 150.0 / 170, "≥ 0.8", true},
		{"warm pool API (oci/crun) bash p50 − bare bash p50 (ms)", 4.5, "≤ 3", false},
		{"warm pool API (oci/crun) bash exec/s ×2 / bare", 300.0 / 1100, "≥ 0.7", false},
		{"warm pool API (oci/crun) bash CPU/exec ×2 − bare (ms, issue 15)", 2.8, "≤ 3", true},
		{"warm pool API (oci/crun) bash p50 / bare p50 (issue 15)", 4, "≤ 1.0", false},
		{"docker/runc driver p50 / raw docker run p50 (python)", 230.0 / 220, "≤ 1.1", true},
	}
	if diff := cmp.Diff(want, got, cmpFloat); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

var cmpFloat = cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })

// The raw docker run carries the same hardening as the driver.
func TestDockerRunArgs(t *testing.T) {
	l := engine.Language{Name: "python", File: "main.py", Command: []string{"python3", "/code/main.py"}}
	args := DockerRunArgs(DockerCLI{Image: "vertal/default:latest", Runtime: "runc"}, "/tmp/code", "/tmp/seccomp.json", l)
	line := strings.Join(args, " ")
	for _, want := range []string{
		"--network none", "--read-only", "--cap-drop ALL", "--security-opt no-new-privileges",
		"--security-opt seccomp=/tmp/seccomp.json", "--user 65534:65534", "--memory 268435456", "--memory-swap 268435456",
		"--cpus 1", "--pids-limit 64", "--ulimit fsize=1048576:1048576", "--tmpfs /tmp:rw,noexec,nosuid,nodev",
		"-v /tmp/code:/code:ro", "--ipc none", "--init",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("docker run lacks %q:\n%s", want, line)
		}
	}
	if tail := args[len(args)-3:]; !slices.Equal(tail, []string{"vertal/default:latest", "python3", "/code/main.py"}) {
		t.Errorf("image and command: %v", tail)
	}
	gv := strings.Join(DockerRunArgs(DockerCLI{Image: "img", Runtime: "runsc"}, "/c", "", l), " ")
	for _, want := range []string{"--runtime runsc", "volume-opt=type=tmpfs", "--ulimit nproc=64:64"} {
		if !strings.Contains(gv, want) {
			t.Errorf("runsc docker run lacks %q:\n%s", want, gv)
		}
	}
}

// A bare target checks the program's output, so a broken interpreter is
// an error, not a fast sample.
func TestBareTargetChecksOutput(t *testing.T) {
	bare := BareTarget(map[string][]string{
		"bash":   {"/bin/sh", "-c", "echo 42"},
		"python": {"/bin/sh", "-c", "echo 41"},
	})
	if err := bare.Run(context.Background(), "bash"); err != nil {
		t.Errorf("echo 42: %v", err)
	}
	if err := bare.Run(context.Background(), "python"); err == nil || !strings.Contains(err.Error(), `"41\n"`) {
		t.Errorf("wrong output: %v", err)
	}
	if err := bare.Run(context.Background(), "javascript"); err == nil {
		t.Error("missing command: want an error")
	}
}

func TestAPIOverhead(t *testing.T) {
	rows := []Row{
		{Target: "bare", Bare: true, Lang: "python", Stats: stats(10, 12, 100, 180)},
		{Target: "bare", Bare: true, Lang: "bash", Stats: stats(1.5, 2, 600, 1100)},
		{Target: "oci/crun", Lang: "python", Stats: stats(21, 25, 47, 90)},
		{Target: "api, pool off (oci/crun)", Lang: "python", Stats: stats(24.5, 30, 40, 80)},
		{Target: "api, pool off (oci/runc)", Lang: "python", Skipped: "down"},
		{Target: "api, warm pool (oci/crun)", Lang: "python", Stats: stats(9, 11, 100, 150)},
		{Target: "api, warm pool (oci/crun)", Lang: "bash", Stats: stats(6, 8, 150, 300)},
	}
	want := []string{"API overhead (python): p50 through the API with the pool off − oci/crun p50 = 3.5 ms"}
	if diff := cmp.Diff(want, APIOverhead(rows)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	wantRatios := []Ratio{
		{"oci/crun python p50 / bare python3 p50", 2.1, "≤ 2.0", false},
		{"oci/crun python exec/s ×2 / bare", 0.5, "≥ 0.7", false},
		{"warm pool API (oci/crun) python p50 / bare p50", 0.9, "≤ 1.0", true},
		{"warm pool API (oci/crun) python exec/s ×2 / bare", 150.0 / 180, "≥ 0.7", true},
		{"warm pool API (oci/crun) python exec/s ×2 / bare (issue 15)", 150.0 / 180, "≥ 0.8", true},
		{"warm pool API (oci/crun) bash p50 − bare bash p50 (ms)", 4.5, "≤ 3", false},
		{"warm pool API (oci/crun) bash exec/s ×2 / bare", 300.0 / 1100, "≥ 0.7", false},
		{"warm pool API (oci/crun) bash p50 / bare p50 (issue 15)", 4, "≤ 1.0", false},
	}
	if diff := cmp.Diff(wantRatios, Ratios(rows), cmpFloat); diff != "" {
		t.Errorf("ratios (-want +got):\n%s", diff)
	}
}
