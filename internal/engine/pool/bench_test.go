package pool_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/oci"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
)

// BenchmarkLatency compares, per runtime and language, one small program
// run three ways in the same iteration: the bare interpreter on the host,
// the cold path (oci driver) and a warm sandbox from the pool. Interleaving
// them keeps a busy machine's noise out of the ratios. The pool is given
// time to refill between iterations (not timed): this is the latency of an
// execution that finds a sandbox ready. Reported: p50 of each in ms, and
// warm/bare and cold/bare.
//
//	VERTAL_E2E=1 go test -run '^$' -bench Latency -benchtime 100x ./internal/engine/pool/
func BenchmarkLatency(b *testing.B) {
	e2e(b)
	node := filepath.Join(rootfs(), "usr/local/bin/node")
	cases := []struct {
		lang string
		code string
		bare []string
	}{
		{"python", "print(6*7)", []string{"/usr/bin/python3", "-c", "print(6*7)"}},
		{"javascript", "console.log(6*7)", []string{node, "-e", "console.log(6*7)"}},
		{"bash", "echo 42", []string{"/usr/bin/bash", "-c", "echo 42"}},
	}
	for _, rt := range runtimes {
		b.Run(rt, func(b *testing.B) {
			d := newOCI(b, rt)
			for _, c := range cases {
				b.Run(c.lang, func(b *testing.B) {
					lang := languages()[c.lang]
					p := pool.New(d, oci.NewPrestarter(d), pool.Options{Languages: []engine.Language{lang}, Min: 1, Max: 1, MemoryBytes: 1 << 30, Limits: engine.DefaultLimits(0)})
					defer p.Close()
					spec := engine.Spec{Language: lang, Code: c.code, Timeout: 10 * time.Second}
					var bare, cold, warm []time.Duration
					for b.Loop() {
						b.StopTimer()
						waitReady(b, p, c.lang)
						b.StartTimer()
						t0 := time.Now()
						runBare(b, c.bare)
						t1 := time.Now()
						runOK(b, d, spec)
						t2 := time.Now()
						res := runOK(b, p, spec)
						t3 := time.Now()
						bare, cold, warm = append(bare, t1.Sub(t0)), append(cold, t2.Sub(t1)), append(warm, t3.Sub(t2))
						_ = res
					}
					if s := statsFor(p, c.lang); s.Misses > 0 {
						b.Errorf("%d warm runs missed the pool", s.Misses)
					}
					pb, pc, pw := p50(bare), p50(cold), p50(warm)
					b.ReportMetric(ms(pb), "bare-p50-ms")
					b.ReportMetric(ms(pc), "cold-p50-ms")
					b.ReportMetric(ms(pw), "warm-p50-ms")
					b.ReportMetric(float64(pw)/float64(pb), "warm/bare")
					b.ReportMetric(float64(pc)/float64(pb), "cold/bare")
				})
			}
		})
	}
}

// BenchmarkSustained runs executions back to back (one client, then two
// in parallel) on crun, so the pool refills while the next execution
// runs: what a steady stream of requests sees. Reported: p50 latency,
// executions per second and the share of executions that found the pool
// empty and ran cold, for one and two pre-starts at a time.
//
//	VERTAL_E2E=1 go test -run '^$' -bench Sustained -benchtime 10s ./internal/engine/pool/
func BenchmarkSustained(b *testing.B) {
	e2e(b)
	for _, clients := range []int{1, 2} {
		for _, parallel := range []int{1, 2} {
			b.Run(fmt.Sprintf("clients=%d/parallel=%d", clients, parallel), func(b *testing.B) {
				d := newOCI(b, "crun")
				lang := languages()["python"]
				p := pool.New(d, oci.NewPrestarter(d), pool.Options{Languages: []engine.Language{lang}, Min: 1, Max: 4, MemoryBytes: 1 << 30, Limits: engine.DefaultLimits(0), Parallel: parallel})
				defer p.Close()
				waitReady(b, p, "python")
				spec := engine.Spec{Language: lang, Code: "print(6*7)", Timeout: 10 * time.Second}
				var mu sync.Mutex
				var lat []time.Duration
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							t0 := time.Now()
							res, err := p.Run(context.Background(), enginetest.Complete(spec))
							if err != nil || res.Status != engine.StatusSucceeded {
								b.Errorf("Run: %+v, %v", res, err)
								return
							}
							mu.Lock()
							lat = append(lat, time.Since(t0))
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				s := statsFor(p, "python")
				b.ReportMetric(ms(p50(lat)), "p50-ms")
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "execs/s")
				b.ReportMetric(float64(s.Misses)/float64(s.Hits+s.Misses), "miss-ratio")
			})
		}
	}
}

func waitReady(b *testing.B, p *pool.Pool, lang string) {
	deadline := time.Now().Add(time.Minute)
	for statsFor(p, lang).Ready == 0 {
		if time.Now().After(deadline) {
			b.Fatalf("no warm %s sandbox within a minute", lang)
		}
		time.Sleep(time.Millisecond)
	}
}

func runBare(b *testing.B, argv []string) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + os.TempDir(), "LANG=C.UTF-8"}
	if out, err := cmd.Output(); err != nil || len(out) == 0 {
		b.Fatalf("%v: %q, %v", argv, out, err)
	}
}

func runOK(b *testing.B, d engine.Driver, spec engine.Spec) engine.Result {
	res, err := d.Run(context.Background(), enginetest.Complete(spec))
	if err != nil || res.Status != engine.StatusSucceeded {
		b.Fatalf("Run: %+v, %v", res, err)
	}
	return res
}

func p50(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
