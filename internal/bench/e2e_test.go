package bench

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/oci"
)

func ociTargets(tb testing.TB, rt string) (engine.Driver, []engine.Language) {
	tb.Helper()
	cfg := config.Default()
	cfg.Driver, cfg.Runtime, cfg.ImageDir = "oci", rt, e2etest.ImageDir(config.DefaultImageDir)
	langs, err := cfg.ResolveLanguages()
	if err != nil {
		tb.Fatal(err)
	}
	d, err := oci.New(context.Background(), oci.Options{Runtime: rt, StateDir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("oci.New(%s): %v", rt, err)
	}
	return d, langs
}

// TestBenchE2E runs a small benchmark end to end, bare and through oci/crun,
// and checks that every execution printed 42 (the bench counts an
// execution only when its output is right).
func TestBenchE2E(t *testing.T) {
	e2etest.Require(t, "real sandboxes to benchmark")
	d, langs := ociTargets(t, "crun")
	node := filepath.Join(e2etest.ImageDir(config.DefaultImageDir), "rootfs/usr/local/bin/node")
	targets := []Target{BareTarget(BareCommands(node)), DriverTarget(d, langs)}
	rows := Run(context.Background(), targets, nil, Options{N: 4, Warmup: 1, Parallel: []int{1, 2}, Langs: []string{"python", "javascript", "bash"}, CPU: NewHostCPU()})
	if len(rows) != 6 {
		t.Fatalf("rows: %+v", rows)
	}
	for _, r := range rows {
		for _, s := range r.Stats {
			if s.Errors != 0 || s.P50 <= 0 || s.PerSecond <= 0 {
				t.Errorf("%s %s ×%d: %+v", r.Target, r.Lang, s.Parallel, s)
			}
			// A bare bash start can be under one clock tick of machine
			// time; a sandbox never is. The bench's own CPU is read in
			// microseconds, and it forks every execution.
			if !s.HasCPU || s.SelfCPU <= 0 || !r.Bare && s.CPU <= 0 {
				t.Errorf("%s %s ×%d: CPU not measured: %+v", r.Target, r.Lang, s.Parallel, s)
			}
		}
	}
	if got := Ratios(rows); len(got) != 2 {
		t.Errorf("ratios for oci/crun: %+v", got)
	}
}

// Go benchmarks of the engine path (go test -bench . with VERTAL_E2E=1):
// one execution per iteration, bare and through each OCI runtime.
func BenchmarkExecution(b *testing.B) {
	e2etest.Require(b, "real sandboxes to benchmark")
	node := filepath.Join(e2etest.ImageDir(config.DefaultImageDir), "rootfs/usr/local/bin/node")
	targets := []Target{BareTarget(BareCommands(node))}
	for _, rt := range []string{"crun", "runc", "runsc"} {
		d, langs := ociTargets(b, rt)
		targets = append(targets, DriverTarget(d, langs))
	}
	for _, t := range targets {
		for _, lang := range []string{"python", "javascript", "bash"} {
			b.Run(t.Name+"/"+lang, func(b *testing.B) {
				ctx := context.Background()
				for b.Loop() {
					if err := t.Run(ctx, lang); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
