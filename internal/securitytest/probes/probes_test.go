package probes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

func ok(stdout string) engine.Result {
	return engine.Result{Status: engine.StatusSucceeded, Stdout: stdout}
}

const identityOK = `{"uid": 2000000042, "euid": 2000000042, "gid": 2000000042, "egid": 2000000042, "groups": [],
 "status": {"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"},
 "prctl_no_new_privs": 1, "capget": [0, 0, 0, 0, 0, 0], "bounding": [], "ambient": [],
 "escalation": {"setuid": "Operation not permitted", "setgid": "Operation not permitted", "setgroups": "Operation not permitted"}}`

func identityWith(old, new string) engine.Result {
	return ok(strings.ReplaceAll(strings.Replace(identityOK, old, new, 1), "\n", ""))
}

func seccompOutput(allowed string, mode string) engine.Result {
	var b strings.Builder
	for _, c := range seccompCalls {
		if c.name == allowed {
			b.WriteString("ALLOWED " + c.name + " 0 0\n")
		} else {
			b.WriteString("blocked " + c.name + " 1\n")
		}
	}
	b.WriteString("mode " + mode + "\nchecked\n")
	return ok(b.String())
}

// The probes' judgements, fed with what real sandboxes print.
func TestEvaluations(t *testing.T) {
	env := Env{CanaryName: "VERTAL_DOCTOR_CANARY_AB12", CanaryValue: "s3cr3t", Hostname: "buildhost",
		HostNamespaces: map[string]string{"pid": "pid:[1]", "net": "net:[2]"}, CPUs: 2, Arch: "amd64", ProcRoot: t.TempDir()}
	byName := map[string]Probe{}
	for _, p := range All(env) {
		byName[p.Name] = p
	}
	measured := engine.Result{Status: engine.StatusSucceeded, Stdout: "42\n", Duration: 90e6,
		Usage: engine.Usage{SandboxSeconds: 0.09, CPUSeconds: 0.03, PeakMemoryBytes: 9 << 20}}
	unmeasured := measured
	unmeasured.Usage = engine.Usage{}
	withStderr := measured
	withStderr.Stderr = "warning\n"
	fill := func(tmp, code string) engine.Result {
		dir := func(exec, fill string) string {
			return `{"direct": "` + exec + `", "env": "refused (exit 126)", ` + fill + `, "error": "No space left on device"}`
		}
		shm := dir("denied (Permission denied)", `"bytes": 67000000, "errno": 28`)
		return ok(`{"/tmp": ` + dir("denied (Permission denied)", tmp) + `, "/code": ` + dir("denied (Permission denied)", code) + `, "/dev/shm": ` + shm + `}`)
	}
	const full = `"bytes": 16000000, "errno": 28`
	cpu := func(cpuSecs, secs float64) engine.Result {
		return engine.Result{Status: engine.StatusSucceeded, Stdout: "spun\n", Usage: engine.Usage{CPUSeconds: cpuSecs, SandboxSeconds: secs}}
	}
	for _, tc := range []struct {
		probe string
		r     engine.Result
		ok    bool
	}{
		{"hello/python", measured, true},
		{"hello/python", unmeasured, false},
		{"hello/python", withStderr, false},
		{"hello/python", engine.Result{Status: engine.StatusFailed, ExitCode: 127, Stderr: "python3: not found"}, false},
		{"no_network", ok("blocked tcp 127.0.0.1 4000 111\nblocked dns 127.0.0.1 101\ninterfaces lo\n"), true},
		{"no_network", ok("CONNECTED tcp 10.0.0.2 22 refused (so routable)\ninterfaces eth0 lo\n"), false},
		{"no_network", ok("blocked tcp 127.0.0.1 4000 111\nOPENED raw icmp\ninterfaces lo\n"), false},
		{"no_network", engine.Result{Status: engine.StatusFailed, Stderr: "Traceback"}, false},
		{"readonly_everywhere_but_tmp_and_workdir", ok("read-only / 30\nread-only /etc 30\ntmp writable\nworkdir writable /code\n"), true},
		{"readonly_everywhere_but_tmp_and_workdir", ok("read-only / 30\nWRITABLE file /var/tmp\ntmp writable\nworkdir writable /code\n"), false},
		{"readonly_everywhere_but_tmp_and_workdir", ok("read-only / 30\nWRITABLE code file remove\ntmp writable\nworkdir writable /code\n"), false},
		{"readonly_everywhere_but_tmp_and_workdir", ok("read-only / 30\n"), false}, // never got to write /tmp
		{"noexec_and_size_limit", fill(full, full), true},
		{"noexec_and_size_limit", ok(`{"/tmp": {"direct": "ran", "env": "ran", "bytes": 16000000, "errno": 28}, "/code": {"direct": "denied", "env": "denied", "bytes": 16000000, "errno": 28}}`), false},
		{"noexec_and_size_limit", ok(`{"/tmp": {"direct": "denied", "env": "denied", "bytes": 16000000, "errno": 28}}`), false}, // the working directory not tried
		{"noexec_and_size_limit", fill(full, `"bytes": 40000000, "errno": 0`), false},
		{"noexec_and_size_limit", fill(`"bytes": 4000000, "errno": 28`, full), false}, // far smaller than promised
		{"tmp_mount_options", ok(`{"options": "rw,nosuid,nodev,noexec,relatime,rw,size=16384k"}`), true},
		{"tmp_mount_options", ok(`{"options": "rw,noexec,rw,mode=1777"}`), false},
		{"noexec_loader_and_mmap", ok(`{"/tmp": {"ldso": "refused (exit 127): failed to map segment", "mmap": "refused: Operation not permitted"}, "/code": {"ldso": "refused (exit 127)", "mmap": "refused: Operation not permitted"}, "/dev/shm": {"ldso": "refused (exit 127)", "mmap": "refused: Operation not permitted"}}`), true},
		{"noexec_loader_and_mmap", ok(`{"/tmp": {"ldso": "refused (exit 127)", "mmap": "refused: Operation not permitted"}}`), false}, // the working directory not tried
		{"noexec_loader_and_mmap", ok(`{"/tmp": {"ldso": "ran", "mmap": "refused: Operation not permitted"}, "/code": {"ldso": "refused (exit 127)", "mmap": "refused: Operation not permitted"}}`), false},
		{"noexec_loader_and_mmap", ok(`{"/tmp": {"ldso": "refused (exit -11)", "mmap": "refused: Operation not permitted"}, "/code": {"ldso": "refused (exit -11)", "mmap": "executed"}}`), false},
		{"noexec_loader_and_mmap", ok(`{"/tmp": {"ldso": "refused (exit -11)", "mmap": "mapped, but calling it faulted (signal 11)"}, "/code": {"ldso": "refused (exit -11)", "mmap": "mapped, but calling it faulted (signal 11)"}, "/dev/shm": {"ldso": "refused (exit -11)", "mmap": "mapped, but calling it faulted (signal 11)"}}`), true}, // gVisor 2022-12 on a host tmpfs`
		{"unprivileged_identity", identityWith("", ""), true},
		{"unprivileged_identity", identityWith(`"groups": []`, `"groups": [0]`), false},
		{"unprivileged_identity", ok(strings.ReplaceAll(strings.ReplaceAll(identityOK, "2000000042", "65534"), "\n", "")), false}, // shared by every sandbox
		{"unprivileged_identity", identityWith(`"setuid": "Operation not permitted"`, `"setuid": "ESCALATED"`), false},
		{"no_capabilities", identityWith("", ""), true},
		{"no_capabilities", identityWith(`"CapEff": "0000000000000000"`, `"CapEff": "00000000a80425fb"`), false},
		{"no_capabilities", identityWith(`"bounding": []`, `"bounding": [21]`), false},
		{"no_capabilities", identityWith(`"capget": [0, 0, 0, 0, 0, 0]`, `"capget": [1024, 0, 0, 0, 0, 0]`), false},
		{"no_new_privs", identityWith("", ""), true},
		{"no_new_privs", identityWith(`"NoNewPrivs": "1", `, ``), true}, // gVisor has no status line
		{"no_new_privs", identityWith(`"prctl_no_new_privs": 1`, `"prctl_no_new_privs": 0`), false},
		{"seccomp_blocks_dangerous_syscalls", seccompOutput("", "2"), true},
		{"seccomp_blocks_dangerous_syscalls", seccompOutput("bpf", "2"), false},
		{"seccomp_blocks_dangerous_syscalls", seccompOutput("", "0"), false},
		{"seccomp_blocks_dangerous_syscalls", ok("blocked bpf 1\n"), false}, // did not finish
		{"own_namespaces", ok(`{"hostname": "sandbox", "pid": 2, "visible": 2, "ns": {"pid": "pid:[9]", "net": "net:[8]"}}`), true},
		{"own_namespaces", ok(`{"hostname": "sandbox", "pid": 2, "visible": 2, "ns": {"pid": "pid:[9]", "net": "net:[2]"}}`), false},
		{"own_namespaces", ok(`{"hostname": "sandbox", "pid": 4711, "visible": 300, "ns": {"pid": "pid:[9]", "net": "net:[8]"}}`), false},
		{"own_namespaces", ok(`{"hostname": "buildhost", "pid": 2, "visible": 2, "ns": {"pid": "pid:[9]", "net": "net:[8]"}}`), false},
		{"masked_proc_and_sys", ok("masked file /proc/kcore\nabsent /sys/firmware\nread-only /proc/sysrq-trigger 30\nchecked\n"), true},
		{"masked_proc_and_sys", ok("VISIBLE file /proc/kcore 4096\nchecked\n"), false},
		{"masked_proc_and_sys", ok("masked file /proc/kcore\nWRITABLE /proc/sys/vm/drop_caches\nchecked\n"), false},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PWD": "/code"}, "proc": {}, "fds": []}`), true},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PWD": "/code", "VERTAL_DOCTOR_CANARY_AB12": "s3cr3t"}, "fds": []}`), false},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PWD": "/code"}, "proc": {"/proc/1/environ": "X=s3cr3t"}, "fds": []}`), false},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PWD": "/code", "TERM": "xterm"}, "fds": []}`), false},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "PWD": "/code"}, "fds": []}`), false},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PWD": "/tmp"}, "fds": []}`), false},
		{"no_host_env/python", ok(`{"env": {"PATH": "/usr/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PWD": "/code"}, "fds": ["4 -> /dev/null"]}`), false},
		{"memory_hog_is_memory_exceeded", engine.Result{Status: engine.StatusMemoryExceeded, ExitCode: 137, Stdout: "allocated MiB 16\nallocated MiB 96\n"}, true},
		{"memory_hog_is_memory_exceeded", engine.Result{Status: engine.StatusMemoryExceeded, ExitCode: 137, Stdout: "allocated MiB 512\n"}, false},
		{"memory_hog_is_memory_exceeded", ok("allocated MiB 1024\n"), false},
		{"fork_limit", ok(`{"forked": 61, "error": "Resource temporarily unavailable"}`), true},
		{"fork_limit", ok(`{"forked": 300, "error": ""}`), false},
		{"fork_limit", ok(`{"forked": 0, "error": "Resource temporarily unavailable"}`), false},
		{"cpu_quota", cpu(3.05, 3.0), true},
		{"cpu_quota", cpu(3.0, 1.6), false},
		{"cpu_quota", cpu(0, 1.6), false}, // not measured
		{"file_size_limit", ok(`{"size": 1048576, "errno": 27, "error": "File too large"}`), true},
		{"file_size_limit", ok(`{"size": 2097152, "errno": 0, "error": ""}`), false},
		{"file_size_limit", ok(`{"size": 1048576, "errno": 28, "error": "No space left on device"}`), false},
		{"output_capped", engine.Result{Status: engine.StatusSucceeded, Truncated: true,
			Stdout: strings.Repeat("x", engine.DefaultOutputBytes), Stderr: strings.Repeat("y", engine.DefaultOutputBytes)}, true},
		{"output_capped", engine.Result{Status: engine.StatusSucceeded, Stdout: strings.Repeat("x", 1000000)}, false},
		{"output_capped", engine.Result{Status: engine.StatusSucceeded, Truncated: true,
			Stdout: "!" + strings.Repeat("x", engine.DefaultOutputBytes-1), Stderr: strings.Repeat("y", engine.DefaultOutputBytes)}, false},
		{"timeout_kills_double_forked_setsid_child", engine.Result{Status: engine.StatusTimedOut, ExitCode: 137, Stdout: "started\n"}, true},
		{"timeout_kills_double_forked_setsid_child", engine.Result{Status: engine.StatusTimedOut, ExitCode: 137}, false}, // never started
		{"timeout_kills_double_forked_setsid_child", ok("started\n"), false},
		{"exit_kills_double_forked_setsid_child", ok("started\n"), true},
		{"exit_kills_double_forked_setsid_child", engine.Result{Status: engine.StatusFailed, ExitCode: 1, Stderr: "OSError"}, false},
		{"fresh_state", ok(`{"file": false, "sleep": false, "tmp": []}`), true},
		{"fresh_state", ok(`{"file": true, "sleep": false, "tmp": ["x"]}`), false},
		{"fresh_state", ok(`{"file": false, "sleep": true, "tmp": []}`), false},
		{"fresh_state", ok(`{"file": false, "sleep": false, "tmp": ["left"]}`), false},
	} {
		p, found := byName[tc.probe]
		if !found {
			t.Fatalf("no probe %q", tc.probe)
		}
		got, detail := p.Evaluate(tc.r)
		if got != tc.ok {
			t.Errorf("%s with %q: ok=%v (%s); want %v", tc.probe, OneLine(tc.r.Stdout, 80), got, detail, tc.ok)
		}
	}
}

// Every probe has a unique case name and a row in the doctor's table.
func TestNamesUnique(t *testing.T) {
	names, prots := map[string]bool{}, map[string]bool{}
	for _, p := range All(Env{}) {
		if p.Name == "" || p.Protection == "" || p.Evaluate == nil || p.Fix == "" || names[p.Name] || prots[p.Protection] {
			t.Errorf("probe %q (%q): empty or repeated name, protection, judgement or fix", p.Name, p.Protection)
		}
		names[p.Name], prots[p.Protection] = true, true
	}
}

// The timeout probe's host check finds a surviving process by its marker.
func TestFindProcesses(t *testing.T) {
	proc := t.TempDir()
	for pid, cmdline := range map[string]string{
		"100":  "sleep\x00100\x00",
		"200":  "vertal-probe-abc\x001000\x00",
		"300":  "runsc\x00--root\x00/run\x00exe_123\x00",
		"self": "not a pid",
	} {
		os.MkdirAll(filepath.Join(proc, pid), 0o755)
		os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(cmdline), 0o644)
	}
	got := FindProcesses(proc, "vertal-probe-abc", "exe_123")
	want := []string{"200: vertal-probe-abc 1000", "300: runsc --root /run exe_123"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestSkips(t *testing.T) {
	for _, tc := range []struct {
		env  Env
		want []string
	}{
		{Env{CPUs: 1, Arch: "riscv64"}, []string{"noexec_loader_and_mmap", "seccomp_blocks_dangerous_syscalls", "cpu_quota"}},
		{Env{CPUs: 2, Arch: "arm64"}, nil},
		{Env{CPUs: 8, Arch: "amd64"}, nil},
	} {
		var got []string
		for _, p := range All(tc.env) {
			if p.Skip != "" {
				got = append(got, p.Name)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%+v: skipped (-want +got):\n%s", tc.env, diff)
		}
	}
}

// scripted answers each execution from a table keyed by the code.
type scripted map[string]engine.Result

func (s scripted) Run(_ context.Context, spec engine.Spec) (engine.Result, error) {
	if r, ok := s[spec.Code]; ok {
		return r, nil
	}
	return engine.Result{}, errors.New("runtime exploded")
}
func (scripted) Reap(context.Context) (int, error) { return 0, nil }
func (scripted) Name() string                      { return "scripted" }

func TestRun(t *testing.T) {
	judge := func(r engine.Result) (bool, string) { return r.Stdout == "clean", r.Stdout }
	after := func(id string, _ engine.Result) (bool, string) { return strings.HasPrefix(id, "exe_"), "host clean" }
	d := scripted{"prep": ok("x"), "bad prep": {Status: engine.StatusFailed, ExitCode: 1, Stderr: "boom"}, "probe": ok("clean"), "dirty": ok("LEFT")}
	for _, tc := range []struct {
		name    string
		p       Probe
		want    Outcome
		prepErr bool
	}{
		{"judged with After", Probe{Before: []string{"prep"}, Code: "probe", Evaluate: judge, After: after},
			Outcome{Result: ok("clean"), OK: true, Detail: "clean; host clean"}, false},
		{"After not asked when Evaluate fails", Probe{Code: "dirty", Evaluate: judge, After: after},
			Outcome{Result: ok("LEFT"), Detail: "LEFT"}, false},
		{"failed preparation", Probe{Before: []string{"bad prep"}, Code: "probe", Evaluate: judge}, Outcome{}, true},
		{"driver error", Probe{Code: "unknown", Evaluate: judge}, Outcome{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.p.Run(context.Background(), d, engine.Language{Name: "python"}, RunOptions{})
			if errors.Is(got.Err, ErrPrepare) != tc.prepErr {
				t.Errorf("err %v; want preparation failure %v", got.Err, tc.prepErr)
			}
			if tc.want.Result.Status != "" {
				if got.Err != nil || !strings.HasPrefix(got.ID, "exe_") {
					t.Fatalf("err %v, id %q", got.Err, got.ID)
				}
				got.ID, got.Err = "", nil
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("outcome (-want +got):\n%s", diff)
				}
			} else if got.Err == nil {
				t.Errorf("outcome %+v; want an error", got)
			}
		})
	}
}
