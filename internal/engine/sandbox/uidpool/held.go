package uidpool

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// Contains reports whether uid belongs to the pool's range.
func (p *Pool) Contains(uid uint32) bool {
	return uid >= p.first && uint64(uid) < uint64(p.first)+uint64(p.count)
}

// Held reports whether a live sandbox may still own uid: its lease is
// locked by a live process, or a process runs as it. When it cannot tell,
// it says held. A uid not held may be leased again at any moment, so a
// caller that acts on the answer (the reaper removing what the uid left)
// must be harmless to the uid's next holder.
func (p *Pool) Held(uid uint32) bool {
	if !p.Contains(uid) {
		return false
	}
	path := filepath.Join(p.dir, strconv.FormatUint(uint64(uid), 10))
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return true
	default:
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		f.Close() // drops the shared lock at once
		if err != nil {
			return true // locked by a holder, or cannot tell
		}
	}
	return p.running(uid)
}
