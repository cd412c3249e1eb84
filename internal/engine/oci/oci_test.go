//go:build linux

package oci

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

var update = flag.Bool("update", false, "rewrite golden files")

// unitDriver is a Driver with just enough state to build configs, without
// root or runtimes.
func unitDriver(rt string) *Driver {
	return &Driver{
		rt: runtimes[rt], initPath: "/usr/bin/tini-static",
		cg:        &cgroups{mode: CgroupV1, base: DefaultCgroupParent},
		templates: map[templateKey]*template{}, images: map[string]error{},
	}
}

// TestConfigGolden pins the config.json every execution gets. Run with
// -update after a deliberate change, and review the diff.
func TestConfigGolden(t *testing.T) {
	lang := engine.Language{Name: "python", Image: "/var/lib/vertal/images/default/rootfs", File: "main.py", Command: []string{"/usr/bin/python3"}}
	for _, rt := range []string{"crun", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			d := unitDriver(rt)
			tpl, err := d.template(lang, withoutDeadline(engine.DefaultLimits(0)))
			if err != nil {
				t.Fatal(err)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, tpl.render("exe_0123456789abcdef0123456789abcdef", 2_000_000_042), "", "  "); err != nil {
				t.Fatal(err)
			}
			pretty.WriteByte('\n')
			checkGolden(t, filepath.Join("testdata", "config-"+rt+".json"), pretty.String())
		})
	}
}

// checkGolden compares got with the golden file; go test -update rewrites
// the file.
func checkGolden(t *testing.T, golden, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", golden, diff)
	}
}

// withoutDeadline is l without the sandbox's own deadline, which the
// golden configs and the invariants leave out (bwrap_test has one).
func withoutDeadline(l engine.Limits) engine.Limits {
	l.Lifetime = 0
	return l
}

func TestConfigInvariants(t *testing.T) {
	lang := engine.Language{Name: "bash", Image: "/img", File: "main.sh", Command: []string{"/bin/bash"}}
	limits := withoutDeadline(engine.Limits{MemoryBytes: 64 << 20, Pids: 16, FileSizeBytes: 4096, TmpBytes: 1 << 20}.WithDefaults(0))
	for _, rt := range []string{"crun", "runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			d := unitDriver(rt)
			s, err := d.spec(lang, limits, "exe_1")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"/dev/init", "--", "/bin/bash", "/code/main.sh"}, s.Process.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if !s.Root.Readonly || !s.Process.NoNewPrivileges || s.Process.User.UID != uidPlaceholder || s.Process.User.GID != uidPlaceholder || len(s.Process.User.AdditionalGids) != 0 {
				t.Errorf("root readonly %v, no_new_privs %v, user %+v", s.Root.Readonly, s.Process.NoNewPrivileges, s.Process.User)
			}
			c := s.Process.Capabilities
			if n := len(c.Bounding) + len(c.Effective) + len(c.Permitted) + len(c.Inheritable) + len(c.Ambient); n != 0 {
				t.Errorf("%d capabilities granted", n)
			}
			if diff := cmp.Diff(sandbox.EnvFor(limits), s.Process.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			var ns []string
			for _, n := range s.Linux.Namespaces {
				if n.Path != "" {
					t.Errorf("namespace %s joins %s", n.Type, n.Path)
				}
				ns = append(ns, string(n.Type))
			}
			if diff := cmp.Diff(sandbox.Namespaces(), ns); diff != "" {
				t.Errorf("namespaces (-want +got):\n%s", diff)
			}
			if s.Linux.CgroupsPath != "/vertal/exe_1/sandbox" {
				t.Errorf("cgroupsPath %q", s.Linux.CgroupsPath)
			}
			if s.Linux.Resources.Memory != nil || s.Linux.Resources.Pids != nil || s.Linux.Resources.CPU != nil {
				t.Errorf("limits must be on the parent cgroup, not the runtime's")
			}
			fsize := false
			for _, r := range s.Process.Rlimits {
				if r.Type == "RLIMIT_FSIZE" && r.Hard == 4096 && r.Soft == 4096 {
					fsize = true
				}
				if r.Type == "RLIMIT_NPROC" && (rt != "runsc" || r.Hard != 16) {
					t.Errorf("RLIMIT_NPROC %d under %s: per uid on the host, only right inside gVisor", r.Hard, rt)
				}
			}
			if !fsize {
				t.Errorf("no RLIMIT_FSIZE of 4096 in %+v", s.Process.Rlimits)
			}
			for _, m := range s.Mounts {
				switch m.Destination {
				case "/tmp", "/code", "/dev/shm":
					for _, o := range []string{"noexec", "nosuid", "nodev"} {
						if !slices.Contains(m.Options, o) {
							t.Errorf("%s lacks %s: %v", m.Destination, o, m.Options)
						}
					}
					if m.Destination == "/code" && m.Source != "code" {
						t.Errorf("/code mount %+v; want the bundle's code tmpfs", m)
					}
				case "/sys", "/dev/mqueue":
					t.Errorf("%s must not be mounted", m.Destination)
				}
			}
			cg := d.cgLimitsFor(limits)
			if cg.memory != 64<<20 || cg.cpuQuota != 100000 || cg.cpuPeriod != 100000 {
				t.Errorf("cgroup limits %+v", cg)
			}
			if wantPids := int64(16); rt != "runsc" && cg.pids != wantPids {
				t.Errorf("pids.max %d; want %d", cg.pids, wantPids)
			}
		})
	}
}

