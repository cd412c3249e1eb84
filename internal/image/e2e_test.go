package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dockerimage "github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// requireE2E skips unless VERTAL_E2E=1 (CI sets it and fails on a skip).
func requireE2E(t *testing.T) {
	e2etest.Require(t, "root, debootstrap, npm and network to the mirrors, to build a real image")
}

// TestBuildE2E builds a real image from Debian and npm into a temporary
// directory, then proves what the image promises: the recorded versions
// are those of the interpreters, all three run (chrooted), nothing is
// setuid, the sandbox user and mountpoints exist. It also rebuilds over
// it (the atomic swap) and imports it into Docker.
func TestBuildE2E(t *testing.T) {
	requireE2E(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "images", "default")

	var log strings.Builder
	res, err := Build(ctx, Options{OutDir: out}, NewProgress(&log, ProgressOptions{Steps: Steps(Options{})}))
	if err != nil {
		t.Fatalf("Build: %v\nprogress:\n%s", err, log.String())
	}
	t.Logf("progress:\n%s", log.String())
	rootfs := filepath.Join(out, RootfsDir)

	v, err := ReadVersions(out)
	if err != nil {
		t.Fatal(err)
	}
	if v != res.Versions || v.Python == "" || v.JavaScript == "" || v.Bash == "" {
		t.Fatalf("versions.json %+v, build reported %+v", v, res.Versions)
	}
	if !strings.HasPrefix(v.Python, "3.") || !strings.HasPrefix(v.JavaScript, "22.") || !strings.HasPrefix(v.Bash, "5.") {
		t.Errorf("unexpected versions %+v (want Python 3, Node 22, Bash 5)", v)
	}
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"/usr/bin/python3", "-c", "import platform, sqlite3, ssl; print(platform.python_version())"}, v.Python + "\n"},
		{[]string{"/usr/local/bin/node", "-p", "process.versions.node"}, v.JavaScript + "\n"},
		{[]string{"/usr/bin/node", "-e", "console.log(6*7)"}, "42\n"},
		{[]string{"/bin/bash", "-c", `echo "${BASH_VERSION%%(*}"`}, v.Bash + "\n"},
		{[]string{"/usr/bin/id", "-un", "65534"}, "nobody\n"},
		{[]string{"/usr/bin/id", "-gn", "65534"}, "nogroup\n"},
		// The tools every image carries (Tools): HackerRank-style Bash
		// needs bc, or "succeeds" with a wrong answer.
		{[]string{"/bin/bash", "-c", `echo 'scale=3; 1/3' | bc; echo '{"a":42}' | jq .a; file -b --mime-type /bin/bash; command -v ps free top pgrep pkill watch`},
			".333\n42\napplication/x-pie-executable\n/usr/bin/ps\n/usr/bin/free\n/usr/bin/top\n/usr/bin/pgrep\n/usr/bin/pkill\n/usr/bin/watch\n"},
	} {
		got, err := RunInRoot(ctx, rootfs, tc.argv...)
		if err != nil || got != tc.want {
			t.Errorf("%v in chroot: %q, %v; want %q", tc.argv, got, err, tc.want)
		}
	}
	if setid, err := FindSetID(rootfs); err != nil || len(setid) != 0 {
		t.Errorf("setuid/setgid files in the image: %v %v", setid, err)
	}
	for _, dir := range []string{"tmp", "code", "dev"} {
		entries, err := os.ReadDir(filepath.Join(rootfs, dir))
		if err != nil || len(entries) != 0 {
			t.Errorf("/%s must exist and be empty: %v %v", dir, entries, err)
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/lib/python3.11/json/__pycache__")); err != nil {
		t.Errorf("precompiled stdlib missing (a read-only root cannot write .pyc): %v", err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/share/man/man1/bash.1.gz")); err == nil {
		t.Error("manual pages were not trimmed")
	}

	// A second build replaces the first atomically and leaves no build
	// directory behind.
	marker := filepath.Join(rootfs, "etc/old-image-marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(ctx, Options{OutDir: out}, nil); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("old image still in place after rebuild: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".*")); len(left) != 0 {
		t.Errorf("build directories left behind: %v", left)
	}

	// Docker import (CI runs dockerd); the tag is unique and removed after.
	tag := fmt.Sprintf("vertal/image-e2e:%d", os.Getpid())
	id, err := DockerImport(ctx, out, tag, v)
	if err != nil {
		t.Fatalf("DockerImport: %v", err)
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	defer cli.ImageRemove(context.Background(), tag, dockerimage.RemoveOptions{Force: true, PruneChildren: true})
	inspect, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	if inspect.ID != id || inspect.Config.Labels["io.vertal.python"] != v.Python || inspect.Config.User != "65534:65534" {
		t.Errorf("imported image: id %s (want %s), labels %v, user %q", inspect.ID, id, inspect.Config.Labels, inspect.Config.User)
	}
	// Importing again moves the tag and removes the image it named.
	id2, err := DockerImport(ctx, out, tag, v)
	if err != nil {
		t.Fatalf("second DockerImport: %v", err)
	}
	if id2 != id {
		if _, err := cli.ImageInspect(ctx, id); err == nil {
			t.Errorf("previous image %s still present after re-import", id)
		}
	}
}

// TestFailedBuildKeepsOldImage: a build that fails (an unreachable mirror)
// leaves the previous image as it was and no build directory.
func TestFailedBuildKeepsOldImage(t *testing.T) {
	requireE2E(t)
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "default")
	writeTree(t, out, map[string]string{"rootfs/etc/marker": "old", VersionsFile: `{"python":"old"}`})
	_, err := Build(ctx, Options{OutDir: out, Mirror: "http://127.0.0.1:9/debian", CacheDir: "-"}, nil)
	if err == nil {
		t.Fatal("Build with an unreachable mirror succeeded")
	}
	if !strings.Contains(err.Error(), "127.0.0.1:9") {
		t.Errorf("error does not show debootstrap's complaint: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "rootfs/etc/marker")); err != nil || string(b) != "old" {
		t.Errorf("old image damaged: %q %v", b, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".*")); len(left) != 0 {
		t.Errorf("build directories left behind: %v", left)
	}
}

// TestRemoveBuildDirDetachesMounts: an interrupted debootstrap leaves
// /proc mounted in its target; removing the build must detach it rather
// than delete through it.
func TestRemoveBuildDirDetachesMounts(t *testing.T) {
	requireE2E(t)
	dir := filepath.Join(t.TempDir(), ".default.build-1")
	proc := filepath.Join(dir, "rootfs/proc")
	if err := os.MkdirAll(proc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", proc, "proc", 0, ""); err != nil {
		t.Fatalf("mounting proc: %v", err)
	}
	if err := removeBuildDir(dir); err != nil {
		unix.Unmount(proc, unix.MNT_DETACH)
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("build dir still there: %v", err)
	}
	if m, _ := mountsUnder(dir); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Errorf("host /proc damaged: %v", err)
	}
}
