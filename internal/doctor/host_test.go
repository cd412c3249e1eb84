package doctor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mkfiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadCgroups(t *testing.T) {
	v2 := t.TempDir()
	mkfiles(t, v2, map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"})
	hybrid := t.TempDir()
	mkfiles(t, hybrid, map[string]string{
		"memory/cgroup.procs": "", "pids/cgroup.procs": "", "cpu/cgroup.procs": "",
		"unified/cgroup.controllers": "hugetlb\n",
	})
	v1 := t.TempDir()
	mkfiles(t, v1, map[string]string{"memory/cgroup.procs": "", "cpu/cgroup.procs": ""})
	for _, tc := range []struct {
		root string
		want Cgroups
	}{
		{v2, Cgroups{Mode: "v2", Controllers: []string{"cpuset", "cpu", "io", "memory", "pids"}}},
		{hybrid, Cgroups{Mode: "hybrid", Controllers: []string{"cpu", "memory", "pids"}, UnifiedControllers: []string{"hugetlb"}}},
		{v1, Cgroups{Mode: "v1", Controllers: []string{"cpu", "memory"}}},
		{t.TempDir(), Cgroups{}},
	} {
		if diff := cmp.Diff(tc.want, ReadCgroups(tc.root)); diff != "" {
			t.Errorf("ReadCgroups(%s) (-want +got):\n%s", tc.root, diff)
		}
	}
}

func TestHostChecks(t *testing.T) {
	cg := t.TempDir()
	mkfiles(t, cg, map[string]string{
		"memory/cgroup.procs": "", "pids/cgroup.procs": "", "cpu/cgroup.procs": "",
		"unified/cgroup.controllers": "hugetlb\n",
	})
	img := t.TempDir()
	mkfiles(t, img, map[string]string{
		"rootfs/usr/bin/python3": "", "rootfs/usr/local/bin/node": "", "rootfs/bin/bash": "",
		"versions.json": `{"python":"3.11.2","javascript":"22.23.5","bash":"5.2.15"}`,
	})
	if err := os.Chmod(filepath.Join(img, "rootfs/bin/bash"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	installed := map[string]bool{"crun": true, "runc": true}
	o := HostOptions{
		Driver: "oci", ImageDir: img, CgroupRoot: cg,
		Geteuid: func() int { return 0 },
		LookPath: func(n string) (string, error) {
			if installed[n] {
				return "/usr/bin/" + n, nil
			}
			return "", errors.New("not found")
		},
		Version: func(_ context.Context, path string) (string, error) { return filepath.Base(path) + " version 1.0", nil },
	}
	checks := HostChecks(context.Background(), o)
	got := map[string]Check{}
	for _, c := range checks {
		got[c.Name] = c
	}
	if c := got["runtime crun"]; c.Status != StatusFail || !strings.Contains(c.Detail, "hugetlb") ||
		!strings.Contains(c.Fix, "mount -t cgroup -o hugetlb cgroup "+cg+"/hugetlb") {
		t.Errorf("crun in hybrid mode with a unified controller: %+v", c)
	}
	if c := got["cgroups"]; c.Status != StatusOK {
		t.Errorf("cgroups: %+v", c)
	}
	if c := got["root filesystem"]; c.Status != StatusOK {
		t.Errorf("root filesystem: %+v", c)
	}
	if c := got["interpreter versions"]; c.Detail != "python 3.11.2, javascript 22.23.5, bash 5.2.15" {
		t.Errorf("versions: %+v", c)
	}
	if c := got["no setuid/setgid files"]; c.Status != StatusFail || !strings.Contains(c.Detail, "/bin/bash") || c.Essential {
		t.Errorf("setuid: %+v", c)
	}

	// runc, not root, no pids controller, no image.
	os.Remove(filepath.Join(cg, "pids/cgroup.procs"))
	o.Runtime, o.ImageDir = "runsc", filepath.Join(t.TempDir(), "none")
	o.Geteuid = func() int { return 1000 }
	got = map[string]Check{}
	for _, c := range HostChecks(context.Background(), o) {
		got[c.Name] = c
	}
	for name, wantFix := range map[string]string{
		"privileges":      "run vertal as root",
		"cgroups":         "mount -t cgroup -o pids",
		"runtime runsc":   "apt-get install runsc",
		"root filesystem": "vertal image build --out " + o.ImageDir,
	} {
		c := got[name]
		if c.Status != StatusFail || !c.Essential || !strings.Contains(c.Fix, wantFix) {
			t.Errorf("%s: %+v; want an essential failure whose fix says %q", name, c, wantFix)
		}
	}
}
