package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/bench"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

// sandboxBench configures the benchmarks of sandboxes that stay.
type sandboxBench struct {
	runtime       string // of the oci driver of the private server
	n, warmup     int
	rounds        int
	fill          int   // idle sandboxes to hold at once, at most
	floor         int64 // bytes of MemAvailable the fill leaves the host
	work          string
	sandboxLifeS  int
	serverConcurr int
}

// sandboxPlan is the private server's plan: limits out of the way, and
// max_sandboxes at the fill's bound, so the next create meets the
// tenant's cap.
// Its egress allows one name, which no bench sandbox reaches: a create
// with network starts its proxy and relay, one without asks for none.
func sandboxPlan(fill, lifetimeS int) string {
	return fmt.Sprintf(`{"plans": {"bench": {"executions_per_day": 1000000000, "requests_per_minute": 10000000, "max_timeout_s": 60, "memory_mb": 256, "max_concurrent": 1024, "max_sandboxes": %d, "max_sandbox_lifetime_s": %d, "egress": {"allow": ["example.com"]}}}}`,
		max(fill, 2), lifetimeS)
}

// benchSandboxes starts a private server (oci driver, the executions'
// warm pool off, one sandbox kept pre-started) with two tenants and
// measures through it: create (with the pool warm) and delete, echo 1 in
// a live sandbox against bare /bin/sh on the host, one idle sandbox's
// memory, and the fill; and creates on a second server with the sandbox
// pool off, in the same rounds.
func benchSandboxes(ctx context.Context, e *env, cfg config.Config, sb sandboxBench) error {
	if _, err := findAgent(cfg); err != nil {
		return fmt.Errorf("--sandboxes: %w", err)
	}
	serverEnv := []string{"VERTAL_POOL_MIN=0", "VERTAL_POOL_MAX=0", "VERTAL_SANDBOX_POOL=1"}
	// The data-science image, when built next to the default one: its
	// context with pandas imported is measured too.
	dataImage := ""
	if dir := filepath.Join(filepath.Dir(cfg.ImageDir), bench.DataImage); dirExists(dir) {
		dataImage = bench.DataImage
		serverEnv = append(serverEnv, "VERTAL_IMAGES="+bench.DataImage+"="+dir)
	}
	srv, err := startBenchServerWith(ctx, cfg, sb.runtime, sb.serverConcurr, filepath.Join(sb.work, "sandboxes "+sb.runtime),
		serverEnv, sandboxPlan(sb.fill, sb.sandboxLifeS), []string{"bench", "bench-other"})
	if err != nil {
		return fmt.Errorf("--sandboxes: %w", err)
	}
	defer srv.stop()
	coldSrv, err := startBenchServerWith(ctx, cfg, sb.runtime, sb.serverConcurr, filepath.Join(sb.work, "sandboxes cold "+sb.runtime),
		append(serverEnv, "VERTAL_SANDBOX_POOL=0"), sandboxPlan(sb.fill, sb.sandboxLifeS), []string{"bench"})
	if err != nil {
		return fmt.Errorf("--sandboxes: %w", err)
	}
	defer coldSrv.stop()
	life := time.Duration(sb.sandboxLifeS) * time.Second
	cold, err := bench.NewClientSandboxes(coldSrv.base, coldSrv.keys[0], life)
	if err != nil {
		return err
	}
	cold.Network = []string{}
	waitWarm := func(ctx context.Context) error {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(2 * time.Millisecond) {
			if n, err := srv.gauge(ctx, "vertal_sandbox_pool_ready"); err != nil || n >= 1 {
				return err
			}
			if time.Now().After(deadline) {
				return errors.New("no pre-started sandbox within 30 s")
			}
		}
	}
	api, err := bench.NewClientSandboxes(srv.base, srv.keys[0], life)
	if err != nil {
		return err
	}
	other, err := bench.NewClientSandboxes(srv.base, srv.keys[1], life)
	if err != nil {
		return err
	}
	withNet := *api
	api.Network, other.Network, withNet.Network = []string{}, []string{}, []string{"example.com"}
	fmt.Fprintf(e.Stderr, "bench: sandboxes (oci/%s): create, delete and echo 1, n=%d\n", sb.runtime, sb.n)
	lat, err := bench.MeasureSandboxLatency(ctx, api, cold, &withNet, waitWarm, bench.BareEcho, sb.n, sb.warmup, sb.rounds)
	if err != nil {
		return err
	}
	probe := bench.HostProbe{}
	var idle *bench.SandboxMemory
	id, err := api.Create(ctx)
	if err != nil {
		return fmt.Errorf("creating the idle sandbox: %w", err)
	}
	// Let it settle: the agent has answered its ping; nothing else runs.
	time.Sleep(time.Second)
	if m, err := probe.Memory(id); err == nil {
		idle = &m
	} else {
		fmt.Fprintf(e.Stderr, "bench: the idle sandbox's memory: %v\n", err)
	}
	// The same sandbox with a Python context started (issue 23).
	var idleContext *bench.SandboxMemory
	if _, err := api.StartContext(ctx, id); err != nil {
		fmt.Fprintf(e.Stderr, "bench: a context in the idle sandbox: %v\n", err)
	} else {
		time.Sleep(time.Second)
		if m, err := probe.Memory(id); err == nil {
			idleContext = &m
		}
	}
	api.Kill(ctx, id)
	var pandasContext *bench.SandboxMemory
	if dataImage != "" {
		m, err := pandasMemory(ctx, api, probe, dataImage)
		if err != nil {
			fmt.Fprintf(e.Stderr, "bench: a context with pandas imported: %v\n", err)
		} else {
			pandasContext = &m
		}
	}
	var capa *bench.Capacity
	if sb.fill > 0 {
		fmt.Fprintf(e.Stderr, "bench: sandboxes: filling up to %d idle sandboxes\n", sb.fill)
		pid := srv.cmd.Process.Pid
		c, err := bench.Fill(ctx, api, probe, bench.FillOptions{N: sb.fill, Floor: sb.floor, Other: other,
			ServerRSS: func() (int64, error) { return bench.ProcessRSS(pid) },
			Progress: func(held int) {
				if held%25 == 0 {
					fmt.Fprintf(e.Stderr, "bench: sandboxes: %d held\n", held)
				}
			}})
		if err != nil {
			return err
		}
		capa = &c
	}
	fmt.Fprintf(e.Stdout, "\nSandboxes that stay, through the API (oci/%s, a private server keeping one sandbox pre-started, and one with that pool off for the cold creates), n=%d in %d interleaved rounds, against bare /bin/sh on the host:\n\n", sb.runtime, sb.n, sb.rounds)
	bench.WriteSandboxes(e.Stdout, lat, idle, idleContext, pandasContext, capa)
	return nil
}

// pandasMemory measures an idle sandbox of image whose Python context has
// imported pandas.
func pandasMemory(ctx context.Context, api *bench.ClientSandboxes, probe bench.HostProbe, image string) (bench.SandboxMemory, error) {
	id, err := api.CreateImage(ctx, image)
	if err != nil {
		return bench.SandboxMemory{}, err
	}
	defer api.Kill(ctx, id)
	if out, err := api.Cell(ctx, id, "python", "import pandas\npandas.__version__"); err != nil {
		return bench.SandboxMemory{}, fmt.Errorf("import pandas: %w (%s)", err, out)
	}
	time.Sleep(time.Second)
	return probe.Memory(id)
}

func dirExists(dir string) bool {
	st, err := os.Stat(dir)
	return err == nil && st.IsDir()
}
