//go:build !linux

package oci

import (
	"context"
	"fmt"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Prestarter creates warm sandboxes for package pool (Linux only).
type Prestarter struct{}

// NewPrestarter returns a Prestarter that pre-starts nothing.
func NewPrestarter(d *Driver) *Prestarter { return &Prestarter{} }

// Prestart reports that warm sandboxes need Linux.
func (p *Prestarter) Prestart(ctx context.Context, lang engine.Language, limits engine.Limits) (engine.Warm, error) {
	return nil, fmt.Errorf("%w: the oci driver needs Linux", engine.ErrUnsupported)
}
