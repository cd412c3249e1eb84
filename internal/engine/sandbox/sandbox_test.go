package sandbox

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestEnvIsFixed(t *testing.T) {
	t.Setenv("VERTAL_TEST_SECRET", "s3cr3t")
	want := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/tmp",
		"LANG=C.UTF-8",
		"PWD=/code",
	}
	if diff := cmp.Diff(want, Env()); diff != "" {
		t.Errorf("Env() (-want +got):\n%s", diff)
	}
}

// TestSpecEnv: without egress a request's env is passed as it is; with
// it, engine.ProxyEnv is added over it (the proxy is the platform's),
// and the request's map is left alone.
func TestSpecEnv(t *testing.T) {
	env := map[string]string{"A": "1", "HTTP_PROXY": "http://elsewhere:1"}
	if got := SpecEnv(engine.Spec{Env: env}); fmt.Sprint(got) != fmt.Sprint(env) {
		t.Errorf("without egress: %v, want %v", got, env)
	}
	if got := SpecEnv(engine.Spec{}); got != nil {
		t.Errorf("without egress or env: %v, want nil", got)
	}
	want := engine.ProxyEnv()
	want["A"] = "1"
	if diff := cmp.Diff(want, SpecEnv(engine.Spec{Env: env, EgressDir: "/e", Agent: "/a"})); diff != "" {
		t.Errorf("with egress (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(engine.ProxyEnv(), SpecEnv(engine.Spec{EgressDir: "/e", Agent: "/a"})); diff != "" {
		t.Errorf("with egress, no env (-want +got):\n%s", diff)
	}
	if env["HTTP_PROXY"] != "http://elsewhere:1" || len(env) != 2 {
		t.Errorf("the request's env changed: %v", env)
	}
}

func TestTmpfsOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits engine.Limits
		want   []string
	}{
		{"default", engine.DefaultLimits(0), []string{"rw", "noexec", "nosuid", "nodev", "mode=1777", "size=16777216"}},
		{"plan", engine.Limits{TmpBytes: 1 << 20}, []string{"rw", "noexec", "nosuid", "nodev", "mode=1777", "size=1048576"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, TmpfsOptions(tc.limits)); diff != "" {
				t.Errorf("TmpfsOptions (-want +got):\n%s", diff)
			}
		})
	}
}

func TestShmOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits engine.Limits
		want   string
	}{
		{"default memory: a quarter", engine.DefaultLimits(0), "size=67108864"},
		{"small plan: a quarter", engine.Limits{MemoryBytes: 64 << 20}, "size=16777216"},
		{"large plan: capped", engine.Limits{MemoryBytes: 4 << 30}, "size=67108864"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := []string{"rw", "noexec", "nosuid", "nodev", "mode=1777", tc.want}
			if diff := cmp.Diff(want, ShmOptions(tc.limits)); diff != "" {
				t.Errorf("ShmOptions (-want +got):\n%s", diff)
			}
		})
	}
}

// syscallActions maps each named system call of a profile to the actions
// its rules give it.
func syscallActions(s *specs.LinuxSeccomp) map[string][]string {
	m := map[string][]string{}
	for _, r := range s.Syscalls {
		act := string(r.Action)
		if r.ErrnoRet != nil {
			act += fmt.Sprintf("/%02d", *r.ErrnoRet)
		}
		if len(r.Args) > 0 {
			act += "(args)"
		}
		for _, n := range r.Names {
			m[n] = append(m[n], act)
		}
	}
	return m
}

