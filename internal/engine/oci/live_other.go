//go:build !linux

package oci

import (
	"context"
	"fmt"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

var _ engine.Starter = (*Driver)(nil)

// Start reports that live sandboxes need Linux.
func (d *Driver) Start(ctx context.Context, spec engine.LiveSpec) (engine.Live, error) {
	return nil, fmt.Errorf("%w: the oci driver needs Linux", engine.ErrUnsupported)
}
