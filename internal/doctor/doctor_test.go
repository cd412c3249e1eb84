package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// fakeDriver answers each execution from a table keyed by the code, and
// records what it was asked to run.
type fakeDriver struct {
	name    string
	answers map[string]engine.Result
	errs    map[string]error
	reapErr error

	mu   sync.Mutex
	seen []engine.Spec
}

func (f *fakeDriver) Run(_ context.Context, spec engine.Spec) (engine.Result, error) {
	f.mu.Lock()
	f.seen = append(f.seen, spec)
	f.mu.Unlock()
	if err := f.errs[spec.Code]; err != nil {
		return engine.Result{}, err
	}
	if r, ok := f.answers[spec.Code]; ok {
		return r, nil
	}
	return engine.Result{Status: engine.StatusFailed, ExitCode: 1, Stderr: "unexpected program"}, nil
}
func (f *fakeDriver) Reap(context.Context) (int, error) { return 2, f.reapErr }
func (f *fakeDriver) Name() string                      { return f.name }

var testLangs = []engine.Language{{Name: "python"}, {Name: "bash"}}

func ok42() engine.Result { return engine.Result{Status: engine.StatusSucceeded, Stdout: "42\n"} }

func TestRunTableAndExit(t *testing.T) {
	ps := []probes.Probe{
		{Protection: "runs python", Essential: true, Language: "python", Code: "print(6*7)",
			Evaluate: func(r engine.Result) (bool, string) {
				return r.Stdout == "42\n", "printed " + strings.TrimSpace(r.Stdout)
			}},
		{Protection: "network", Essential: true, Language: "python", Code: "net",
			Evaluate: func(r engine.Result) (bool, string) { return r.Stdout == "blocked", r.Stdout },
			Fix:      "own netns"},
		{Protection: "ld.so", Language: "bash", Code: "ldso",
			Evaluate: func(r engine.Result) (bool, string) { return false, "ran" },
			Fix:      "generic fix", FixGVisor: "gvisor fix"},
		{Protection: "driver error", Language: "python", Code: "boom",
			Evaluate: func(engine.Result) (bool, string) { return true, "" }},
		{Protection: "no such language", Language: "ruby", Code: "x", Essential: true,
			Evaluate: func(engine.Result) (bool, string) { return true, "" }},
		{Protection: "skipped here", Skip: "one CPU", Language: "python", Code: "x",
			Evaluate: func(engine.Result) (bool, string) { return true, "" }},
		{Protection: "fresh", Language: "python", Before: []string{"write"}, Code: "read", Essential: true,
			Evaluate: func(r engine.Result) (bool, string) { return r.Stdout == "clean", r.Stdout }},
	}
	d := &fakeDriver{name: "oci/runsc", answers: map[string]engine.Result{
		"print(6*7)": ok42(),
		"net":        {Status: engine.StatusSucceeded, Stdout: "reached 1.1.1.1"},
		"ldso":       {Status: engine.StatusSucceeded},
		"write":      {Status: engine.StatusSucceeded},
		"read":       {Status: engine.StatusSucceeded, Stdout: "clean"},
	}, errs: map[string]error{"boom": errors.New("runtime exploded")}}

	host := []Check{{Group: "host", Name: "cgroups", Status: StatusOK, Detail: "v2", Essential: true}}
	rep := Run(context.Background(), Options{Driver: d, Languages: testLangs, Host: host, Probes: ps})

	type row struct {
		Name      string
		Status    Status
		Essential bool
		Fix       string
	}
	var got []row
	for _, c := range rep.Checks {
		got = append(got, row{c.Name, c.Status, c.Essential, c.Fix})
	}
	want := []row{
		{"cgroups", StatusOK, true, ""},
		{"driver oci/runsc", StatusOK, true, ""},
		{"reap leftovers", StatusOK, false, ""},
		{"runs python", StatusOK, true, ""},
		{"network", StatusFail, true, "own netns"},
		{"ld.so", StatusFail, false, "gvisor fix"}, // runsc gets its own fix
		{"driver error", StatusFail, false, "the sandbox could not run; see the error (and vertal doctor --verbose)"},
		{"no such language", StatusSkipped, true, ""},
		{"skipped here", StatusSkipped, false, ""},
		{"fresh", StatusOK, true, ""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("checks (-want +got):\n%s", diff)
	}
	if failed := rep.Failed(); len(failed) != 1 || failed[0].Name != "network" {
		t.Errorf("Failed() = %+v; want only the essential network check", failed)
	}
	// Every probe got its own sandbox ID, with default limits filled in.
	ids := map[string]bool{}
	for _, s := range d.seen {
		if ids[s.ID] || !strings.HasPrefix(s.ID, "exe_") || len(s.ID) != 36 {
			t.Errorf("bad or reused execution ID %q", s.ID)
		}
		ids[s.ID] = true
		if s.Limits.MemoryBytes != engine.DefaultMemoryBytes || s.Timeout <= 0 {
			t.Errorf("spec %q: limits %+v timeout %v", s.Code, s.Limits, s.Timeout)
		}
	}
	if d.seen[len(d.seen)-2].Code != "write" {
		t.Errorf("Before program did not run before the probe: %v", d.seen)
	}

	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"ISOLATION (LIVE, THROUGH OCI/RUNSC)",
		"  FAIL    network ",
		"  GAP     ld.so ", // not essential: a gap, not a failure
		"HOW TO FIX\n  - network: own netns\n  - ld.so: gvisor fix\n",
		"5 ok, 3 failed or not enforced (1 essential), 0 warnings, 2 skipped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestRunWithoutDriver(t *testing.T) {
	err := fmt.Errorf("%w: crun not found in PATH (apt-get install crun)", engine.ErrUnavailable)
	rep := Run(context.Background(), Options{DriverName: "oci/crun", DriverErr: err,
		Probes: []probes.Probe{{Protection: "network", Essential: true}}})
	if len(rep.Checks) != 2 {
		t.Fatalf("checks: %+v", rep.Checks)
	}
	drv := rep.Checks[0]
	if drv.Status != StatusFail || !drv.Essential || drv.Fix != "apt-get install crun" {
		t.Errorf("driver check %+v; want an essential failure whose fix is the install command", drv)
	}
	if rep.Checks[1].Status != StatusSkipped {
		t.Errorf("probe without driver: %+v", rep.Checks[1])
	}
	if len(rep.Failed()) != 1 {
		t.Errorf("Failed: %+v", rep.Failed())
	}
}

func TestFixFromError(t *testing.T) {
	for msg, want := range map[string]string{
		"engine: sandbox driver unavailable: cannot reach the Docker engine at unix:///var/run/docker.sock (EOF): install docker.io and start dockerd": "install docker.io and start dockerd",
		"engine: sandbox driver unavailable: crun not found in PATH (apt-get install crun)":                                                            "apt-get install crun",
		"something odd": "see the error above",
	} {
		if got := fixFromError(errors.New(msg)); got != want {
			t.Errorf("fixFromError(%q) = %q; want %q", msg, got, want)
		}
	}
}

// cgroupFake is a driver that reports its cgroup mode, as the oci driver does.
type cgroupFake struct {
	fakeDriver
	mode  string
	bases []string
	prots []sandbox.Protection
}

func (c *cgroupFake) CgroupMode() string             { return c.mode }
func (c *cgroupFake) CgroupBases() []string          { return c.bases }
func (c *cgroupFake) Enforced() []sandbox.Protection { return c.prots }

func TestCgroupRows(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    engine.Driver
		want []Check
	}{
		{"no cgroups of its own", &fakeDriver{name: "docker/runc"}, nil},
		{"v2 with gaps", &cgroupFake{mode: "v2", bases: []string{"/sys/fs/cgroup/system.slice/vertal.service/vertal"}, prots: []sandbox.Protection{
			{Name: sandbox.ProtMemory, Enforced: true, How: "memory.max"},
			{Name: sandbox.ProtNetwork, Enforced: true, How: "netns"},
			{Name: sandbox.ProtPids, Enforced: false, How: "none", Fix: "enable pids"},
		}}, []Check{
			{Group: "cgroups", Name: "cgroup mode", Status: StatusOK, Detail: "v2; sandboxes' cgroups under /sys/fs/cgroup/system.slice/vertal.service/vertal"},
			{Group: "cgroups", Name: sandbox.ProtMemory, Status: StatusOK, Detail: "memory.max"},
			{Group: "cgroups", Name: sandbox.ProtPids, Status: StatusFail, Detail: "none", Fix: "enable pids"},
		}},
		{"v1 hierarchies", &cgroupFake{mode: "hybrid", bases: []string{"/sys/fs/cgroup/memory/vertal", "/sys/fs/cgroup/pids/vertal"}}, []Check{
			{Group: "cgroups", Name: "cgroup mode", Status: StatusOK, Detail: "hybrid; sandboxes' cgroups under /sys/fs/cgroup/memory/vertal and 1 more hierarchies"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, cgroupRows(tc.d)); diff != "" {
				t.Errorf("cgroupRows (-want +got):\n%s", diff)
			}
		})
	}
}
