package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox"
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
	probes := []Probe{
		{Name: "runs python", Essential: true, Language: "python", Code: "print(6*7)",
			Evaluate: func(r engine.Result) (bool, string) {
				return r.Stdout == "42\n", "printed " + strings.TrimSpace(r.Stdout)
			}},
		{Name: "network", Essential: true, Language: "python", Code: "net",
			Evaluate: func(r engine.Result) (bool, string) { return r.Stdout == "blocked", r.Stdout },
			Fix:      "own netns"},
		{Name: "ld.so", Language: "bash", Code: "ldso",
			Evaluate: func(r engine.Result) (bool, string) { return false, "ran" },
			Fix:      "generic fix", FixGVisor: "gvisor fix"},
		{Name: "driver error", Language: "python", Code: "boom",
			Evaluate: func(engine.Result) (bool, string) { return true, "" }},
		{Name: "no such language", Language: "ruby", Code: "x", Essential: true,
			Evaluate: func(engine.Result) (bool, string) { return true, "" }},
		{Name: "skipped here", Skip: "one CPU", Language: "python", Code: "x",
			Evaluate: func(engine.Result) (bool, string) { return true, "" }},
		{Name: "fresh", Language: "python", Before: []string{"write"}, Code: "read", Essential: true,
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
	rep := Run(context.Background(), Options{Driver: d, Languages: testLangs, Host: host, Probes: probes})

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
		Probes: []Probe{{Name: "network", Essential: true}}})
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

