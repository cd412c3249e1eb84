// Package doctor checks that a host can run Vertal Run sandboxes and proves,
// by running small hostile programs through the real driver, which
// protections are enforced on it.
//
// The checks are in two groups. Host checks read the machine: root,
// cgroups, the runtime binary, the image. Isolation probes run code in a
// sandbox exactly as an execution would (through engine.Driver) and look
// at what it could and could not do: reach the network, write outside
// /tmp, run as root, exceed its memory, processes or time. The probes are
// those of package probes, which the security suite runs as cases too, so
// what the doctor proves on a host is what CI proves on every runtime. The
// egress group (egress.go) lists the plans that allow egress and proves,
// in a sandbox that stays, that its one way out, the agent's relay to the
// host's proxy socket, works and that there is no other. The result is a
// table of what is enforced and, for every gap, how to fix it.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// Status is the outcome of one check.
type Status string

const (
	StatusOK      Status = "ok"      // works or is enforced
	StatusFail    Status = "FAIL"    // broken or not enforced
	StatusWarn    Status = "warn"    // works, with a caveat worth reading
	StatusSkipped Status = "skipped" // could not be checked here (e.g. no driver)
)

// Check is one row of the doctor's table.
type Check struct {
	Group  string `json:"group"` // "host", "image", "driver", "isolation", "egress"
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail is what was observed.
	Detail string `json:"detail,omitempty"`
	// Fix says how to close the gap; set when Status is FAIL or warn.
	Fix string `json:"fix,omitempty"`
	// Essential marks checks without which Vertal Run must not serve.
	Essential bool `json:"essential"`
}

// Report is the whole result.
type Report struct {
	Driver string  `json:"driver"`
	Checks []Check `json:"checks"`
}

// Failed returns the essential checks that failed: any makes the command
// exit non-zero.
func (r Report) Failed() []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Essential && c.Status == StatusFail {
			out = append(out, c)
		}
	}
	return out
}

// Counts tallies the checks by status.
func (r Report) Counts() map[Status]int {
	m := map[Status]int{}
	for _, c := range r.Checks {
		m[c.Status]++
	}
	return m
}

// Options configure Run.
type Options struct {
	// Driver runs the isolation probes; nil when it could not be created,
	// in which case DriverErr says why and the probes are skipped.
	Driver    engine.Driver
	DriverErr error
	// DriverName is shown when Driver is nil (e.g. "oci/crun").
	DriverName string
	// Languages are the configured languages; probes pick theirs by name.
	Languages []engine.Language
	// Host are checks made before the probes (see HostChecks).
	Host []Check
	// Probes run through the driver; nil means probes.All(probes.Env{}).
	Probes []probes.Probe
	// HostOnly skips the driver and the probes.
	HostOnly bool
	// Pool, when set, is a warm pool over Driver: the doctor checks that
	// each language runs warm and reports the pool's state.
	Pool WarmPool
	// PoolWait bounds the wait for a pre-started sandbox. Default 30s.
	PoolWait time.Duration
	// Egress, when set, adds the egress group: the plans that allow
	// egress, and a live sandbox proving the relay to the host's socket
	// (needs a Driver that is an engine.Starter).
	Egress *EgressOptions
	// ProbeTimeout bounds each probe execution unless the probe says
	// otherwise.
	ProbeTimeout time.Duration
	Logger       *slog.Logger
}

// Run performs the checks and returns the report. It never stops early:
// an operator wants every gap at once.
func Run(ctx context.Context, opts Options) Report {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 20 * time.Second
	}
	if opts.Probes == nil {
		opts.Probes = probes.All(probes.Env{})
	}
	rep := Report{Driver: opts.DriverName}
	rep.Checks = append(rep.Checks, opts.Host...)
	if opts.HostOnly {
		if opts.Egress != nil {
			rep.Checks = append(rep.Checks, egressChecks(ctx, opts, "--host-only: no sandbox runs")...)
		}
		return rep
	}

	if opts.Driver == nil {
		detail := "not created"
		if opts.DriverErr != nil {
			detail = opts.DriverErr.Error()
		}
		rep.Checks = append(rep.Checks, Check{Group: "driver", Name: "driver " + opts.DriverName, Status: StatusFail,
			Detail: detail, Fix: fixFromError(opts.DriverErr), Essential: true})
		for _, p := range opts.Probes {
			rep.Checks = append(rep.Checks, Check{Group: "isolation", Name: p.Protection, Status: StatusSkipped,
				Detail: "no working driver", Essential: p.Essential})
		}
		if opts.Egress != nil {
			rep.Checks = append(rep.Checks, egressChecks(ctx, opts, "no working driver")...)
		}
		return rep
	}
	rep.Driver = opts.Driver.Name()
	rep.Checks = append(rep.Checks, Check{Group: "driver", Name: "driver " + rep.Driver, Status: StatusOK, Detail: "created", Essential: true})
	if n, err := opts.Driver.Reap(ctx); err != nil {
		rep.Checks = append(rep.Checks, Check{Group: "driver", Name: "reap leftovers", Status: StatusWarn,
			Detail: err.Error(), Fix: "see the error; leftovers of a crashed server may remain"})
	} else {
		rep.Checks = append(rep.Checks, Check{Group: "driver", Name: "reap leftovers", Status: StatusOK,
			Detail: fmt.Sprintf("%d removed", n)})
	}
	rep.Checks = append(rep.Checks, cgroupRows(opts.Driver)...)

	langs := map[string]engine.Language{}
	for _, l := range opts.Languages {
		langs[l.Name] = l
	}
	for _, p := range opts.Probes {
		rep.Checks = append(rep.Checks, runProbe(ctx, opts, langs, p))
	}
	if opts.Egress != nil {
		rep.Checks = append(rep.Checks, egressChecks(ctx, opts, "")...)
	}
	if opts.Pool != nil {
		if opts.PoolWait <= 0 {
			opts.PoolWait = 30 * time.Second
		}
		rep.Checks = append(rep.Checks, poolChecks(ctx, opts.Pool, opts.Languages, opts.PoolWait)...)
	}
	return rep
}

