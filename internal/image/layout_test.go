package image

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSwitchTo: each build becomes current in one step, out/rootfs always
// resolves to a complete tree, and an image of the flat layout is moved
// into versions/ as a retired version.
func TestSwitchTo(t *testing.T) {
	out := filepath.Join(t.TempDir(), "default")
	writeTree(t, out, map[string]string{
		"rootfs/etc/marker": "flat", VersionsFile: `{"python":"flat"}`,
		"versions/v1/rootfs/etc/marker": "v1", "versions/v1/" + VersionsFile: `{"python":"1"}`,
		"versions/v2/rootfs/etc/marker": "v2", "versions/v2/" + VersionsFile: `{"python":"2"}`,
	})
	if err := switchTo(out, "v1"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(out, "rootfs/etc/marker")); got != "v1" {
		t.Errorf("after the first switch rootfs shows %q, want v1", got)
	}
	legacy, _ := filepath.Glob(filepath.Join(out, "versions/legacy-*"))
	if len(legacy) != 1 || readFile(t, filepath.Join(legacy[0], "rootfs/etc/marker")) != "flat" {
		t.Fatalf("flat layout not kept as a version: %v", legacy)
	}
	if _, err := os.Stat(filepath.Join(legacy[0], retiredMarker)); err != nil {
		t.Errorf("flat layout's version not marked retired: %v", err)
	}
	if err := switchTo(out, "v2"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(out, "rootfs/etc/marker")); got != "v2" {
		t.Errorf("rootfs shows %q, want v2", got)
	}
	if v, err := ReadVersions(out); err != nil || v.Python != "2" {
		t.Errorf("versions.json: %+v %v", v, err)
	}
	if CurrentVersion(out) != "v2" {
		t.Errorf("CurrentVersion = %q", CurrentVersion(out))
	}
	if _, err := os.Stat(filepath.Join(out, "versions/v1", retiredMarker)); err != nil {
		t.Errorf("replaced version not marked retired: %v", err)
	}
	if err := checkOut(out); err != nil {
		t.Errorf("a versioned image directory is not taken for an image: %v", err)
	}
}

// TestGC: the current version, versions inside their grace period and
// versions some process runs on stay; the rest, and dead builds, go.
func TestGC(t *testing.T) {
	out := filepath.Join(t.TempDir(), "img")
	old := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	writeTree(t, out, map[string]string{
		"versions/cur/rootfs/x":                "",
		"versions/old/rootfs/x":                "",
		"versions/old/" + retiredMarker:        old,
		"versions/recent/rootfs/x":             "",
		"versions/recent/" + retiredMarker:     time.Now().UTC().Format(time.RFC3339),
		"versions/unmarked/rootfs/x":           "",
		"versions/.build-999999999-1/rootfs/x": "",
	})
	if err := switchTo(out, "cur"); err != nil {
		t.Fatal(err)
	}
	removed, err := GC(out, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{".build-999999999-1", "old"}, removed); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	for _, keep := range []string{"cur", "recent", "unmarked"} {
		if _, err := os.Stat(filepath.Join(out, "versions", keep)); err != nil {
			t.Errorf("version %s removed: %v", keep, err)
		}
	}
}

// TestGCKeepsVersionInUse: a version that a process has as its root (as
// a sandbox has its image's rootfs) is not deleted, however old.
func TestGCKeepsVersionInUse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	out := filepath.Join(t.TempDir(), "img")
	writeTree(t, out, map[string]string{
		"versions/cur/rootfs/x":          "",
		"versions/busy/" + retiredMarker: time.Now().Add(-time.Hour).UTC().Format(time.RFC3339),
	})
	if err := switchTo(out, "cur"); err != nil {
		t.Fatal(err)
	}
	// The host's sleep runs chrooted into the version, with the host's
	// /usr and libraries bound in so it can start.
	rootfs := filepath.Join(out, "versions/busy/rootfs")
	for _, d := range []string{"usr", "lib", "lib64"} {
		src, err := filepath.EvalSymlinks("/" + d)
		if err != nil {
			continue
		}
		dst := filepath.Join(rootfs, d)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			t.Fatalf("bind mount %s: %v", src, err)
		}
		defer syscall.Unmount(dst, syscall.MNT_DETACH)
	}
	cmd := exec.Command("/usr/bin/sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	removed, err := GC(out, time.Minute)
	if err != nil && !strings.Contains(err.Error(), "still mounted") {
		t.Fatal(err)
	}
	if len(removed) != 0 {
		t.Errorf("GC removed %v while a process runs on it", removed)
	}
	if _, err := os.Stat(rootfs); err != nil {
		t.Errorf("busy version deleted: %v", err)
	}
}

