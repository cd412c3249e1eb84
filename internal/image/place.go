package image

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// ErrNotAnImage means --out names an existing directory that is not a
// previous image, which we refuse to replace.
var ErrNotAnImage = errors.New("exists and is not a vertal image directory")

// checkOut validates the output directory before a long build starts. An
// existing directory is only replaced when it is empty or looks like an
// image (has rootfs/ or versions.json): a typo such as --out /tmp must not
// swap away a system directory.
func checkOut(out string) error {
	if !filepath.IsAbs(out) {
		return fmt.Errorf("output directory %q must be absolute", out)
	}
	clean := filepath.Clean(out)
	if clean == "/" || filepath.Dir(clean) == "/" {
		return fmt.Errorf("output directory %s: refusing a top-level directory", clean)
	}
	entries, err := os.ReadDir(clean)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("output directory: %w", err)
	case len(entries) == 0:
		return nil
	}
	for _, e := range entries {
		switch e.Name() {
		case RootfsDir, VersionsFile, CurrentLink, VersionsSubdir:
			return nil
		}
	}
	return fmt.Errorf("%s %w (no %s/ or %s inside); choose another --out", clean, ErrNotAnImage, RootfsDir, VersionsFile)
}

// buildPrefix names the build directory that builds before versioned
// image directories used, next to the output.
func buildPrefix(out string) string { return "." + filepath.Base(out) + ".build-" }

// cleanStaleBuilds removes build directories left by an interrupted build.
func cleanStaleBuilds(out string) error {
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(out), buildPrefix(out)+"*"))
	if err != nil {
		return err
	}
	for _, m := range matches {
		if err := removeBuildDir(m); err != nil {
			return err
		}
	}
	return nil
}

// removeBuildDir deletes a build tree. debootstrap mounts /proc and /sys
// inside its target, and a killed run leaves them mounted: deleting
// through such a mount would delete host files, so every mount under dir
// is detached first, and nothing is deleted while one remains.
func removeBuildDir(dir string) error {
	dir = filepath.Clean(dir)
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmounting %s: %w", m, err)
		}
	}
	if left, err := mountsUnder(dir); err != nil {
		return err
	} else if len(left) > 0 {
		return fmt.Errorf("not deleting %s: still mounted: %s", dir, strings.Join(left, ", "))
	}
	return os.RemoveAll(dir)
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	mounts, err := parseMountPoints(f, dir)
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	return mounts, nil
}

func parseMountPoints(r io.Reader, dir string) ([]string, error) {
	infos, err := mountinfo.GetMountsFromReader(r, mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool {
		di, dj := strings.Count(out[i], "/"), strings.Count(out[j], "/")
		if di != dj {
			return di > dj
		}
		return out[i] < out[j]
	})
	return out, nil
}
