//go:build linux

package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// fakeProc says which masked paths exist, as the host's procfs would.
func fakeProc(path string) (dir, ok bool) {
	switch path {
	case "/proc/acpi", "/proc/scsi":
		return true, true
	case "/proc/kcore", "/proc/keys", "/proc/timer_list":
		return false, true
	}
	return false, false
}

// TestBwrapArgvGolden pins the bwrap command line of the driver's own
// spec, for each runtime-relevant setting. Run with -update after a
// deliberate change, and review the diff.
func TestBwrapArgvGolden(t *testing.T) {
	lang := engine.Language{Name: "python", Image: "/var/lib/vertal/images/default/rootfs", File: "main.py", Command: []string{"/usr/bin/python3"}}
	d := unitDriver("bwrap")
	spec, err := d.spec(lang, engine.DefaultLimits(7_000_000_000), idPlaceholder)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := bwrapPlanFor(spec, bwrapEnv{bundle: bundlePlaceholder, dev: "/run/vertal/oci/0123456789ab/dev", exists: fakeProc})
	if err != nil {
		t.Fatal(err)
	}
	r := plan.render("/run/vertal/oci/0123456789ab/bundles/exe_1", 2_000_000_042, []string{"arg1"}, []string{"USERVAR=1"})
	var b strings.Builder
	for _, a := range r.args {
		b.WriteString(a + "\n")
	}
	b.WriteString("--\n")
	for _, a := range r.command {
		b.WriteString(a + "\n")
	}
	b.WriteString("# env\n")
	for _, e := range r.env {
		b.WriteString(e + "\n")
	}
	b.WriteString("# --args (a memfd)\n")
	for _, a := range strings.Split(strings.TrimSuffix(string(r.inner), "\x00"), "\x00") {
		b.WriteString(a + "\n")
	}
	b.WriteString("# host side\n")
	for _, l := range r.rlimits {
		fmt.Fprintf(&b, "rlimit %d %d %d\n", l.resource, l.limit.Cur, l.limit.Max)
	}
	fmt.Fprintf(&b, "oom_score_adj %d\nuid %d gid %d\n", *r.oomScoreAdj, r.uid, r.gid)
	for _, c := range r.checks {
		fmt.Fprintf(&b, "mount flags %#x %s\n", c.flags, c.path)
	}
	checkGolden(t, filepath.Join("testdata", "bwrap-argv.txt"), b.String())
}

// bwrapTestSpec is a small spec every case of the tables below edits.
func bwrapTestSpec() *specs.Spec {
	return &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			Args: []string{"/bin/true"}, Cwd: "/code", Env: []string{"A=1", "PWD=/code"},
			User:            specs.User{UID: 2000, GID: 2000},
			Capabilities:    &specs.LinuxCapabilities{},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: "/img", Readonly: true},
		Hostname: "h",
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.UTSNamespace}},
			Resources:  &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
	}
}

