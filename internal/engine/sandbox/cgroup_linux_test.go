package sandbox

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/moby/sys/mountinfo"
)

func TestParseMountinfo(t *testing.T) {
	info := strings.Join([]string{
		"35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
		"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,memory_localevents",
		`99 1 0:50 / /run/a\040b rw shared:1 - tmpfs tmpfs rw,size=16m`,
	}, "\n")
	infos, err := mountinfo.GetMountsFromReader(strings.NewReader(info), mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		t.Fatal(err)
	}
	want := []CgroupMount{
		{Point: "/sys/fs/cgroup/memory", Version: 1, Options: []string{"rw", "memory"}},
		{Point: "/sys/fs/cgroup/unified", Version: 2, Options: []string{"rw", "memory_localevents"}},
	}
	if diff := cmp.Diff(want, cgroupMounts(infos)); diff != "" {
		t.Errorf("cgroup mounts (-want +got):\n%s", diff)
	}
	all, err := mountinfo.GetMountsFromReader(strings.NewReader(info), mountinfo.PrefixFilter("/run/a b"))
	if err != nil || len(all) != 1 || all[0].Mountpoint != "/run/a b" {
		t.Errorf("escaped mount point: %v, %v", all, err)
	}
	if _, err := mountinfo.GetMountsFromReader(strings.NewReader("garbage"), nil); err == nil {
		t.Error("a garbage line parsed")
	}
}

func TestMountsUnder(t *testing.T) {
	// /proc is mounted here; nothing is under a fresh temp directory.
	got, err := MountsUnder("/proc")
	if err != nil || len(got) == 0 || got[0] != "/proc" {
		t.Errorf("MountsUnder(/proc) = %v, %v", got, err)
	}
	if got, err := MountsUnder(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("MountsUnder(temp dir) = %v, %v; want none", got, err)
	}
}

func TestCgroupFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("memory.peak", "4096\n")
	write("cpu.stat", "usage_usec 1500000\nuser_usec 1000000\n")
	write("cpuacct.usage", "2500000000\n")
	write("memory.max_usage_in_bytes", "8192\n")
	if n, err := ReadCgroupInt(filepath.Join(dir, "memory.peak")); err != nil || n != 4096 {
		t.Errorf("ReadCgroupInt = %d, %v; want 4096", n, err)
	}
	write("memory.max", "max\n")
	write("long", strings.Repeat("1", 80)+"\n")
	for _, name := range []string{"memory.max", "long", "missing"} {
		if n, err := ReadCgroupInt(filepath.Join(dir, name)); err == nil {
			t.Errorf("ReadCgroupInt(%s) = %d, nil; want an error", name, n)
		}
	}
	if _, err := ReadCgroupInt(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadCgroupInt(missing) = %v; want fs.ErrNotExist", err)
	}
	f, err := os.Open(filepath.Join(dir, "memory.peak"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := ReadCgroupIntFrom(f); err != nil || n != 4096 {
		t.Errorf("ReadCgroupIntFrom = %d, %v; want 4096", n, err)
	}
	if n, ok := CgroupStatField(filepath.Join(dir, "cpu.stat"), "user_usec"); !ok || n != 1000000 {
		t.Errorf("CgroupStatField(user_usec) = %d, %v", n, ok)
	}
	if _, ok := CgroupStatField(filepath.Join(dir, "cpu.stat"), "nope"); ok {
		t.Error("CgroupStatField found a missing key")
	}
	if cpu, peak := CgroupV1Usage(dir, dir); cpu != 2.5 || peak != 8192 {
		t.Errorf("CgroupV1Usage = %v, %d; want 2.5, 8192", cpu, peak)
	}
	if cpu, peak := CgroupV1Usage(filepath.Join(dir, "gone"), dir+"/gone"); cpu != 0 || peak != 0 {
		t.Errorf("CgroupV1Usage of nothing = %v, %d; want 0, 0", cpu, peak)
	}
}

func TestRemoveCgroup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "exe_1")
	if err := RemoveCgroup(dir, nil); err != nil {
		t.Errorf("removing what is gone: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCgroup(dir, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", dir, err)
	}
	var w *OOMWatch
	if w.Fired() {
		t.Error("a nil OOMWatch fired")
	}
	w.Close()
}
