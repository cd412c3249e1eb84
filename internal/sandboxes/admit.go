package sandboxes

import (
	"context"
	"errors"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// Admitter hands out the node's sandbox slots fairly between tenants;
// *engine.Engine has it, the same one executions wait on, so a tenant's
// sandbox commands and executions share its plan's slots and the node's.
type Admitter interface {
	Admit(ctx context.Context, a engine.Admission) (release func(), err error)
}

var _ Admitter = (*engine.Engine)(nil)

// admit takes a slot for a command of c's: a foreground command holds it
// until it exits, a background one only while it starts (docs/SANDBOXES.md,
// "Fairness"). A full share or queue is 503 overloaded with Retry-After,
// as for executions. Without an Admitter every command is admitted.
func (s *Service) admit(ctx context.Context, c execution.Caller) (release func(), err error) {
	if s.opts.Admit == nil {
		return func() {}, nil
	}
	release, err = s.opts.Admit.Admit(ctx, engine.Admission{Tenant: c.Key.Tenant, Limit: c.Plan.MaxConcurrent})
	if errors.Is(err, engine.ErrBusy) {
		return nil, execution.Busy()
	}
	return release, err
}