// The probes' judgements, fed with what real sandboxes print.
func TestProbeEvaluations(t *testing.T) {
	probes := map[string]Probe{}
	for _, p := range DefaultProbes(ProbeEnv{CanaryName: "VERTAL_DOCTOR_CANARY", CanaryValue: "s3cr3t",
		HostNamespaces: map[string]string{"pid": "pid:[1]", "net": "net:[2]"}, CPUs: 2, Arch: "amd64", ProcRoot: t.TempDir()}) {
		probes[p.Name] = p
	}
	res := func(stdout string) engine.Result {
		return engine.Result{Status: engine.StatusSucceeded, Stdout: stdout}
	}
	for _, tc := range []struct {
		probe string
		r     engine.Result
		ok    bool
	}{
		{"runs python", res("42\n"), true},
		{"runs python", engine.Result{Status: engine.StatusFailed, ExitCode: 127, Stderr: "python3: not found"}, false},
		{sandbox.ProtNetwork, res(`{"reachable": [], "blocked": ["tcp 1.1.1.1:443", "dns"], "interfaces": ["lo"]}`), true},
		{sandbox.ProtNetwork, res(`{"reachable": ["tcp 10.0.0.2:22 refused (so routable)"], "blocked": [], "interfaces": ["eth0", "lo"]}`), false},
		{sandbox.ProtNetwork, engine.Result{Status: engine.StatusFailed, Stderr: "Traceback"}, false},
		{sandbox.ProtReadonly, res(`{"/": "Read-only file system", "/dev/shm": "No such file or directory"}`), true},
		{sandbox.ProtReadonly, res(`{"/": "Read-only file system", "/dev/shm": "WRITABLE"}`), false},
		{"/tmp: no exec, size-limited", res(`{"exec": "denied (Permission denied)", "fill": "stopped at 16 MB", "mb": 16, "options": "rw,nosuid,nodev,noexec"}`), true},
		{"/tmp: no exec, size-limited", res(`{"exec": "allowed", "fill": "stopped at 16 MB", "mb": 16}`), false},
		{"/tmp: no exec, size-limited", res(`{"exec": "denied (Permission denied)", "fill": "unbounded", "mb": 64}`), false},
		{"/tmp mount options noexec,nosuid,nodev", res(`{"options": "rw,nosuid,nodev,noexec,relatime,rw,size=16384k"}`), true},
		{"/tmp mount options noexec,nosuid,nodev", res(`{"options": "rw,noexec,rw,mode=1777"}`), false},
		{"/tmp noexec also through the dynamic loader", res(`{"ldso": "refused: failed to map segment"}`), true},
		{"/tmp noexec also through the dynamic loader", res(`{"ldso": "ran"}`), false},
		{sandbox.ProtUser, res(`{"uid": 2000000042, "euid": 2000000042, "gid": 2000000042, "egid": 2000000042, "groups": []}`), true},
		{sandbox.ProtUser, res(`{"uid": 2000000042, "euid": 2000000042, "gid": 2000000042, "egid": 2000000042, "groups": [0]}`), false},
		{sandbox.ProtUser, res(`{"uid": 65534, "euid": 65534, "gid": 65534, "egid": 65534, "groups": []}`), false}, // shared by every sandbox
		{sandbox.ProtUser, res(`{"uid": 0, "euid": 0, "gid": 0, "egid": 0, "groups": []}`), false},
		{sandbox.ProtCaps, res(`{"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "prctl_no_new_privs": "1"}`), true},
		{sandbox.ProtCaps, res(`{"CapEff": "00000000a80425fb", "prctl_no_new_privs": "1"}`), false},
		{sandbox.ProtNoNewPrivs, res(`{"NoNewPrivs": "1", "prctl_no_new_privs": "1"}`), true},
		{sandbox.ProtNoNewPrivs, res(`{"prctl_no_new_privs": "1"}`), true}, // gVisor has no status line
		{sandbox.ProtNoNewPrivs, res(`{"NoNewPrivs": "0", "prctl_no_new_privs": "0"}`), false},
		{sandbox.ProtSeccomp, res(`{"io_uring_setup": "Function not implemented", "bpf": "Operation not permitted", "_seccomp_mode": "2"}`), true},
		{sandbox.ProtSeccomp, res(`{"io_uring_setup": "ALLOWED", "bpf": "Operation not permitted", "_seccomp_mode": "2"}`), false},
		{sandbox.ProtNamespaces, res(`{"hostname": "sandbox", "pid": "pid:[9]", "net": "net:[8]"}`), true},
		{sandbox.ProtNamespaces, res(`{"hostname": "host", "pid": "pid:[1]", "net": "net:[8]"}`), false},
		{sandbox.ProtMasked, res(`{"/proc/kcore": "empty", "/sys/firmware": "No such file or directory"}`), true},
		{sandbox.ProtMasked, res(`{"/proc/kcore": "READABLE"}`), false},
		{sandbox.ProtEnv, res(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp"}, "fds": [0, 1, 2, 3]}`), true},
		{sandbox.ProtEnv, res(`{"env": {"PATH": "/usr/bin", "VERTAL_DOCTOR_CANARY": "s3cr3t"}, "fds": [0, 1, 2, 3]}`), false},
		{sandbox.ProtEnv, res(`{"env": {"PATH": "/usr/bin"}, "fds": [0, 1, 2, 3, 4]}`), false},
		{sandbox.ProtMemory, engine.Result{Status: engine.StatusMemoryExceeded, ExitCode: 137}, true},
		{sandbox.ProtMemory, res("536870912\n"), false},
		{sandbox.ProtPids, res(`{"forked": 61, "error": "Resource temporarily unavailable"}`), true},
		{sandbox.ProtPids, res(`{"forked": 300, "error": ""}`), false},
		{sandbox.ProtCPU, engine.Result{Status: engine.StatusSucceeded, Stdout: `{"cpu": 3.0, "wall": 1.5}`, Duration: 1600e6, Usage: engine.Usage{CPUSeconds: 1.6}}, true},
		{sandbox.ProtCPU, res(`{"cpu": 2.9, "wall": 1.5}`), false},
		{sandbox.ProtFileSize, res(`{"size": 1048576, "error": "File too large"}`), true},
		{sandbox.ProtFileSize, res(`{"size": 2097152, "error": ""}`), false},
		{"output capped per stream", engine.Result{Status: engine.StatusSucceeded, Truncated: true,
			Stdout: strings.Repeat("x", engine.DefaultOutputBytes), Stderr: strings.Repeat("y", engine.DefaultOutputBytes)}, true},
		{"output capped per stream", engine.Result{Status: engine.StatusSucceeded, Stdout: strings.Repeat("x", 1000000)}, false},
		{sandbox.ProtTimeout, engine.Result{Status: engine.StatusTimedOut, ExitCode: 137}, true},
		{sandbox.ProtTimeout, engine.Result{Status: engine.StatusSucceeded}, false},
		{"fresh sandbox per execution", res("clean\n"), true},
		{"fresh sandbox per execution", res("LEFT\n"), false},
	} {
		p, found := probes[tc.probe]
		if !found {
			t.Fatalf("no probe %q", tc.probe)
		}
		ok, detail := p.Evaluate(tc.r)
		if ok != tc.ok {
			t.Errorf("%s with %q: ok=%v (%s); want %v", tc.probe, oneLine(tc.r.Stdout, 80), ok, detail, tc.ok)
		}
	}
}

// The timeout probe's host check finds a surviving process by its marker.
func TestFindProcesses(t *testing.T) {
	proc := t.TempDir()
	for pid, cmdline := range map[string]string{
		"100":  "sleep\x00100\x00",
		"200":  "vertal-doctor-abc\x001000\x00",
		"300":  "runsc\x00--root\x00/run\x00exe_123\x00",
		"self": "not a pid",
	} {
		os.MkdirAll(filepath.Join(proc, pid), 0o755)
		os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(cmdline), 0o644)
	}
	got := findProcesses(proc, "vertal-doctor-abc", "exe_123")
	want := []string{"200: vertal-doctor-abc 1000", "300: runsc --root /run exe_123"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestProbeSkips(t *testing.T) {
	for _, p := range DefaultProbes(ProbeEnv{CPUs: 1, Arch: "arm64"}) {
		switch p.Name {
		case sandbox.ProtCPU, sandbox.ProtSeccomp:
			if p.Skip == "" {
				t.Errorf("%s should be skipped on a 1-CPU arm64 host", p.Name)
			}
		default:
			if p.Skip != "" {
				t.Errorf("%s skipped: %s", p.Name, p.Skip)
			}
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
