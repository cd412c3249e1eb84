package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// hostTempDirs are the host directories any user may write to. A sandbox
// uid that wrote there (a host-side helper running as it, such as bwrap
// before it enters the sandbox) left files that survive its sandbox.
var hostTempDirs = []string{"/dev/shm", "/tmp", "/var/tmp"}

// maxSweepDepth bounds the directories the sweep descends into.
const maxSweepDepth = 64

// sweepBatch is how many names the sweep reads from a directory at once,
// so that a directory holding millions of entries costs a bounded amount
// of memory at a time.
const sweepBatch = 256

// swept is what a sweep removed.
type swept struct {
	files int   // entries of any type, directories included
	bytes int64 // sizes of the regular files among them
}

// sweepHostFiles removes, under each root, every entry owned by a uid
// that orphan reports true for: directories once empty, and anything
// else. It never follows a symlink and never leaves the root's mount, and
// it works relative to directory descriptors it opened itself, so an
// entry replaced meanwhile by a symlink cannot send it elsewhere. Entries
// of other uids are never touched; a directory of an orphan uid that
// holds them stays. orphan is asked again for each entry, right before it
// is removed. The sweep stops, with ctx's error, when ctx ends.
func sweepHostFiles(ctx context.Context, roots []string, orphan func(uid uint32) bool) (swept, error) {
	var total swept
	var errs []error
	for _, root := range roots {
		if ctx.Err() != nil {
			break
		}
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("opening %s: %w", root, err))
			continue
		}
		var st unix.Statx_t
		if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &st); err != nil {
			unix.Close(fd)
			errs = append(errs, fmt.Errorf("statx %s: %w", root, err))
			continue
		}
		s := sweeper{ctx: ctx, orphan: orphan, mnt: st.Mnt_id}
		s.dir(fd, root, 0)
		unix.Close(fd)
		total.files += s.done.files
		total.bytes += s.done.bytes
		errs = append(errs, s.errs...)
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("sweep stopped: %w", err))
	}
	return total, errors.Join(errs...)
}

type sweeper struct {
	ctx    context.Context
	orphan func(uid uint32) bool
	mnt    uint64 // the root's mount
	done   swept
	errs   []error
}

// dir sweeps the entries of the directory open as fd (at path, for
// messages); it does not close fd.
func (s *sweeper) dir(fd int, path string, depth int) {
	// A second descriptor to read names with; fd stays for the *at calls.
	rfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("opening %s: %w", path, err))
		return
	}
	f := os.NewFile(uintptr(rfd), path)
	defer f.Close()
	for s.ctx.Err() == nil {
		names, err := f.Readdirnames(sweepBatch)
		if len(names) == 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				s.errs = append(s.errs, fmt.Errorf("reading %s: %w", path, err))
			}
			return
		}
		s.entries(fd, path, names, depth)
	}
}

// entries sweeps names, entries of the directory open as fd.
func (s *sweeper) entries(fd int, path string, names []string, depth int) {
	for _, name := range names {
		if s.ctx.Err() != nil {
			return
		}
		var st unix.Statx_t
		if err := unix.Statx(fd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_TYPE|unix.STATX_UID|unix.STATX_SIZE|unix.STATX_INO|unix.STATX_MNT_ID, &st); err != nil {
			continue // gone meanwhile
		}
		if st.Mnt_id != s.mnt {
			continue // a mount point: another file system, or a bind mount
		}
		full := filepath.Join(path, name)
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if depth < maxSweepDepth {
				s.subdir(fd, name, full, st, depth)
			}
			continue
		}
		if !s.orphan(st.Uid) {
			continue
		}
		// The name is unlinked in the directory fd refers to, never
		// through a path. Were it replaced since the statx, only its
		// owner could have done it (these directories are sticky, or the
		// orphan uid's own), so nothing another uid owns is lost.
		if err := unix.Unlinkat(fd, name, 0); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				s.errs = append(s.errs, fmt.Errorf("removing %s: %w", full, err))
			}
			continue
		}
		s.done.files++
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			s.done.bytes += int64(st.Size)
		}
	}
}

// subdir sweeps directory name of parent fd (seen as st), then removes it
// if an orphan uid owns it and it is empty.
func (s *sweeper) subdir(parent int, name, full string, st unix.Statx_t, depth int) {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return // replaced by something else, or gone
	}
	defer unix.Close(fd)
	var now unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_MNT_ID, &now); err != nil ||
		now.Ino != st.Ino || now.Dev_major != st.Dev_major || now.Dev_minor != st.Dev_minor || now.Mnt_id != s.mnt {
		return // not the directory that was looked at
	}
	s.dir(fd, full, depth+1)
	if !s.orphan(st.Uid) {
		return
	}
	switch err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); {
	case err == nil:
		s.done.files++
	case errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EEXIST), errors.Is(err, unix.ENOENT), errors.Is(err, unix.EBUSY):
		// holds what others own, is gone, or is a mount point
	default:
		s.errs = append(s.errs, fmt.Errorf("removing %s: %w", full, err))
	}
}

// uidHolder tells the sandbox uids and which of them a live sandbox
// holds (uidpool.Pool).
type uidHolder interface {
	Contains(uid uint32) bool
	Held(uid uint32) bool
}

// orphanUIDs is the sweep's orphan test over u. A uid found held is
// skipped for the rest of the sweep (its files stay until the next one);
// a uid found free is asked again at every removal, because the sweep
// runs while the server starts sandboxes, and one may take the uid
// meanwhile.
func orphanUIDs(u uidHolder) func(uid uint32) bool {
	held := map[uint32]bool{}
	return func(uid uint32) bool {
		if !u.Contains(uid) || held[uid] {
			return false
		}
		if u.Held(uid) {
			held[uid] = true
			return false
		}
		return true
	}
}

// sweepOrphanFiles removes what sandbox uids that no live sandbox holds
// left in the host's shared temporary directories.
func (d *Driver) sweepOrphanFiles(ctx context.Context) (swept, error) {
	roots := d.sweepRoots
	if roots == nil {
		roots = hostTempDirs
	}
	return sweepHostFiles(ctx, roots, orphanUIDs(d.uids))
}

// SweepHostFiles removes what sandbox uids no live sandbox holds left in
// the host's temporary directories (a host-side helper running as the
// uid, such as bwrap before it enters the sandbox, may leave files that
// outlive its sandbox), and logs what it removed. It may take long on a
// host whose /tmp is large, so a server runs it in the background once
// Reap and the uid leases' reap are done, while it serves; it stops when
// ctx ends. Its failures are only logged: the next start tries again.
func (d *Driver) SweepHostFiles(ctx context.Context) {
	s, err := d.sweepOrphanFiles(ctx)
	if s.files > 0 {
		d.log.Info("oci: reap: removed files that sandbox uids left on the host", "files", s.files, "bytes", s.bytes)
	}
	if err != nil {
		d.log.Warn("oci: reap: sweeping the host's temporary directories", "err", err)
	}
}