func TestCheckRecipe(t *testing.T) {
	wh := t.TempDir()
	writeTree(t, wh, map[string]string{"demo-1.0-py3-none-any.whl": "x"})
	for _, tc := range []struct {
		name string
		o    Options
		want string // substring of the error; "" for none
	}{
		{"ok", Options{Name: "datasci", Apt: []string{"python3-numpy", "libc6"}, Npm: []string{"lodash@4.17.21", "@scope/pkg", "dayjs@^1"}, Wheelhouse: wh}, ""},
		{"bad name", Options{Name: "Data/Sci"}, "image name"},
		{"apt flag", Options{Name: "x", Apt: []string{"-oAPT::x=1"}}, "--apt"},
		{"apt version pin", Options{Name: "x", Apt: []string{"python3=3.11"}}, "--apt"},
		{"npm url", Options{Name: "x", Npm: []string{"https://evil/x.tgz"}}, "--npm"},
		{"npm git", Options{Name: "x", Npm: []string{"github:a/b"}}, "--npm"},
		{"npm flag", Options{Name: "x", Npm: []string{"--registry=x"}}, "--npm"},
		{"empty wheelhouse", Options{Name: "x", Wheelhouse: t.TempDir()}, "no .whl"},
		{"missing wheelhouse", Options{Name: "x", Wheelhouse: "/nonexistent"}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkRecipe(tc.o)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkRecipe = %v; want %q", err, tc.want)
			}
		})
	}
}

func TestInstalledPackagesAndMain(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"var/lib/dpkg/status": "Package: python3-numpy\nStatus: install ok installed\nVersion: 1:1.24.2-1\n\n" +
			"Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n\nPackage: bash\nVersion: 5.2.15-2\nStatus: install ok installed\n",
		npmGlobal + "/lodash/package.json":                                          `{"name":"lodash","version":"4.17.21"}`,
		npmGlobal + "/@scope/pkg/package.json":                                      `{"name":"@scope/pkg","version":"1.0.0"}`,
		"usr/local/lib/python3.11/dist-packages/vertal_demo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: Vertal_Demo\nVersion: 0.1\n\nbody",
	})
	p, err := installedPackages(root)
	if err != nil {
		t.Fatal(err)
	}
	want := Packages{
		Dpkg: map[string]string{"python3-numpy": "1:1.24.2-1", "bash": "5.2.15-2"},
		Npm:  map[string]string{"lodash": "4.17.21", "@scope/pkg": "1.0.0"},
		Pip:  map[string]string{"vertal-demo": "0.1"},
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("packages (-want +got):\n%s", diff)
	}
	m := Manifest{Recipe: Recipe{Apt: []string{"python3-numpy"}, Npm: []string{"@scope/pkg@1", "lodash"},
		Wheels: []string{"vertal_demo-0.1-py3-none-any.whl"}}, Packages: p}
	wantMain := []Package{{"python3-numpy", "1:1.24.2-1", "apt"}, {"@scope/pkg", "1.0.0", "npm"}, {"lodash", "4.17.21", "npm"}, {"vertal-demo", "0.1", "pip"}}
	if diff := cmp.Diff(wantMain, m.Main()); diff != "" {
		t.Errorf("Main (-want +got):\n%s", diff)
	}
}
