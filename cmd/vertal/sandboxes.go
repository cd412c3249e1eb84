package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

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