func TestSpecRejectsBadLanguage(t *testing.T) {
	d := unitDriver("crun")
	for _, lang := range []engine.Language{
		{Name: "none", Image: "/img", File: "main.py"},
		{Name: "slash", Image: "/img", File: "../main.py", Command: []string{"/bin/sh"}},
	} {
		if _, err := d.spec(lang, engine.DefaultLimits(time.Second), "x"); err == nil {
			t.Errorf("spec(%+v) succeeded", lang)
		}
	}
}

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"exe_0123456789abcdef0123456789abcdef", true},
		{"a.b-c_d", true},
		{"", false},
		{"../etc", false},
		{"a/b", false},
		{".hidden", false},
		{"-flag", false},
		{"with space", false},
		{strings.Repeat("a", 129), false},
	} {
		if got := validID(tc.id); got != tc.want {
			t.Errorf("validID(%q) = %v; want %v", tc.id, got, tc.want)
		}
	}
}

func TestFindRuntimeSaysWhatToInstall(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // nothing installed
	for _, tc := range []struct {
		runtime, want string
	}{
		{"", "apt-get install crun"},
		{"runc", "apt-get install runc"},
		{"runsc", "apt-get install runsc"},
		{"bwrap", "apt-get install bubblewrap"},
		{"kata", "unknown OCI runtime"},
	} {
		_, _, err := pickRuntime(tc.runtime, &cgroups{}, discard)
		if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("findRuntime(%q) = %v; want ErrUnavailable mentioning %q", tc.runtime, err, tc.want)
		}
	}
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestEnforced(t *testing.T) {
	get := func(rt, mode, name string) sandbox.Protection {
		for _, p := range enforced(runtimes[rt], mode) {
			if p.Name == name {
				return p
			}
		}
		t.Fatalf("%s: no protection %q", rt, name)
		return sandbox.Protection{}
	}
	if p := get("crun", CgroupV2, sandbox.ProtKernelIsol); p.Enforced || p.Fix == "" {
		t.Errorf("crun kernel isolation: %+v; want not enforced, with a fix", p)
	}
	if p := get("bwrap", CgroupV1, sandbox.ProtKernelIsol); p.Enforced || p.Fix == "" {
		t.Errorf("bwrap kernel isolation: %+v; want not enforced, with a fix", p)
	}
	if p := get("runsc", CgroupV2, sandbox.ProtKernelIsol); !p.Enforced {
		t.Errorf("runsc kernel isolation: %+v; want enforced", p)
	}
	for _, mode := range []string{CgroupV1, CgroupHybrid, CgroupV2} {
		for _, rt := range []string{"crun", "runc", "runsc", "bwrap"} {
			for _, p := range enforced(runtimes[rt], mode) {
				if p.Name != sandbox.ProtKernelIsol && !p.Enforced {
					t.Errorf("%s on %s: %s not enforced", rt, mode, p.Name)
				}
			}
		}
	}
	// The cgroup protections say which cgroup version enforces them.
	for _, tc := range []struct {
		rt, mode, name, want string
	}{
		{"crun", CgroupV1, sandbox.ProtMemory, "cgroup v1 memory.limit_in_bytes = memory.memsw.limit_in_bytes"},
		{"runc", CgroupHybrid, sandbox.ProtCPU, "cgroup v1 cpu.cfs_quota_us"},
		{"crun", CgroupV2, sandbox.ProtMemory, "cgroup v2 memory.max + memory.swap.max=0"},
		{"runc", CgroupV2, sandbox.ProtCPU, "cgroup v2 cpu.max"},
		{"crun", CgroupV2, sandbox.ProtPids, "cgroup v2 pids.max"},
		{"crun", CgroupV2, sandbox.ProtTimeout, "cgroup v2 cgroup.kill"},
		{"runsc", CgroupV2, sandbox.ProtPids, "RLIMIT_NPROC inside gVisor (per sandbox kernel); host cgroup v2 pids.max"},
		{"runsc", CgroupV2, sandbox.ProtMemory, "cgroup v2 memory.max + memory.swap.max=0"},
		{"runsc", CgroupV1, sandbox.ProtMemory, "cgroup v1 memory.limit_in_bytes"},
		{"bwrap", CgroupV2, sandbox.ProtMemory, "cgroup v2 memory.max + memory.swap.max=0"},
		{"bwrap", CgroupV1, sandbox.ProtTimeout, "SIGKILL to every process of the sandbox's cgroup"},
		{"bwrap", CgroupV1, sandbox.ProtSeccomp, "CompileSeccomp"},
	} {
		if p := get(tc.rt, tc.mode, tc.name); !strings.Contains(p.How, tc.want) {
			t.Errorf("%s on %s: %s is enforced by %q; want it to mention %q", tc.rt, tc.mode, tc.name, p.How, tc.want)
		}
	}
}
