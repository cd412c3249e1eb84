//go:build !linux

// Package oci is the daemon-less sandbox driver: each execution is an OCI
// bundle over a shared read-only root filesystem, run by crun, runc or runsc.
// It needs Linux; elsewhere New reports the driver unavailable.
package oci

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// Options configure the driver.
type Options struct {
	Runtime      string
	StateDir     string
	CgroupParent string
	Init         string
	Logger       *slog.Logger
}

// Driver runs sandboxes with an OCI runtime binary (Linux only).
type Driver struct{ opts Options }

// New reports that the driver needs Linux.
func New(ctx context.Context, opts Options) (*Driver, error) {
	return nil, fmt.Errorf("%w: the oci driver needs Linux", engine.ErrUnavailable)
}

var _ engine.Driver = (*Driver)(nil)

func (d *Driver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	return engine.Result{}, engine.ErrUnavailable
}
func (d *Driver) Reap(ctx context.Context) (int, error) { return 0, nil }
func (d *Driver) Name() string                          { return "oci/" + d.opts.Runtime }
func (d *Driver) Runtime() string                       { return d.opts.Runtime }
func (d *Driver) Close() error                          { return nil }
func (d *Driver) Enforced() []sandbox.Protection        { return nil }
func (d *Driver) CgroupMode() string                    { return "" }
func (d *Driver) CgroupBases() []string                 { return nil }
