// Package oci is the daemon-less sandbox driver: each execution is an OCI
// bundle over a shared read-only root filesystem, run by crun, runc or runsc.
package oci

import (
	"context"
	"log/slog"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Options configure the driver.
type Options struct {
	// Runtime is "crun", "runc", "runsc" or "" to pick the best installed.
	Runtime string
	// StateDir holds bundles and runtime state; it is cleaned by Reap.
	StateDir string
	Logger   *slog.Logger
}

// Driver runs sandboxes with an OCI runtime binary.
type Driver struct{ opts Options }

// New checks that the runtime is usable and returns a driver.
func New(ctx context.Context, opts Options) (*Driver, error) {
	return nil, engine.ErrUnavailable
}

var _ engine.Driver = (*Driver)(nil)

func (d *Driver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	return engine.Result{}, engine.ErrUnavailable
}
func (d *Driver) Reap(ctx context.Context) (int, error) { return 0, nil }
func (d *Driver) Name() string                          { return "oci/" + d.opts.Runtime }
