// Package probes holds the attack programs that prove a sandbox's
// protections, once, for the two places that run them: the security suite
// (package securitytest), which every driver and runtime must pass in CI,
// and vertal doctor, which runs them through the live driver on an
// operator's host and prints what holds.
//
// A Probe is data: a program, the limits it runs under, and a judgement of
// the result that says what was observed. Making a probe stronger makes
// both the suite and the doctor stronger. The package does not import
// testing; whatever depends on the host (its addresses, namespaces, a
// planted secret) comes in through Env.
package probes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Probe is one small program run in a sandbox to check one protection.
type Probe struct {
	// Name is the probe's case in the security suite (go test -run
	// 'TestSecuritySuite/crun/no_network').
	Name string
	// Protection is what the probe proves, as the doctor's table names
	// it (the sandbox package's Prot* names where one fits).
	Protection string
	// Essential probes are those without which Vertal Run must not
	// serve: the doctor exits non-zero when one fails.
	Essential bool
	// Language is the canonical language the code is written in.
	Language    string
	Code, Stdin string
	// Limits of the execution; zero fields take the defaults.
	Limits engine.Limits
	// Timeout of the execution; zero means the runner's default.
	Timeout time.Duration
	// Before are programs (same language) run first, each in its own
	// sandbox and each required to succeed, e.g. to leave state a later
	// execution must not see.
	Before []string
	// Evaluate judges the execution: whether the protection held, and
	// what was observed.
	Evaluate func(r engine.Result) (ok bool, detail string)
	// After, if set, looks at the host once the execution is over (id is
	// the execution's ID). It is consulted only when Evaluate passed.
	After func(id string, r engine.Result) (ok bool, detail string)
	// Fix tells an operator how to close the gap; FixGVisor replaces it
	// on runsc, whose gaps have other causes.
	Fix, FixGVisor string
	// GVisorGap marks a protection known not to hold under runsc
	// (FixGVisor says why and what to do). The doctor reports it as a
	// gap; the suite expects the probe to fail there, so a runsc that
	// closes the gap is noticed.
	GVisorGap bool
	// Skip, when set, says why this probe cannot run on this host.
	Skip string
}

// OnGVisor says whether the driver (by its name, e.g. "oci/runsc") runs
// sandboxes under gVisor.
func OnGVisor(driverName string) bool { return strings.HasSuffix(driverName, "/runsc") }

// RunOptions adjust Probe.Run.
type RunOptions struct {
	// Timeout of each execution whose probe sets none. Default 20s.
	Timeout time.Duration
	// Observe, if set, sees every execution (Before programs included).
	Observe func(id string, r engine.Result, err error)
}

// Outcome is what one run of a probe showed.
type Outcome struct {
	// ID and Result are the probe's own execution (not a Before's).
	ID     string
	Result engine.Result
	// Err is set when the sandbox, not the protection, failed: a Before
	// program did not succeed (ErrPrepare) or the driver returned an error.
	Err error
	// OK and Detail are the judgement, when Err is nil.
	OK     bool
	Detail string
}

// ErrPrepare marks a Before program that did not succeed.
var ErrPrepare = errors.New("preparation failed")

// Run runs p through d in the sandbox of lang: its Before programs, the
// probe, then its judgements. The context outlives each execution's own
// timeout, so the driver, not the context, ends a program that runs too
// long.
func (p Probe) Run(ctx context.Context, d engine.Driver, lang engine.Language, opts RunOptions) Outcome {
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = opts.Timeout
	}
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	run := func(code string) (string, engine.Result, error) {
		id := NewExecutionID()
		spec := engine.Spec{ID: id, Language: lang, Code: code, Stdin: p.Stdin, Timeout: timeout, Limits: p.Limits.WithDefaults(timeout)}
		rctx, cancel := context.WithTimeout(ctx, timeout+2*time.Minute)
		defer cancel()
		res, err := d.Run(rctx, spec)
		if opts.Observe != nil {
			opts.Observe(id, res, err)
		}
		return id, res, err
	}
	for _, code := range p.Before {
		if _, res, err := run(code); err != nil || res.Status != engine.StatusSucceeded {
			return Outcome{Result: res, Err: fmt.Errorf("%w: %s", ErrPrepare, Describe(res, err))}
		}
	}
	id, res, err := run(p.Code)
	o := Outcome{ID: id, Result: res, Err: err}
	if err != nil {
		return o
	}
	o.OK, o.Detail = p.Evaluate(res)
	if o.OK && p.After != nil {
		var more string
		o.OK, more = p.After(id, res)
		o.Detail = joinDetail(o.Detail, more)
	}
	return o
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

// Describe summarises an execution that did not go as planned.
func Describe(r engine.Result, err error) string {
	if err != nil {
		return err.Error()
	}
	s := fmt.Sprintf("status %s, exit %d", r.Status, r.ExitCode)
	if e := strings.TrimSpace(r.Stderr); e != "" {
		lines := strings.Split(e, "\n")
		s += ": " + OneLine(lines[len(lines)-1], 160)
	}
	return s
}

// OneLine folds s onto one line of at most n bytes.
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

// NewExecutionID makes an ID shaped like the API's ("exe_" + 32 hex).
func NewExecutionID() string {
	return "exe_" + randHex(16)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// decodeJSON reads the one JSON object a probe prints as its last line,
// after checking the program ended as it should.
func decodeJSON(r engine.Result, v any) error {
	out := strings.TrimSpace(r.Stdout)
	if i := strings.LastIndex(out, "\n"); i >= 0 {
		out = out[i+1:]
	}
	if out == "" {
		return fmt.Errorf("no output (%s)", Describe(r, nil))
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("unexpected output %q (%s)", OneLine(out, 120), Describe(r, nil))
	}
	if r.Status != engine.StatusSucceeded || r.ExitCode != 0 {
		return fmt.Errorf("the program did not finish cleanly (%s)", Describe(r, nil))
	}
	return nil
}

// markers returns the output lines that start with one of the words the
// hostile programs print when an attack worked.
func markers(r engine.Result, words ...string) []string {
	var found []string
	for _, line := range strings.Split(r.Stdout+"\n"+r.Stderr, "\n") {
		line = strings.TrimSpace(line)
		for _, w := range words {
			if strings.HasPrefix(line, w) {
				found = append(found, OneLine(line, 100))
				break
			}
		}
	}
	return found
}

// countLines counts the stdout lines starting with prefix.
func countLines(r engine.Result, prefix string) int {
	n := 0
	for _, line := range strings.Split(r.Stdout, "\n") {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

// finished checks that a marker-printing program ran to its last line.
func finished(r engine.Result, last string) error {
	if r.Status != engine.StatusSucceeded || r.ExitCode != 0 || !strings.Contains(r.Stdout, last) {
		return fmt.Errorf("the program did not finish (%s)", Describe(r, nil))
	}
	return nil
}

// pyList renders strings as a Python list literal.
func pyList(xs []string) string {
	b, _ := json.Marshal(xs)
	if xs == nil {
		return "[]"
	}
	return string(b)
}
