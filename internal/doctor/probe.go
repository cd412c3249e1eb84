package doctor

import (
	"context"
	"errors"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// runProbe runs one probe (package probes, shared with the security
// suite) through the live driver and turns its outcome into a row.
func runProbe(ctx context.Context, opts Options, langs map[string]engine.Language, p probes.Probe) Check {
	c := Check{Group: "isolation", Name: p.Protection, Essential: p.Essential}
	if p.Skip != "" {
		c.Status, c.Detail = StatusSkipped, p.Skip
		return c
	}
	lang, ok := langs[p.Language]
	if !ok {
		c.Status, c.Detail = StatusSkipped, "language "+p.Language+" is not configured"
		return c
	}
	fix := p.Fix
	if p.FixGVisor != "" && probes.OnGVisor(opts.Driver.Name()) {
		fix = p.FixGVisor
	}
	o := p.Run(ctx, opts.Driver, lang, probes.RunOptions{Timeout: opts.ProbeTimeout,
		Observe: func(id string, res engine.Result, err error) {
			opts.Logger.Debug("doctor probe", "probe", p.Name, "id", id, "status", res.Status, "exit", res.ExitCode,
				"stdout", oneLine(res.Stdout, 300), "stderr", oneLine(res.Stderr, 300), "err", err)
		}})
	switch {
	case errors.Is(o.Err, probes.ErrPrepare):
		c.Status, c.Detail, c.Fix = StatusFail, o.Err.Error(), fix
	case o.Err != nil:
		c.Status, c.Detail = StatusFail, "the driver failed: "+o.Err.Error()
		c.Fix = "the sandbox could not run; see the error (and vertal doctor --verbose)"
	case o.OK:
		c.Status, c.Detail = StatusOK, o.Detail
	default:
		c.Status, c.Detail, c.Fix = StatusFail, o.Detail, fix
	}
	return c
}
