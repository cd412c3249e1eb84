package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest"
)

// testLanguages are the languages on the test image.
func testLanguages() map[string]engine.Language {
	langs := map[string]engine.Language{}
	for name, l := range languages {
		l.Image = testImage()
		langs[name] = l
	}
	return langs
}

// newWarmOnly returns a pool over d that runs every execution warm (it
// waits for a sandbox rather than going cold); the test fails if any
// execution missed. The pool is closed before d's own cleanup checks that
// no container is left.
func newWarmOnly(t *testing.T, d *Driver) *pool.Pool {
	t.Helper()
	var langs []engine.Language
	for _, l := range testLanguages() {
		langs = append(langs, l)
	}
	p := pool.New(d, NewPrestarter(d), pool.Options{Languages: langs, Min: 1, Max: 2, MemoryBytes: 1 << 30, Limits: engine.DefaultLimits(0), Parallel: 2, WaitReady: 2 * time.Minute})
	t.Cleanup(func() {
		for _, s := range p.Stats() {
			if s.Misses != 0 {
				t.Errorf("%s: %d executions took the cold path; want every one warm", s.Language, s.Misses)
			}
		}
		if err := p.Close(); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	return p
}

// TestWarmRefusesEgress: a pre-started container has no egress mount
// and its program no relay, so it refuses an execution with an
// EgressDir before anything runs (the pool runs it cold).
func TestWarmRefusesEgress(t *testing.T) {
	requireE2E(t)
	d := newTestDriver(t, "runc")
	w, err := NewPrestarter(d).Prestart(context.Background(), testLanguages()["python"], engine.DefaultLimits(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Discard(context.Background())
	spec := engine.Spec{Language: testLanguages()["python"], Code: "print(1)", EgressDir: t.TempDir(), Agent: "/usr/local/bin/vertal-agent"}
	if _, err := w.Exec(context.Background(), enginetest.Complete(spec)); !errors.Is(err, pool.ErrNotStarted) {
		t.Errorf("Exec with EgressDir: %v; want ErrNotStarted", err)
	}
}

// TestWarmMatchesCold runs programs through the cold path and through warm
// containers and compares what the API reports.
func TestWarmMatchesCold(t *testing.T) {
	requireE2E(t)
	programs := []struct{ name, lang, code, stdin string }{
		{"hello", "python", "print(6*7)", ""},
		{"sys_exit_3", "python", "import sys\nprint('before')\nsys.exit(3)\n", ""},
		{"traceback", "python", "def f(x):\n    return 1 / x\n\nprint('start')\nf(0)\n", ""},
		{"syntax_error", "python", "print(\n", ""},
		{"stdin", "python", "import sys\nprint(repr(sys.stdin.read()))\n", "a\nb\n"},
		{"no_stdin", "python", "import os, stat, sys\nprint(repr(sys.stdin.read()), stat.S_ISCHR(os.fstat(0).st_mode))\n", ""},
		{"identity", "python", "import os, sys\nprint(__name__, __file__, sys.argv, sys.path[0], sorted(sys.modules), sorted(globals()), sorted(os.listdir('/proc/self/fd')), sorted(os.environ.items()))\n", ""},
		{"frames", "python", "import sys, traceback\ndef f(n):\n    try:\n        return f(n + 1)\n    except RecursionError:\n        return n\nprint(f(0), sys._getframe().f_back, len(traceback.format_stack()))\n", ""},
		{"child_python", "python", "import subprocess, sys\nr = subprocess.run([sys.executable, '-c', 'print(6*7)'], capture_output=True, text=True)\nprint(repr(r.stdout), r.returncode)\n", ""},
		{"output_cap", "python", "print('x' * 100000)", ""},
		{"hello", "javascript", "console.log(6*7)", ""},
		{"throw", "javascript", "function f() { throw new Error('boom') }\nf()\n", ""},
		{"stdin", "javascript", "process.stdout.write(require('fs').readFileSync(0, 'utf8').toUpperCase())", "abc\n"},
		{"no_stdin", "javascript", "const fs = require('fs'); console.log(fs.fstatSync(0).isCharacterDevice(), fs.readFileSync(0, 'utf8').length)", ""},
		{"identity", "javascript", "console.log(JSON.stringify([process.argv, process.execArgv, require.main === module, Object.keys(require.cache), process.moduleLoadList.length]))", ""},
		{"hello", "bash", "echo $((6*7))", ""},
		{"exit_3", "bash", "echo before; exit 3", ""},
		{"stdin", "bash", "tr a-z A-Z", "hello\n"},
		{"no_stdin", "bash", "[ -c /dev/stdin ] && echo chr; cat; echo end", ""},
		{"identity", "bash", "echo \"$0\" \"$SHLVL\"; export -p; ls /proc/self/fd", ""},
	}
	for _, c := range securitytest.ChildPrograms() {
		programs = append(programs, struct{ name, lang, code, stdin string }{c.Name, c.Lang, c.Code, ""})
	}
	addr := regexp.MustCompile(`0x[0-9a-f]+`)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			warm := newWarmOnly(t, d)
			langs := testLanguages()
			for _, p := range programs {
				t.Run(p.lang+"/"+p.name, func(t *testing.T) {
					spec := engine.Spec{Language: langs[p.lang], Code: p.code, Stdin: p.stdin, Timeout: 30 * time.Second}
					spec.ID = newID(t)
					cold, err := d.Run(context.Background(), enginetest.Complete(spec))
					if err != nil {
						t.Fatalf("cold Run: %v", err)
					}
					spec.ID = newID(t)
					got, err := warm.Run(context.Background(), enginetest.Complete(spec))
					if err != nil {
						t.Fatalf("warm Run: %v", err)
					}
					want, have := enginetest.OutcomeOf(cold), enginetest.OutcomeOf(got)
					want.Stdout, have.Stdout = addr.ReplaceAllString(want.Stdout, "0x"), addr.ReplaceAllString(have.Stdout, "0x")
					if diff := cmp.Diff(want, have); diff != "" {
						t.Errorf("warm result differs from cold (-cold +warm):\n%s", diff)
					}
				})
			}
		})
	}
}

// TestSecuritySuiteThroughPool runs the whole security suite in warm
// containers on docker+runc and docker+runsc.
func TestSecuritySuiteThroughPool(t *testing.T) {
	requireE2E(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			securitytest.Run(t, newWarmOnly(t, d), testLanguages())
		})
	}
}

