package sandbox

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// The working directory (CodeDir) of every sandbox is a host tmpfs of its
// own, mounted by the driver under its per-execution directory and bound
// read-write into the sandbox. The host fills it before the code runs and
// reads the returned files from it after the program ended, so the same
// code serves every driver and runtime (gVisor's gofer passes a host
// mount through, and the host kernel enforces noexec on it).

// MountWorkdir creates dir and mounts the working directory's tmpfs on
// it: l.WorkdirBytes in size, nothing in it executable (noexec) or
// privileged (nosuid, nodev), and sticky and world-writable, so the
// sandbox's uid can create files next to the code file but not replace it.
func MountWorkdir(dir string, l engine.Limits) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("creating working directory: %w", err)
	}
	data := "mode=1777,size=" + strconv.FormatInt(l.WorkdirBytes, 10)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		_ = os.Remove(dir)
		return fmt.Errorf("mounting the working directory: %w", err)
	}
	return nil
}

// UnmountWorkdir detaches the tmpfs at dir, if one is there.
func UnmountWorkdir(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting the working directory %s: %w", dir, err)
	}
	return nil
}

// WriteCode puts the code file in the working directory at dir, owned by
// root and read-only, replacing what is there atomically (write, then
// rename), so an interpreter waiting in a warm sandbox never sees a
// partial file.
func WriteCode(dir, name string, code []byte) error {
	if name == "" || name != path.Base(name) || name == "." || name == ".." {
		return fmt.Errorf("code file needs a plain name, not %q", name)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening working directory: %w", err)
	}
	defer root.Close()
	tmp := ".vertal-code-" + name
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("writing code: %w", err)
	}
	_, werr := f.Write(code)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("writing code: %w", err)
	}
	if err := root.Rename(tmp, name); err != nil {
		return fmt.Errorf("writing code: %w", err)
	}
	return nil
}

// PlaceFiles writes files into the working directory at dir, with their
// directories, owned by uid so the program may change them. Paths are
// checked again here (the caller validated them); nothing is followed
// out of dir.
func PlaceFiles(dir string, files []engine.File, uid uint32) error {
	if len(files) == 0 {
		return nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening working directory: %w", err)
	}
	defer root.Close()
	id := int(uid)
	for _, f := range files {
		if err := CheckFilePath(f.Path); err != nil {
			return fmt.Errorf("file %q: path %w", f.Path, err)
		}
		parts := strings.Split(f.Path, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/")
			if err := root.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("file %q: %w", f.Path, err)
			}
			if err := root.Lchown(d, id, id); err != nil {
				return fmt.Errorf("file %q: %w", f.Path, err)
			}
		}
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o644
		}
		w, err := root.OpenFile(f.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err != nil {
			return fmt.Errorf("file %q: %w", f.Path, err)
		}
		_, werr := w.Write(f.Content)
		if err := errors.Join(werr, w.Chown(id, id), w.Close()); err != nil {
			return fmt.Errorf("file %q: %w", f.Path, err)
		}
	}
	return nil
}

// collectMaxEntries bounds the walk of a working directory, however many
// (empty) files and directories a program made.
const collectMaxEntries = 20000

// CollectFiles returns the regular files under dir whose paths (relative,
// slash-separated) match one of globs, in path order, with at most
// l.ReturnFiles files and l.ReturnBytes bytes in all; truncated is set
// when a matching file was left out for those caps.
//
// dir is written by untrusted code, so nothing in it is trusted: every
// open is beneath dir with no symlink followed at any level
// (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV and
// O_NOFOLLOW), FIFOs and devices are never opened for reading (O_NONBLOCK
// and an fstat check before any read), and a file's size is checked
// before it is read, so a huge sparse file costs nothing.
func CollectFiles(dir string, globs []string, l engine.Limits) ([]engine.File, bool, error) {
	rootFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("opening working directory: %w", err)
	}
	defer unix.Close(rootFD)
	c := collector{root: rootFD, globs: globs, maxFiles: l.ReturnFiles, budget: l.ReturnBytes}
	if err := c.walk(""); err != nil {
		return nil, false, err
	}
	slices.SortFunc(c.files, func(a, b engine.File) int { return strings.Compare(a.Path, b.Path) })
	return c.files, c.truncated, nil
}

type collector struct {
	root      int
	globs     []string
	maxFiles  int
	budget    int64
	entries   int
	files     []engine.File
	truncated bool
}

func (c *collector) openat(rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	return unix.Openat2(c.root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

func (c *collector) match(rel string) bool {
	for _, g := range c.globs {
		if ok, _ := doublestar.Match(g, rel); ok {
			return true
		}
	}
	return false
}

func (c *collector) walk(rel string) error {
	fd, err := c.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil // gone or replaced by something else: nothing to return
	}
	d := os.NewFile(uintptr(fd), rel)
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("reading %q: %w", rel, err)
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range entries {
		if c.entries++; c.entries > collectMaxEntries {
			c.truncated = true
			return nil
		}
		p := e.Name()
		if rel != "" {
			p = rel + "/" + p
		}
		switch {
		case e.IsDir():
			if err := c.walk(p); err != nil {
				return err
			}
		case e.Type().IsRegular() && c.match(p):
			if err := c.read(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// read adds one matching file, if it is still a regular file and fits.
func (c *collector) read(rel string) error {
	fd, err := c.openat(rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil // not a plain file beneath dir any more
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	if len(c.files) >= c.maxFiles || st.Size > c.budget {
		c.truncated = true
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(f, st.Size))
	if err != nil {
		return fmt.Errorf("reading %q: %w", rel, err)
	}
	c.budget -= int64(len(b))
	c.files = append(c.files, engine.File{Path: rel, Content: b, Mode: fs.FileMode(st.Mode).Perm()})
	return nil
}
