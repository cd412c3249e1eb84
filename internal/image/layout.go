package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// An image directory is versioned so that an image can be rebuilt or
// removed while sandboxes run on it:
//
//	NAME/versions/<id>/{rootfs,versions.json,image.json}  one complete build each
//	NAME/current -> versions/<id>                          switched atomically (rename)
//	NAME/rootfs -> current/rootfs                          the path drivers are given
//	NAME/versions.json -> current/versions.json
//	NAME/image.json -> current/image.json
//
// The runtime resolves NAME/rootfs when it creates a sandbox and keeps
// that tree mounted, so a switch never changes the files under a running
// (or warm) sandbox; a version no longer current is deleted by GC once no
// process has it as its root or mounted, and not before RetireGrace has
// passed since the switch (a runtime may have resolved the link a moment
// before and not mounted it yet).
const (
	VersionsSubdir = "versions"
	CurrentLink    = "current"
	ManifestFile   = "image.json"
	retiredMarker  = ".retired"
)

// RetireGrace is how long a replaced version is kept at least.
const RetireGrace = 2 * time.Minute

// newVersionID names a build: sortable by time, unique within a second.
func newVersionID(now time.Time) string {
	return now.UTC().Format("20060102T150405Z") + "-" + strconv.Itoa(os.Getpid()%100000)
}

// switchTo makes versions/<id> the current version of the image at out.
// Every step is one rename, so a reader of out/rootfs always finds a
// complete tree: the old one until the switch, the new one after. An
// image of the older flat layout (out/rootfs a directory) is moved into
// versions/ on the way, also without a moment where out/rootfs is missing.
func switchTo(out, id string) error {
	tmpLink := filepath.Join(out, ".current.new")
	os.Remove(tmpLink)
	if err := os.Symlink(filepath.Join(VersionsSubdir, id), tmpLink); err != nil {
		return err
	}
	prev, _ := os.Readlink(filepath.Join(out, CurrentLink))
	if err := os.Rename(tmpLink, filepath.Join(out, CurrentLink)); err != nil {
		return fmt.Errorf("switching %s to %s: %w", out, id, err)
	}
	if prev != "" && filepath.Base(prev) != id {
		markRetired(filepath.Join(out, VersionsSubdir, filepath.Base(prev)))
	}
	var legacy string
	for _, name := range []string{RootfsDir, VersionsFile, ManifestFile} {
		p := filepath.Join(out, name)
		fi, lerr := os.Lstat(p)
		if lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			continue
		}
		if lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
			return lerr
		}
		link := filepath.Join(out, "."+name+".link")
		os.Remove(link)
		if err := os.Symlink(filepath.Join(CurrentLink, name), link); err != nil {
			return err
		}
		if lerr != nil {
			if err := os.Rename(link, p); err != nil {
				return err
			}
			continue
		}
		// The flat layout's tree: exchanged with the link in one step,
		// then kept as a retired version until unused.
		if err := unix.Renameat2(unix.AT_FDCWD, link, unix.AT_FDCWD, p, unix.RENAME_EXCHANGE); err != nil {
			return fmt.Errorf("replacing %s by a link: %w", p, err)
		}
		if legacy == "" {
			legacy = filepath.Join(out, VersionsSubdir, "legacy-"+newVersionID(time.Now()))
			if err := os.MkdirAll(legacy, 0o755); err != nil {
				return err
			}
			markRetired(legacy)
		}
		if err := os.Rename(link, filepath.Join(legacy, name)); err != nil {
			return err
		}
	}
	return nil
}

func markRetired(dir string) {
	_ = os.WriteFile(filepath.Join(dir, retiredMarker), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644)
}

// CurrentVersion is the id of the image's current version ("" for an
// image of the flat layout).
func CurrentVersion(out string) string {
	l, err := os.Readlink(filepath.Join(out, CurrentLink))
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}

// GC deletes the versions of the image at out that are neither current
// nor in use, retired at least grace ago, and returns what it removed.
// Directories of interrupted builds go too.
func GC(out string, grace time.Duration) ([]string, error) {
	dir := filepath.Join(out, VersionsSubdir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	cur := CurrentVersion(out)
	var roots []rootID
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || e.Name() == cur {
			continue
		}
		v := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".build-") {
			if buildPID(e.Name()) != 0 && processAlive(buildPID(e.Name())) {
				continue
			}
		} else {
			b, err := os.ReadFile(filepath.Join(v, retiredMarker))
			if err != nil {
				markRetired(v) // retired by a remove or a crash: start its grace now
				continue
			}
			at, err := time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
			if err == nil && time.Since(at) < grace {
				continue
			}
			if roots == nil {
				roots = processRoots()
			}
			if inUse(v, roots) {
				continue
			}
		}
		if err := removeBuildDir(v); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	sort.Strings(removed)
	return removed, errors.Join(errs...)
}

// Remove takes the image at out out of service: its links go at once (new
// sandboxes cannot start on it), its versions when unused (GC).
func Remove(out string) error {
	if err := checkOut(out); err != nil {
		return err
	}
	if cur := CurrentVersion(out); cur != "" {
		markRetired(filepath.Join(out, VersionsSubdir, cur))
	}
	for _, name := range []string{RootfsDir, VersionsFile, ManifestFile, CurrentLink} {
		p := filepath.Join(out, name)
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeSymlink == 0 {
			return fmt.Errorf("%s is an image of the flat layout; rebuild it once (or delete it by hand when nothing runs)", out)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// buildPID is the builder's pid in a ".build-<pid>-..." name.
func buildPID(name string) int {
	rest := strings.TrimPrefix(name, ".build-")
	n, _ := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
	return n
}

func processAlive(pid int) bool { return unix.Kill(pid, 0) == nil }

type rootID struct{ dev, ino uint64 }

// processRoots is the root directory of every process on the host: a
// sandbox's is its image's rootfs (crun and runc pivot into it).
func processRoots() []rootID {
	var out []rootID
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", p.Name(), "root"), &st) == nil {
			out = append(out, rootID{uint64(st.Dev), st.Ino})
		}
	}
	return out
}

// inUse reports whether a version's rootfs is some process's root, or is
// mounted somewhere (a runtime that keeps the tree without pivoting into
// it, such as a gVisor gofer, shows it in its mount table).
func inUse(version string, roots []rootID) bool {
	rootfs := filepath.Join(version, RootfsDir)
	var st syscall.Stat_t
	if syscall.Stat(rootfs, &st) != nil {
		return false
	}
	want := rootID{uint64(st.Dev), st.Ino}
	for _, r := range roots {
		if r == want {
			return true
		}
	}
	return mountedAnywhere(version)
}

// mountedAnywhere looks through every mount namespace's table for a mount
// whose source lies inside dir (matched by its path below the filesystem
// root, the 4th field of mountinfo).
func mountedAnywhere(dir string) bool {
	suffix := filepath.Join(filepath.Base(filepath.Dir(filepath.Dir(dir))), VersionsSubdir, filepath.Base(dir))
	seen := map[string]bool{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join("/proc", p.Name(), "ns/mnt"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		f, err := os.Open(filepath.Join("/proc", p.Name(), "mountinfo"))
		if err != nil {
			continue
		}
		mounts, err := mountinfo.GetMountsFromReader(f, nil)
		f.Close()
		if err != nil {
			continue
		}
		for _, m := range mounts {
			if strings.HasSuffix(m.Root, suffix) || strings.Contains(m.Root, suffix+"/") {
				return true
			}
		}
	}
	return false
}
