//go:build linux

package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
)

// TestSweepHostFiles: under a root laid out like /tmp, the sweep removes
// what orphan uids own (files, symlinks, FIFOs, directories once empty)
// at the top level and below, and nothing of another uid, nothing behind
// a symlink, nothing on a mount below the root; a file an orphan uid
// swaps for a symlink at the last moment costs only the symlink.
func TestSweepHostFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to other uids")
	}
	const orphan, racer, other = 2_000_000_123, 2_000_000_124, 12345
	root, outside := t.TempDir(), t.TempDir()
	for _, d := range []string{root, outside} {
		if err := os.Chmod(d, 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	file := func(path string, uid, size int) {
		t.Helper()
		if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	dir := func(path string, uid int) {
		t.Helper()
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	symlink := func(target, path string, uid int) {
		t.Helper()
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(path, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	file(filepath.Join(root, "x.123"), orphan, 100)
	file(filepath.Join(root, "keep"), other, 10)
	dir(filepath.Join(root, "mixed"), orphan)
	file(filepath.Join(root, "mixed", "a"), orphan, 20)
	file(filepath.Join(root, "mixed", "b"), other, 1)
	dir(filepath.Join(root, "own"), orphan)
	dir(filepath.Join(root, "own", "deep"), orphan)
	file(filepath.Join(root, "own", "deep", "c"), orphan, 30)
	dir(filepath.Join(root, "roots"), 0)
	file(filepath.Join(root, "roots", "d"), orphan, 40)
	file(filepath.Join(outside, "target"), other, 1)
	file(filepath.Join(outside, "behind-link"), orphan, 1)
	symlink(filepath.Join(outside, "target"), filepath.Join(root, "link"), orphan)
	symlink(outside, filepath.Join(root, "dirlink"), other)
	if err := unix.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(root, "fifo"), orphan, orphan); err != nil {
		t.Fatal(err)
	}
	// A bind mount of outside below the root: the sweep does not cross it.
	dir(filepath.Join(root, "mnt"), 0)
	if err := unix.Mount(outside, filepath.Join(root, "mnt"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(root, "mnt"), unix.MNT_DETACH) })
	// racer's file turns into a symlink to another uid's file between
	// the sweep's look and its unlink.
	dir(filepath.Join(root, "race"), 0)
	file(filepath.Join(root, "race", "f"), racer, 1)
	raced := false

	got, err := sweepHostFiles(context.Background(), []string{root, filepath.Join(root, "missing")}, func(uid uint32) bool {
		if uid == racer && !raced {
			raced = true
			f := filepath.Join(root, "race", "f")
			if err := os.Remove(f); err != nil {
				t.Error(err)
			}
			symlink(filepath.Join(outside, "target"), f, racer)
		}
		return uid == orphan || uid == racer
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := (swept{files: 9, bytes: 100 + 20 + 30 + 40 + 1}); got != want {
		t.Errorf("swept %+v, want %+v", got, want)
	}
	var left []string
	for _, d := range []string{root, outside} {
		filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if path != d {
				left = append(left, strings.TrimPrefix(strings.Replace(path, outside, "outside", 1), root+"/"))
			}
			return err
		})
	}
	slices.Sort(left)
	want := []string{"dirlink", "keep", "mixed", "mixed/b", "mnt", "mnt/behind-link", "mnt/target", "outside/behind-link", "outside/target", "race", "roots"}
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}
}

// TestReapSweepsHostFilesE2E: a real sandbox runs on bwrap and tells its
// host uid (its user namespace's map); once it is done, a file that uid
// writes in a host temporary directory is removed by the sweep a server
// runs after Reap (SweepHostFiles), while a file
// of another uid and one of a uid a live lease holds stay. The sweep's
// root is a directory of this test, laid out like /dev/shm, so that the
// test does not touch what other tests on the host keep in /tmp.
func TestReapSweepsHostFilesE2E(t *testing.T) {
	e2e(t)
	d := newTestDriver(t, "bwrap")
	res, err := d.Run(context.Background(), enginetest.Complete(engine.Spec{Language: testLanguages()["bash"], Code: "cat /proc/self/uid_map", Timeout: 20 * time.Second}))
	if err != nil || res.Status != engine.StatusSucceeded {
		t.Fatalf("Run: %v %+v", err, res)
	}
	fields := strings.Fields(res.Stdout)
	if len(fields) < 3 {
		t.Fatalf("uid_map %q", res.Stdout)
	}
	uid64, err := strconv.ParseUint(fields[1], 10, 32)
	if err != nil || !d.uids.Contains(uint32(uid64)) {
		t.Fatalf("the sandbox ran as host uid %q, not one of the pool's (%v)", fields[1], err)
	}
	sandboxUID := uint32(uid64)
	lease, err := d.uids.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()

	root := t.TempDir()
	if err := os.Chmod(root, 0o1777); err != nil {
		t.Fatal(err)
	}
	// write creates name in root as uid, the way a process of that uid does.
	write := func(uid uint32, name string) string {
		t.Helper()
		path := filepath.Join(root, name)
		cmd := exec.Command("/bin/sh", "-c", `head -c 4096 /dev/zero > "$0"`, path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("writing %s as uid %d: %v %s", name, uid, err, out)
		}
		return path
	}
	left := write(sandboxUID, "x.4242")
	others := write(65534, "nobody")
	held := write(lease.UID, "held")

	d.sweepRoots = []string{root}
	if _, err := d.Reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.SweepHostFiles(context.Background())
	if _, err := os.Lstat(left); err == nil {
		t.Errorf("the file sandbox uid %d left is still there", sandboxUID)
	}
	for _, p := range []string{others, held} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: %v", filepath.Base(p), err)
		}
	}
}

