package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/image"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// newSandboxes is the service of sandboxes that stay, on the driver's
// Starter and the store; its commands wait on eng's slots with executions. Without a Starter or an agent binary the server
// runs without them (logged once; their routes answer not_found with a
// message saying so); a store without their tables is an error.
func newSandboxes(cfg config.Config, st store.Store, driver engine.Driver, eng *engine.Engine, images []config.Image, nodeID string, eg *egress.Host, logger *slog.Logger) (*sandboxes.Service, error) {
	starter, ok := driver.(engine.Starter)
	if !ok {
		logger.Warn("sandboxes that stay are off: the driver cannot start them", "driver", driver.Name())
		return nil, nil
	}
	agent, err := findAgent(cfg)
	if err != nil {
		if cfg.SandboxAgent != "" {
			return nil, err
		}
		logger.Warn("sandboxes that stay are off", "error", err)
		return nil, nil
	}
	sst, ok := st.(sandboxes.Store)
	if !ok {
		return nil, fmt.Errorf("the store %T cannot hold sandboxes", st)
	}
	byName := map[string]config.Image{}
	for _, im := range images {
		byName[im.Name] = im
	}
	resolve := func(name string) (string, string, string, error) {
		if name == "" {
			name = config.DefaultImage
		}
		im, ok := byName[name]
		if !ok || len(im.Languages) == 0 {
			return "", "", "", fmt.Errorf("no image %q", name)
		}
		version := ""
		if m, err := image.ReadManifest(im.Dir); err == nil {
			version = m.Version
		}
		return im.Languages[0].Image, im.Name, version, nil
	}
	budget := int64(cfg.SandboxMemoryMB) << 20
	if budget <= 0 {
		budget = hostMemory() / 4 * 3
	}
	// The warm plan of executions' pool is the sandboxes' too.
	var warmPlans []config.Plan
	if p, ok := cfg.Plans[cfg.PoolPlan]; ok && cfg.SandboxPool > 0 {
		warmPlans = append(warmPlans, p)
	}
	return sandboxes.New(sandboxes.Options{
		MemoryBudget: budget,
		Warm:         cfg.SandboxPool,
		WarmPlans:    warmPlans,
		Admit:        eng,
		Store:        sst,
		Starter:      starter,
		Image:        resolve,
		Agent:        agent,
		DataDir:      cfg.DataDir,
		NodeID:       nodeID,
		Egress:       eg,
		Logger:       logger,
	})
}

// newEgress is the node's egress when a plan allows any (nil
// otherwise), its directory emptied of what a stopped run left: a socket
// directory per sandbox under the data dir, and the webhooks' address
// guard without the operator's webhook ranges (a sandbox never reaches a
// private, loopback or metadata address, nor this host's networks).
func newEgress(cfg config.Config, nodeID string) (*egress.Host, error) {
	if !slices.ContainsFunc(slices.Collect(maps.Values(cfg.Plans)), func(p config.Plan) bool { return p.Egress != nil }) {
		return nil, nil
	}
	o := egress.HostOptions{
		Dir:   filepath.Join(cfg.DataDir, "egress", nodeID),
		Guard: webhook.NewGuard(nil, webhook.InterfaceNetworks),
	}
	if cfg.EgressDNS != "" {
		// Validated with the configuration.
		o.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, cfg.EgressDNS)
		}}
	}
	h, err := egress.NewHost(o)
	if err != nil {
		return nil, err
	}
	if err := h.Reap(); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return h, nil
}

// agentBinary is the name of the agent that sandboxes that stay run,
// built from cmd/vertal-agent.
const agentBinary = "vertal-agent"

// findAgent resolves the agent binary: --sandbox-agent, else
// vertal-agent next to this executable, else on PATH. It must be a
// regular executable file; the driver mounts it read-only into every
// sandbox that stays.
func findAgent(cfg config.Config) (string, error) {
	var candidates []string
	if cfg.SandboxAgent != "" {
		candidates = []string{cfg.SandboxAgent}
	} else {
		if exe, err := os.Executable(); err == nil {
			candidates = append(candidates, filepath.Join(filepath.Dir(exe), agentBinary))
		}
		if p, err := exec.LookPath(agentBinary); err == nil {
			candidates = append(candidates, p)
		}
	}
	for _, c := range candidates {
		abs, err := filepath.Abs(c)
		if err != nil {
			continue
		}
		if fi, err := os.Stat(abs); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return abs, nil
		}
	}
	if cfg.SandboxAgent != "" {
		return "", fmt.Errorf("--sandbox-agent %s is not an executable file", cfg.SandboxAgent)
	}
	return "", errors.New("no " + agentBinary + " next to vertal or on PATH (build it: CGO_ENABLED=0 go build -o bin/vertal-agent ./cmd/vertal-agent)")
}

// hostMemory is the host's memory in bytes (MemTotal), 0 if unknown.
func hostMemory() int64 {
	kb, err := sandbox.ProcKB("/proc/meminfo", "MemTotal:")
	if err != nil {
		return 0
	}
	return kb << 10
}
