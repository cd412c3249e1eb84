//go:build linux

package oci

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
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

	got, err := sweepHostFiles([]string{root, filepath.Join(root, "missing")}, func(uid uint32) bool {
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
