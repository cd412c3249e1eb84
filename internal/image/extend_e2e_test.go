package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/image/imagetest"
)

// TestExtendWithWheelsE2E extends the built default image (--from) with a
// Debian package through the image's own apt (python3-pip) and with a
// wheel the test made, installed offline from a wheelhouse: the module
// imports in the new image, its exact version is recorded as a main
// package, nothing is setuid, and the base image is untouched. A second
// build switches the image to a new version and keeps the first until
// it is unused and retired long enough.
func TestExtendWithWheelsE2E(t *testing.T) {
	requireE2E(t)
	base := os.Getenv("VERTAL_ROOTFS")
	if base == "" {
		base = "/var/lib/vertal/images/default/rootfs"
	}
	base = filepath.Dir(base)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	wh := t.TempDir()
	imagetest.WriteWheel(t, wh, "vertal_demo", "0.3.1", "def answer():\n    return 42\n")
	out := filepath.Join(t.TempDir(), "images", "wheels")
	o := Options{Name: "wheels", OutDir: out, From: base, Apt: []string{"python3-pip"}, Wheelhouse: wh}
	var log strings.Builder
	res, err := Build(ctx, o, NewProgress(&log, ProgressOptions{Steps: Steps(o)}))
	if err != nil {
		t.Fatalf("Build: %v\nprogress:\n%s", err, log.String())
	}
	t.Logf("progress:\n%s", log.String())
	rootfs := filepath.Join(out, RootfsDir)
	got, err := RunInRoot(ctx, rootfs, "/usr/bin/python3", "-c", "import vertal_demo; print(vertal_demo.answer())")
	if err != nil || got != "42\n" {
		t.Errorf("the wheel's module in the image: %q %v", got, err)
	}
	m, err := ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.Packages.Pip["vertal-demo"] != "0.3.1" || m.Packages.Dpkg["python3-pip"] == "" || !strings.HasPrefix(m.From, filepath.Base(base)+"@") {
		t.Errorf("manifest: pip %v, python3-pip %q, from %q", m.Packages.Pip, m.Packages.Dpkg["python3-pip"], m.From)
	}
	var mains []string
	for _, p := range m.Main() {
		mains = append(mains, p.Source+":"+p.Name+"="+p.Version)
	}
	if !strings.Contains(strings.Join(mains, " "), "pip:vertal-demo=0.3.1") {
		t.Errorf("main packages: %v", mains)
	}
	if setid, err := FindSetID(res.Dir + "/" + VersionsSubdir + "/" + res.Version + "/" + RootfsDir); err != nil || len(setid) != 0 {
		t.Errorf("setuid files: %v %v", setid, err)
	}
	if _, err := os.Stat(filepath.Join(base, RootfsDir, "usr/local/lib/python3.11/dist-packages/vertal_demo")); err == nil {
		t.Error("the base image was changed")
	}
	for _, d := range []string{"dev", "tmp", "proc"} {
		if entries, _ := os.ReadDir(filepath.Join(rootfs, d)); len(entries) != 0 {
			t.Errorf("/%s left non-empty: %d entries", d, len(entries))
		}
	}

	// Rebuild: a new version becomes current; the first stays (within
	// its grace) and goes once retired long enough.
	first := res.Version
	o.Wheelhouse, o.Apt = "", nil
	res2, err := Build(ctx, o, nil)
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if res2.Version == first || CurrentVersion(out) != res2.Version {
		t.Fatalf("current %s after rebuild, first %s, second %s", CurrentVersion(out), first, res2.Version)
	}
	if _, err := os.Stat(filepath.Join(out, VersionsSubdir, first, RootfsDir)); err != nil {
		t.Errorf("the replaced version was deleted within its grace: %v", err)
	}
	removed, err := GC(out, 0)
	if err != nil || len(removed) != 1 || removed[0] != first {
		t.Errorf("GC(0) removed %v, %v; want [%s]", removed, err, first)
	}
}
