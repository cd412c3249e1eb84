// Package bench measures how long one execution takes and how many run per
// second, through each sandbox driver and, in the same run, with the bare
// interpreter on the host, so the cost of the sandbox shows as a ratio.
//
// The programs are the smallest that prove a round trip: print(6*7),
// console.log(6*7) and echo 42. What is measured is therefore almost
// entirely sandbox creation, interpreter start-up and teardown.
package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// Programs are the code each language runs; all print "42\n".
var Programs = func() map[string]string {
	out := map[string]string{}
	for _, d := range lang.All {
		out[d.Name] = d.Hello
	}
	return out
}()

// Want is what every program prints.
const Want = "42\n"

// RunFunc performs one execution of lang's program and returns an error
// unless it printed Want.
type RunFunc func(ctx context.Context, lang string) error

// Target is one way of running the programs: the bare interpreter, a
// driver, a raw `docker run`, or the HTTP API.
type Target struct {
	// Name is the table's first column, e.g. "bare", "oci/crun".
	Name string
	// Bare marks the baseline the other targets are compared with.
	Bare bool
	Run  RunFunc
	// CPUTail keeps the CPU window of each block open up to this long
	// after its last execution answered, for targets that go on working
	// after the answer (a server's warm pool refills itself): that work
	// is theirs, and would otherwise be charged to the next target's
	// block. Idle, if set, ends the wait early once it reports true (the
	// server has nothing left to do); without it the whole tail is waited.
	CPUTail time.Duration
	Idle    func(context.Context) (bool, error)
}

// Sample is one measurement: N executions with Parallel workers.
type Sample struct {
	Parallel  int
	Latencies []time.Duration // of the successful executions
	Wall      time.Duration   // from the first start to the last end
	Errors    int
	FirstErr  error
	// CPU is the CPU time spent during the measured executions (summed
	// over blocks), when Options.CPU was given; CPUBlocks counts the
	// blocks it covers, and CPUErr is the first failure to read it.
	CPU       CPUUse
	CPUBlocks int
	CPUErr    error
}

// Measure runs fn n times with parallel workers after warmup unmeasured
// runs, and records each latency and the total wall time.
func Measure(ctx context.Context, fn func(context.Context) error, n, parallel, warmup int) Sample {
	return measureN(ctx, fn, n, parallel, warmup, nil)
}

func measureN(ctx context.Context, fn func(context.Context) error, n, parallel, warmup int, start func()) Sample {
	var next atomic.Int64
	return measure(ctx, fn, parallel, warmup, start, func() bool { return next.Add(1) <= int64(n) })
}

// measureBlock is Measure with the CPU spent between the end of the
// warm-up and tail after the last execution read from cpu (if not nil).
func measureBlock(ctx context.Context, fn func(context.Context) error, n, parallel, warmup int, cpu CPUCounters, tail time.Duration, idle func(context.Context) (bool, error)) Sample {
	if cpu == nil {
		return Measure(ctx, fn, n, parallel, warmup)
	}
	var before CPUUse
	var beforeErr error
	s := measureN(ctx, fn, n, parallel, warmup, func() { before, beforeErr = readCPU(cpu) })
	settle(ctx, tail, idle)
	after, err := readCPU(cpu)
	switch {
	case beforeErr != nil:
		s.CPUErr = beforeErr
	case err != nil:
		s.CPUErr = err
	default:
		s.CPU = CPUUse{Machine: after.Machine - before.Machine, Self: after.Self - before.Self}
		s.CPUBlocks = 1
	}
	return s
}

// MeasureFor runs fn with parallel workers for d (after warmup unmeasured
// runs) and records every latency: a sustained load, where Measure is a
// fixed count.
func MeasureFor(ctx context.Context, fn func(context.Context) error, parallel, warmup int, d time.Duration) Sample {
	var end time.Time
	return measure(ctx, fn, parallel, warmup,
		func() { end = time.Now().Add(d) },
		func() bool { return time.Now().Before(end) })
}

