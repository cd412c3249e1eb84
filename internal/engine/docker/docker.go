// Package docker runs each execution as a hardened container through the Docker Engine API.
package docker

import (
	"context"
	"log/slog"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Options configure the driver.
type Options struct {
	// Runtime is "runc" (Docker's default) or "runsc" for gVisor.
	Runtime string
	// StateDir holds per-execution code directories bind-mounted read-only.
	StateDir string
	Logger   *slog.Logger
}

// Driver runs sandboxes with the Docker Engine.
type Driver struct{ opts Options }

// New connects to the Docker Engine (DOCKER_HOST or the default socket) and returns a driver.
func New(ctx context.Context, opts Options) (*Driver, error) {
	return nil, engine.ErrUnavailable
}

var _ engine.Driver = (*Driver)(nil)

func (d *Driver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	return engine.Result{}, engine.ErrUnavailable
}
func (d *Driver) Reap(ctx context.Context) (int, error) { return 0, nil }
func (d *Driver) Name() string                          { return "docker/" + d.opts.Runtime }