// TestBwrapTranslation: each setting of the spec becomes these options.
func TestBwrapTranslation(t *testing.T) {
	common := func(extra ...string) []string {
		head := []string{"--die-with-parent", "--new-session", "--unshare-user", "--unshare-uts",
			"--uid", "2000", "--gid", "2000", "--hostname", "h", "--ro-bind", "/img", "/"}
		tail := []string{"--cap-drop", "ALL", "--chdir", "/code", "--info-fd", "3", "--userns-block-fd", "4", "--json-status-fd", "5"}
		return append(append(head, extra...), tail...)
	}
	for _, tc := range []struct {
		name string
		edit func(*specs.Spec)
		want []string
	}{
		{"minimal", func(*specs.Spec) {}, common()},
		{"proc", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/proc", Type: "proc", Options: []string{"nosuid", "noexec", "nodev"}}}
		}, common("--proc", "/proc")},
		{"bind relative ro", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/x", Type: "bind", Source: "x", Options: []string{"rbind", "ro", "nosuid", "nodev"}}}
		}, common("--ro-bind", "/b/x", "/x")},
		{"bind absolute rw", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/y", Type: "bind", Source: "/h/y", Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}}}
		}, common("--bind", "/h/y", "/y")},
		{"dev", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/dev", Type: "tmpfs", Options: []string{"nosuid", "noexec", "mode=755", "size=1m"}}}
		}, common("--dev-bind", "/d", "/dev")},
		{"masked", func(s *specs.Spec) {
			s.Linux.MaskedPaths = []string{"/proc/acpi", "/proc/kcore", "/proc/absent"}
		}, common("--perms", "0555", "--size", "4096", "--tmpfs", "/proc/acpi", "--remount-ro", "/proc/acpi", "--ro-bind", "/dev/null", "/proc/kcore")},
		{"readonly proc", func(s *specs.Spec) { s.Linux.ReadonlyPaths = []string{"/proc/sys"} }, common()},
		{"namespaces", func(s *specs.Spec) {
			s.Linux.Namespaces = []specs.LinuxNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network"}, {Type: "cgroup"}}
		}, append([]string{"--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup"},
			common()[4:]...)},
		{"seccomp", func(s *specs.Spec) { s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow} },
			common("--seccomp", "4")},
		{"cgroups path", func(s *specs.Spec) { s.Linux.CgroupsPath = "/vertal/x/sandbox" }, common()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bwrapTestSpec()
			tc.edit(s)
			p, err := bwrapPlanFor(s, bwrapEnv{bundle: "/b", dev: "/d", exists: fakeProc})
			if err != nil {
				t.Fatal(err)
			}
			// Golden order: seccomp sits before --cap-drop.
			if diff := cmp.Diff(tc.want, p.args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"/bin/true"}, p.command); diff != "" {
				t.Errorf("command (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBwrapRefuses: what the translation cannot honour is an error.
func TestBwrapRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*specs.Spec)
	}{
		{"writable root", func(s *specs.Spec) { s.Root.Readonly = false }},
		{"root user", func(s *specs.Spec) { s.Process.User.UID = 0 }},
		{"extra groups", func(s *specs.Spec) { s.Process.User.AdditionalGids = []uint32{5} }},
		{"capability", func(s *specs.Spec) { s.Process.Capabilities.Bounding = []string{"CAP_CHOWN"} }},
		{"new privileges", func(s *specs.Spec) { s.Process.NoNewPrivileges = false }},
		{"terminal", func(s *specs.Spec) { s.Process.Terminal = true }},
		{"apparmor", func(s *specs.Spec) { s.Process.ApparmorProfile = "p" }},
		{"unknown rlimit", func(s *specs.Spec) { s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_RTTIME"}} }},
		{"joined namespace", func(s *specs.Spec) { s.Linux.Namespaces[0].Path = "/proc/1/ns/mnt" }},
		{"time namespace", func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: "time"})
		}},
		{"no mount namespace", func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[1:] }},
		{"hostname without uts", func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[:1] }},
		{"device allowed", func(s *specs.Spec) { s.Linux.Resources.Devices[0].Allow = true }},
		{"memory limit in spec", func(s *specs.Spec) { m := int64(1); s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &m} }},
		{"sysctl", func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"a": "b"} }},
		{"uid mappings", func(s *specs.Spec) { s.Linux.UIDMappings = []specs.LinuxIDMapping{{Size: 1}} }},
		{"readonly outside proc", func(s *specs.Spec) { s.Linux.ReadonlyPaths = []string{"/etc"} }},
		{"hooks", func(s *specs.Spec) { s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{{Path: "/x"}}} }},
		{"annotations", func(s *specs.Spec) { s.Annotations = map[string]string{"a": "b"} }},
		{"suid bind", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/x", Type: "bind", Source: "/x", Options: []string{"rbind", "nodev"}}}
		}},
		{"bind option", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/x", Type: "bind", Source: "/x", Options: []string{"rbind", "nosuid", "nodev", "rprivate"}}}
		}},
		{"tmpfs elsewhere", func(s *specs.Spec) { s.Mounts = []specs.Mount{{Destination: "/run", Type: "tmpfs"}} }},
		{"exec dev", func(s *specs.Spec) {
			s.Mounts = []specs.Mount{{Destination: "/dev", Type: "tmpfs", Options: []string{"nosuid", "mode=755"}}}
		}},
		{"mqueue", func(s *specs.Spec) { s.Mounts = []specs.Mount{{Destination: "/dev/mqueue", Type: "mqueue"}} }},
		{"relative cwd", func(s *specs.Spec) { s.Process.Cwd = "code" }},
		{"no args", func(s *specs.Spec) { s.Process.Args = nil }},
		{"no PWD", func(s *specs.Spec) { s.Process.Env = []string{"A=1"} }},
		{"another PWD", func(s *specs.Spec) { s.Process.Env = []string{"A=1", "PWD=/tmp"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bwrapTestSpec()
			tc.edit(s)
			if p, err := bwrapPlanFor(s, bwrapEnv{bundle: "/b", dev: "/d", exists: fakeProc}); err == nil {
				t.Errorf("accepted; args %q", p.args)
			}
		})
	}
}

func TestUsableBwrap(t *testing.T) {
	e2e(t)
	if err := usableBwrap("/usr/bin/bwrap"); err != nil {
		t.Fatalf("usableBwrap on this host: %v", err)
	}
	// A binary that fails as bwrap would where user namespaces are off.
	err := usableBwrap("/bin/false")
	if err == nil || !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "--runtime crun") {
		t.Fatalf("usableBwrap(/bin/false) = %v; want ErrUnavailable saying what to do", err)
	}
}

func TestReachableByOthers(t *testing.T) {
	dir := t.TempDir() // its parent is 0700: others cannot pass
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := reachableByOthers(img); err == nil || !strings.Contains(err.Error(), filepath.Dir(dir)+" is not searchable") {
		t.Fatalf("reachableByOthers(%s) = %v; want the 0700 parent named", img, err)
	}
	for _, p := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := reachableByOthers(img); err != nil {
		t.Fatalf("after chmod o+x: %v", err)
	}
}