// BenchmarkWarm compares a cold Run with a warm one (the pool refilled
// between iterations, not timed) for print(6*7), per runtime. Reported:
// p50 of each in ms.
//
//	VERTAL_E2E=1 go test -run '^$' -bench Warm -benchtime 30x ./internal/engine/docker/
func BenchmarkWarm(b *testing.B) {
	if os.Getenv("VERTAL_E2E") != "1" {
		b.Skip("set VERTAL_E2E=1 with a running Docker engine")
	}
	for _, rt := range runtimes {
		b.Run(rt, func(b *testing.B) {
			d, err := New(context.Background(), Options{Runtime: rt, StateDir: b.TempDir(), Image: testImage()})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			lang := testLanguages()["python"]
			p := pool.New(d, NewPrestarter(d), pool.Options{Languages: []engine.Language{lang}, Min: 1, Max: 1, MemoryBytes: 1 << 30, Limits: engine.DefaultLimits(0)})
			defer p.Close()
			var cold, warm []time.Duration
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				for p.Stats()[0].Ready == 0 {
					time.Sleep(time.Millisecond)
				}
				b.StartTimer()
				for _, r := range []struct {
					d   engine.Driver
					out *[]time.Duration
				}{{d, &cold}, {p, &warm}} {
					t0 := time.Now()
					res, err := r.d.Run(context.Background(), enginetest.Complete(engine.Spec{ID: fmt.Sprintf("exe_bench%d_%d", i, len(*r.out)), Language: lang, Code: "print(6*7)", Timeout: 20 * time.Second}))
					if err != nil || res.Stdout != "42\n" {
						b.Fatalf("Run: %+v, %v", res, err)
					}
					*r.out = append(*r.out, time.Since(t0))
				}
			}
			slices.Sort(cold)
			slices.Sort(warm)
			b.ReportMetric(float64(cold[len(cold)/2])/1e6, "cold-p50-ms")
			b.ReportMetric(float64(warm[len(warm)/2])/1e6, "warm-p50-ms")
		})
	}
}