func TestSeccompProfile(t *testing.T) {
	for _, rt := range []string{"crun", "runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			s := Seccomp(rt)
			if s.DefaultAction != specs.ActErrno || s.DefaultErrnoRet == nil || *s.DefaultErrnoRet != 38 {
				t.Errorf("default action %s/%v; want ENOSYS", s.DefaultAction, s.DefaultErrnoRet)
			}
			acts := syscallActions(s)
			// What the issue requires to be blocked, and the escape
			// hatches around it.
			for _, n := range []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "userfaultfd",
				"perf_event_open", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load", "reboot",
				"init_module", "finit_module", "delete_module", "mount", "umount2", "unshare", "setns", "ptrace",
				"process_vm_readv", "process_vm_writev", "clock_settime", "clock_adjtime", "adjtimex", "settimeofday",
				"memfd_create", "open_by_handle_at", "pivot_root", "chroot", "fsopen", "fsmount", "move_mount", "open_tree"} {
				if diff := cmp.Diff([]string{"SCMP_ACT_ERRNO/01"}, acts[n]); diff != "" {
					t.Errorf("%s (-want +got):\n%s", n, diff)
				}
			}
			// Conditional rules only: namespace flags, families, personas.
			for _, n := range []string{"clone", "socket", "personality"} {
				for _, a := range acts[n] {
					if a != "SCMP_ACT_ALLOW(args)" {
						t.Errorf("%s has an unconditional rule %s", n, a)
					}
				}
			}
			for n, a := range acts {
				if len(a) > 1 && !slices.Contains([]string{"socket", "personality"}, n) {
					t.Errorf("%s is in several rules: %v", n, a)
				}
			}
			wantClone3 := []string{"SCMP_ACT_ERRNO/38"}
			if rt == "runsc" {
				wantClone3 = []string{"SCMP_ACT_ALLOW"}
			}
			if diff := cmp.Diff(wantClone3, acts["clone3"]); diff != "" {
				t.Errorf("clone3 (-want +got):\n%s", diff)
			}
			if len(s.Architectures) != 1 {
				t.Errorf("architectures %v; want the native one", s.Architectures)
			}
		})
	}
}

// TestSeccompDockerJSON pins the profile as Docker receives it
// (--security-opt seccomp=<json>). Run with -update after changing it.
func TestSeccompDockerJSON(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			b, err := SeccompDockerJSON(rt)
			if err != nil {
				t.Fatal(err)
			}
			var generic map[string]any
			if err := json.Unmarshal(b, &generic); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for k := range generic {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			// Docker 20.10 understands exactly these top-level fields.
			if diff := cmp.Diff([]string{"architectures", "defaultAction", "defaultErrnoRet", "syscalls"}, keys); diff != "" {
				t.Errorf("top-level keys (-want +got):\n%s", diff)
			}
			pretty, _ := json.MarshalIndent(generic, "", "  ")
			golden := filepath.Join("testdata", "seccomp-docker-"+rt+".json")
			if *update {
				if err := os.WriteFile(golden, append(pretty, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if diff := cmp.Diff(string(want), string(pretty)+"\n"); diff != "" {
				t.Errorf("%s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

func TestAllowedAndDeniedDisjoint(t *testing.T) {
	for _, n := range denied {
		if slices.Contains(allowed, n) {
			t.Errorf("%s is both allowed and denied", n)
		}
	}
	seen := map[string]bool{}
	for _, n := range append(slices.Clone(allowed), denied...) {
		if seen[n] {
			t.Errorf("%s listed twice", n)
		}
		seen[n] = true
	}
}

func TestOverlay(t *testing.T) {
	ps := []Protection{
		{Name: ProtTmp, Enforced: true, How: "tmpfs"},
		{Name: ProtKernelIsol, Enforced: false, How: "host kernel shared", Fix: "--runtime runsc"},
		{Name: ProtCPU, Enforced: true, How: "CFS quota"},
	}
	got := Overlay(ps, map[string]string{ProtTmp: "gofer", ProtKernelIsol: "runsc"})
	want := []Protection{
		{Name: ProtTmp, Enforced: true, How: "gofer"},
		{Name: ProtKernelIsol, Enforced: true, How: "runsc"},
		{Name: ProtCPU, Enforced: true, How: "CFS quota"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Overlay (-want +got):\n%s", diff)
	}
}