// measure runs fn on parallel workers while more says so. start, if not
// nil, runs once after the warm-up, before the workers begin.
func measure(ctx context.Context, fn func(context.Context) error, parallel, warmup int, start func(), more func() bool) Sample {
	if parallel < 1 {
		parallel = 1
	}
	for i := 0; i < warmup && ctx.Err() == nil; i++ {
		fn(ctx)
	}
	if start != nil {
		start()
	}
	s := Sample{Parallel: parallel}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	began := time.Now()
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && more() {
				t0 := time.Now()
				err := fn(ctx)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					s.Errors++
					if s.FirstErr == nil {
						s.FirstErr = err
					}
				} else {
					s.Latencies = append(s.Latencies, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s.Wall = time.Since(began)
	return s
}

// settle waits up to tail, polling idle (if any) and returning as soon as
// it says so. A failing idle check is no answer: the wait goes on.
func settle(ctx context.Context, tail time.Duration, idle func(context.Context) (bool, error)) {
	const poll = 20 * time.Millisecond
	deadline := time.Now().Add(tail)
	for ctx.Err() == nil {
		if idle != nil {
			if ok, err := idle(ctx); err == nil && ok {
				return
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		select {
		case <-time.After(min(poll, left)):
		case <-ctx.Done():
		}
	}
}

// Stats summarise a Sample.
type Stats struct {
	N, Parallel, Errors int
	P50, P95, P99       time.Duration
	PerSecond           float64 // successful executions per second of wall time
	FirstErr            string
	// CPU per successful execution, when it was measured (HasCPU): the
	// whole machine's busy time and the bench process's own share of it.
	HasCPU       bool
	CPU, SelfCPU time.Duration
	CPUErr       string
}

// Summarize computes percentiles (nearest rank) and throughput.
func Summarize(s Sample) Stats {
	st := Stats{N: len(s.Latencies) + s.Errors, Parallel: s.Parallel, Errors: s.Errors}
	if s.FirstErr != nil {
		st.FirstErr = s.FirstErr.Error()
	}
	if s.CPUErr != nil {
		st.CPUErr = s.CPUErr.Error()
	}
	if len(s.Latencies) == 0 {
		return st
	}
	if s.CPUBlocks > 0 && s.CPUErr == nil {
		st.HasCPU = true
		st.CPU = s.CPU.Machine / time.Duration(len(s.Latencies))
		st.SelfCPU = s.CPU.Self / time.Duration(len(s.Latencies))
	}
	lat := slices.Clone(s.Latencies)
	slices.Sort(lat)
	st.P50, st.P95, st.P99 = Percentile(lat, 50), Percentile(lat, 95), Percentile(lat, 99)
	if s.Wall > 0 {
		st.PerSecond = float64(len(lat)) / s.Wall.Seconds()
	}
	return st
}

// Percentile is the nearest-rank percentile of sorted durations.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted)) + 0.999999)
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Row is one target and language across the parallel levels.
type Row struct {
	Target string
	Bare   bool
	Lang   string
	// Stats by parallel level, in the order of Options.Parallel.
	Stats []Stats
	// Skipped says why the target could not run at all.
	Skipped string
}

// Options configure a benchmark run.
type Options struct {
	N        int
	Warmup   int
	Parallel []int
	Langs    []string
	// Rounds interleaves the targets (see Run); 1 measures each target's
	// N executions in one go.
	Rounds int
	// CPU, if set, is read around every block, so each target's CPU per
	// execution is what the machine spent while that target ran.
	CPU CPUCounters
	// Progress, if set, is told what is being measured.
	Progress func(target, lang string, parallel int)
}

// ErrNoSamples means every execution of a measurement failed.
var ErrNoSamples = errors.New("every execution failed")

// Run measures every target for every language and parallel level. On a
// shared or busy host the load drifts, so the measurements are interleaved:
// each cell's N executions are split into Rounds blocks, and every round
// measures one block of every target in turn. A slow minute then costs
// every target alike instead of whichever ran during it.
func Run(ctx context.Context, targets []Target, skipped []Row, opts Options) []Row {
	if opts.N <= 0 {
		opts.N = 50
	}
	if len(opts.Parallel) == 0 {
		opts.Parallel = []int{1, 2}
	}
	rounds := min(max(opts.Rounds, 1), opts.N)
	var rows []Row
	for _, lang := range opts.Langs {
		first := len(rows)
		for _, t := range targets {
			rows = append(rows, Row{Target: t.Name, Bare: t.Bare, Lang: lang, Stats: make([]Stats, len(opts.Parallel))})
		}
		for pi, p := range opts.Parallel {
			samples := make([]Sample, len(targets))
			for round := 0; round < rounds; round++ {
				n := opts.N / rounds
				if round < opts.N%rounds {
					n++
				}
				for ti, t := range targets {
					if ctx.Err() != nil {
						return rows
					}
					if opts.Progress != nil && round == 0 {
						opts.Progress(t.Name, lang, p)
					}
					warm := 0
					if round == 0 {
						warm = opts.Warmup
					}
					run := t.Run
					s := measureBlock(ctx, func(ctx context.Context) error { return run(ctx, lang) }, n, p, warm, opts.CPU, t.CPUTail, t.Idle)
					samples[ti] = merge(samples[ti], s)
				}
			}
			for ti := range targets {
				rows[first+ti].Stats[pi] = Summarize(samples[ti])
			}
		}
		for _, s := range skipped {
			s.Lang = lang
			rows = append(rows, s)
		}
	}
	return rows
}

// merge adds block b to the sample a: latencies pooled, wall times and
// CPU times summed (throughput and CPU per execution are then those of
// the time while that target ran).
func merge(a, b Sample) Sample {
	a.Parallel = b.Parallel
	a.Latencies = append(a.Latencies, b.Latencies...)
	a.Wall += b.Wall
	a.Errors += b.Errors
	if a.FirstErr == nil {
		a.FirstErr = b.FirstErr
	}
	a.CPU = a.CPU.Add(b.CPU)
	a.CPUBlocks += b.CPUBlocks
	if a.CPUErr == nil {
		a.CPUErr = b.CPUErr
	}
	return a
}

// fmtMs renders a latency in milliseconds.
func fmtMs(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", ms(d))
}
