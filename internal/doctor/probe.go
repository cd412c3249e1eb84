package doctor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Probe is one small program run in a sandbox to check one protection.
type Probe struct {
	// Name is the protection, as in the sandbox package's Prot* names.
	Name      string
	Essential bool
	// Language is the canonical language the code is written in.
	Language string
	Code     string
	Limits   engine.Limits
	// Timeout of the execution; zero means Options.ProbeTimeout.
	Timeout time.Duration
	// Before are programs (same language) run first, each in its own
	// sandbox, e.g. to leave state a later execution must not see.
	Before []string
	// Evaluate judges the execution: whether the protection held, and
	// what was observed.
	Evaluate func(r engine.Result) (ok bool, detail string)
	// After, if set, looks at the host once the execution is over (id
	// is the execution's ID).
	After func(id string, r engine.Result) (ok bool, detail string)
	// Fix tells an operator how to close the gap; FixGVisor replaces it
	// on runsc, whose gaps have other causes.
	Fix, FixGVisor string
	// Skip, when set, says why this probe cannot run on this host.
	Skip string
}

func runProbe(ctx context.Context, opts Options, langs map[string]engine.Language, p Probe) Check {
	c := Check{Group: "isolation", Name: p.Name, Essential: p.Essential}
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
	if p.FixGVisor != "" && strings.HasSuffix(opts.Driver.Name(), "/runsc") {
		fix = p.FixGVisor
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = opts.ProbeTimeout
	}
	run := func(code string) (string, engine.Result, error) {
		id := newExecutionID()
		spec := engine.Spec{ID: id, Language: lang, Code: code, Timeout: timeout, Limits: p.Limits.WithDefaults()}
		// The context outlives the sandbox's own timeout so the driver,
		// not the context, ends a probe that runs too long.
		rctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
		defer cancel()
		res, err := opts.Driver.Run(rctx, spec)
		opts.Logger.Debug("doctor probe", "probe", p.Name, "id", id, "status", res.Status, "exit", res.ExitCode,
			"stdout", oneLine(res.Stdout, 300), "stderr", oneLine(res.Stderr, 300), "err", err)
		return id, res, err
	}
	for _, code := range p.Before {
		if _, res, err := run(code); err != nil || res.Status != engine.StatusSucceeded {
			c.Status, c.Detail, c.Fix = StatusFail, "preparation failed: "+describe(res, err), fix
			return c
		}
	}
	id, res, err := run(p.Code)
	if err != nil {
		c.Status, c.Detail = StatusFail, "the driver failed: "+err.Error()
		c.Fix = "the sandbox could not run; see the error (and vertal doctor --verbose)"
		return c
	}
	ok, detail := p.Evaluate(res)
	if ok && p.After != nil {
		var more string
		ok, more = p.After(id, res)
		detail = joinDetail(detail, more)
	}
	c.Detail = detail
	if ok {
		c.Status = StatusOK
	} else {
		c.Status, c.Fix = StatusFail, fix
	}
	return c
}

func joinDetail(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// describe summarises an execution that did not go as planned.
func describe(r engine.Result, err error) string {
	if err != nil {
		return err.Error()
	}
	s := fmt.Sprintf("status %s, exit %d", r.Status, r.ExitCode)
	if e := strings.TrimSpace(r.Stderr); e != "" {
		lines := strings.Split(e, "\n")
		s += ": " + oneLine(lines[len(lines)-1], 160)
	}
	return s
}

// newExecutionID makes an ID shaped like the API's ("exe_" + 32 hex).
func newExecutionID() string {
	var b [16]byte
	rand.Read(b[:])
	return "exe_" + hex.EncodeToString(b[:])
}

// decodeJSON reads the one JSON object a probe prints as its last line.
func decodeJSON(r engine.Result, v any) error {
	out := strings.TrimSpace(r.Stdout)
	if i := strings.LastIndex(out, "\n"); i >= 0 {
		out = out[i+1:]
	}
	if out == "" {
		return fmt.Errorf("no output (%s)", describe(r, nil))
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("unexpected output %q (%s)", oneLine(out, 120), describe(r, nil))
	}
	return nil
}