// manyFiles makes n empty files in a new directory, owned by this test's
// uid, and returns the directory.
func manyFiles(t *testing.T, n int) string {
	t.Helper()
	root := t.TempDir()
	for i := range n {
		if err := os.WriteFile(filepath.Join(root, "f"+strconv.Itoa(i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func countEntries(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestSweepHostFilesManyEntriesAndCancel: a directory of more entries
// than one read of the sweep takes is swept whole, batch after batch;
// a sweep whose ctx ends stops at once with ctx's error instead of
// running through a directory of thousands, and a cancelled one removes
// nothing.
func TestSweepHostFilesManyEntriesAndCancel(t *testing.T) {
	me := uint32(os.Getuid())
	mine := func(uid uint32) bool { return uid == me }

	n := 3*sweepBatch + 7
	root := manyFiles(t, n)
	got, err := sweepHostFiles(context.Background(), []string{root}, mine)
	if err != nil || got.files != n || countEntries(t, root) != 0 {
		t.Fatalf("swept %+v (%v), %d left; want all %d", got, err, countEntries(t, root), n)
	}

	root = manyFiles(t, 2000)
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	got, err = sweepHostFiles(ctx, []string{root}, func(uid uint32) bool {
		if calls++; calls == 10 {
			cancel() // the server is shutting down
		}
		return mine(uid)
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("sweep under a cancelled ctx: error %v, want context.Canceled", err)
	}
	if got.files != 10 || countEntries(t, root) != 2000-10 {
		t.Errorf("swept %d, %d left after the ctx ended at the 10th entry; want 10 swept", got.files, countEntries(t, root))
	}

	got, err = sweepHostFiles(ctx, []string{root}, mine)
	if !errors.Is(err, context.Canceled) || got.files != 0 {
		t.Errorf("sweep with an ended ctx: %+v %v, want nothing swept and context.Canceled", got, err)
	}
}

// flippingHolder is a uid pool where a sandbox takes uid after the first
// time it is asked about.
type flippingHolder struct {
	uid   uint32
	asked int
}

func (h *flippingHolder) Contains(uid uint32) bool { return uid == h.uid }

func (h *flippingHolder) Held(uint32) bool {
	h.asked++
	return h.asked > 1
}

// TestSweepRechecksHeld: the sweep runs while the server starts
// sandboxes; a uid that was free when the sweep met its first file but
// that a sandbox has taken since keeps the rest of its files.
func TestSweepRechecksHeld(t *testing.T) {
	root := manyFiles(t, 5)
	h := &flippingHolder{uid: uint32(os.Getuid())}
	got, err := sweepHostFiles(context.Background(), []string{root}, orphanUIDs(h))
	if err != nil {
		t.Fatal(err)
	}
	if got.files != 1 || countEntries(t, root) != 4 {
		t.Errorf("swept %d files of a uid taken after the first, %d left; want 1 swept, 4 left", got.files, countEntries(t, root))
	}
}
