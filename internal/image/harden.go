package image

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SandboxUID and SandboxGID are who user code runs as (nobody:nogroup).
const (
	SandboxUID = 65534
	SandboxGID = 65534
)

// trimPaths are removed from the root filesystem: documentation, manuals,
// translations and package caches that no sandboxed program reads. Globs
// are relative to the root. Copyright files are kept (licences).
var trimPaths = []string{
	"usr/share/man/*",
	"usr/share/info/*",
	"usr/share/groff/*",
	"usr/share/lintian/*",
	"usr/share/linda/*",
	"usr/share/bug/*",
	"usr/share/locale/*",
	"var/cache/apt/*.bin",
	"var/cache/apt/archives/*.deb",
	"var/cache/debconf/*-old",
	"var/lib/apt/lists/*_*",
	"var/lib/dpkg/*-old",
	"var/log/*.log",
	"var/log/apt/*",
}

// keepInTrim are files matched by trimPaths that must stay.
var keepInTrim = map[string]bool{"usr/share/locale/locale.alias": true}

// trim removes what trimPaths names and every file under usr/share/doc
// except copyright notices. It returns the number of bytes freed.
func trim(rootfs string) (int64, error) {
	var freed int64
	for _, g := range trimPaths {
		matches, err := filepath.Glob(filepath.Join(rootfs, g))
		if err != nil {
			return freed, err
		}
		for _, m := range matches {
			rel, _ := filepath.Rel(rootfs, m)
			if keepInTrim[rel] {
				continue
			}
			n, err := removeTree(m)
			freed += n
			if err != nil {
				return freed, err
			}
		}
	}
	doc := filepath.Join(rootfs, "usr/share/doc")
	err := filepath.WalkDir(doc, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || d.Name() == "copyright" {
			return nil
		}
		if info, err := d.Info(); err == nil && d.Type().IsRegular() {
			freed += info.Size()
		}
		return os.Remove(path)
	})
	if err != nil {
		return freed, fmt.Errorf("trimming docs: %w", err)
	}
	// Keep future `apt-get install` inside a derived image just as small.
	nodoc := "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n" +
		"path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n" +
		"path-exclude /usr/share/locale/*\npath-include /usr/share/locale/locale.alias\n"
	if err := os.WriteFile(filepath.Join(rootfs, "etc/dpkg/dpkg.cfg.d/01-vertal-nodoc"), []byte(nodoc), 0o644); err != nil {
		return freed, err
	}
	return freed, nil
}

func removeTree(path string) (int64, error) {
	var n int64
	filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n, os.RemoveAll(path)
}

// hardenReport says what harden changed.
type hardenReport struct {
	SetIDStripped []string // files that lost a setuid/setgid bit
	CapsRemoved   []string // files that lost file capabilities
}

// harden prepares the root filesystem for sandboxes: the mountpoints the
// drivers expect, the sandbox user, no setuid/setgid programs and no file
// capabilities (so nothing in the image can raise privileges even if a
// runtime forgot no_new_privs), and no host identity copied in by
// debootstrap.
func harden(rootfs string) (hardenReport, error) {
	var rep hardenReport
	// /tmp gets a tmpfs, /code the read-only code mount: both must exist
	// and be empty so the image never shows through.
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"tmp", os.ModeSticky | 0o777}, {"code", 0o755}} {
		p := filepath.Join(rootfs, d.path)
		if err := os.RemoveAll(p); err != nil {
			return rep, err
		}
		if err := os.Mkdir(p, d.mode.Perm()); err != nil {
			return rep, err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return rep, err
		}
	}
	// Runtimes mount their own /dev; static nodes from debootstrap are
	// not needed and would only be a way around a missing mount.
	if err := emptyDir(filepath.Join(rootfs, "dev")); err != nil {
		return rep, fmt.Errorf("emptying /dev: %w", err)
	}
	// debootstrap copies the build host's resolv.conf and hostname.
	for name, content := range map[string]string{"etc/resolv.conf": "", "etc/hostname": "sandbox\n"} {
		p := filepath.Join(rootfs, name)
		os.Remove(p) // may be a symlink
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return rep, err
		}
	}
	if err := checkSandboxUser(rootfs); err != nil {
		return rep, err
	}
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(rootfs, path)
		if m := info.Mode(); m&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			// Setgid directories only affect group inheritance; we strip
			// them too, nothing in the image relies on it.
			if err := os.Chmod(path, m&^(fs.ModeSetuid|fs.ModeSetgid)); err != nil {
				return err
			}
			rep.SetIDStripped = append(rep.SetIDStripped, "/"+rel)
		}
		if d.Type().IsRegular() {
			switch err := unix.Lremovexattr(path, "security.capability"); {
			case err == nil:
				rep.CapsRemoved = append(rep.CapsRemoved, "/"+rel)
			case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
			default:
				return fmt.Errorf("removing file capabilities of /%s: %w", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("stripping privileges: %w", err)
	}
	return rep, nil
}

func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return os.Mkdir(dir, 0o755)
		}
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// checkSandboxUser makes sure uid and gid 65534 have names, adding them if
// a base system lacks them (tools such as `id` and Python's getpass look
// them up).
func checkSandboxUser(rootfs string) error {
	for _, f := range []struct {
		file, line string
		id         int
	}{
		{"etc/passwd", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", SandboxUID},
		{"etc/group", "nogroup:x:65534:\n", SandboxGID},
	} {
		path := filepath.Join(rootfs, f.file)
		has, err := hasID(path, f.id)
		if err != nil {
			return err
		}
		if has {
			continue
		}
		fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		_, err = fh.WriteString(f.line)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// hasID reports whether a passwd/group file has an entry with id in its
// third field.
func hasID(path string, id int) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	defer f.Close()
	want := fmt.Sprint(id)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && fields[2] == want {
			return true, nil
		}
	}
	return false, sc.Err()
}

// FindSetID lists files under rootfs with a setuid or setgid bit; doctor
// uses it to check an image.
func FindSetID(rootfs string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			rel, _ := filepath.Rel(rootfs, path)
			found = append(found, "/"+rel)
		}
		return nil
	})
	return found, err
}