// cgroupDriver is a driver that manages cgroups itself (the oci driver).
type cgroupDriver interface {
	CgroupMode() string
	CgroupBases() []string
	Enforced() []sandbox.Protection
}

// cgroupRows say which cgroup mode the driver runs on, where the
// sandboxes' cgroups live, and what enforces each cgroup-backed limit in
// that mode. The isolation probes then show each limit working.
func cgroupRows(d engine.Driver) []Check {
	cd, ok := d.(cgroupDriver)
	if !ok {
		return nil
	}
	where := "?"
	if bases := cd.CgroupBases(); len(bases) == 1 {
		where = bases[0]
	} else if len(bases) > 1 {
		where = fmt.Sprintf("%s and %d more hierarchies", bases[0], len(bases)-1)
	}
	rows := []Check{{Group: "cgroups", Name: "cgroup mode", Status: StatusOK,
		Detail: cd.CgroupMode() + "; sandboxes' cgroups under " + where}}
	for _, p := range cd.Enforced() {
		switch p.Name {
		case sandbox.ProtMemory, sandbox.ProtCPU, sandbox.ProtPids, sandbox.ProtTimeout:
			st := StatusOK
			if !p.Enforced {
				st = StatusFail
			}
			rows = append(rows, Check{Group: "cgroups", Name: p.Name, Status: st, Detail: p.How, Fix: p.Fix})
		}
	}
	return rows
}

// fixFromError turns a driver construction error into a fix. The drivers'
// ErrUnavailable messages already say what to install; the fix repeats the
// part after the last colon that reads like an instruction.
func fixFromError(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	for _, sep := range []string{": install ", ": build ", " (apt-get install "} {
		if i := strings.LastIndex(msg, sep); i >= 0 {
			return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(msg[i+1:]), "("), ")")
		}
	}
	return "see the error above"
}

// WriteTable renders the report for a terminal or a log: one section per
// group, one line per check, then the fixes for every gap.
func (r Report) WriteTable(w io.Writer) error {
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	var b strings.Builder
	group := ""
	for _, c := range r.Checks {
		if c.Group != group {
			if group != "" {
				b.WriteString("\n")
			}
			group = c.Group
			b.WriteString(strings.ToUpper(groupTitle(group, r.Driver)) + "\n")
		}
		mark := string(c.Status)
		if c.Status == StatusFail && !c.Essential {
			mark = "GAP" // not enforced, but not a reason to refuse to serve
		}
		fmt.Fprintf(&b, "  %-7s %-*s  %s\n", mark, width, c.Name, oneLine(c.Detail, 140))
	}
	var fixes []Check
	for _, c := range r.Checks {
		if (c.Status == StatusFail || c.Status == StatusWarn) && c.Fix != "" {
			fixes = append(fixes, c)
		}
	}
	if len(fixes) > 0 {
		b.WriteString("\nHOW TO FIX\n")
		for _, c := range fixes {
			fmt.Fprintf(&b, "  - %s: %s\n", c.Name, c.Fix)
		}
	}
	n := r.Counts()
	fmt.Fprintf(&b, "\n%d ok, %d failed or not enforced (%d essential), %d warnings, %d skipped\n",
		n[StatusOK], n[StatusFail], len(r.Failed()), n[StatusWarn], n[StatusSkipped])
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON renders the report as JSON for scripts.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func groupTitle(g, driver string) string {
	if g == "isolation" && driver != "" {
		return "isolation (live, through " + driver + ")"
	}
	return g
}

func oneLine(s string, n int) string { return probes.OneLine(s, n) }
