// Package uidpool gives every sandbox a host uid of its own, for as long as
// the sandbox exists.
//
// Per-user kernel limits and resources (RLIMIT_NPROC, RLIMIT_MSGQUEUE,
// fs.inotify.max_user_instances and max_user_watches, keyrings, the
// user's pending signals) are counted per host uid. Sandboxes that shared
// one uid shared them too: a tenant holding 128 inotify instances made the
// next tenant's inotify_init1 fail. With a uid per sandbox, no per-user
// limit is shared between executions.
//
// A uid is leased host-wide, across drivers and server instances: a lease
// is an exclusive flock on the uid's file in one directory, held until
// Release, which removes the file (so the directory holds a file per live
// lease, not one per uid ever used). The kernel drops the lock of a process
// that dies, but the file stays and names the dead holder: the uid is only
// leased again once no process on the host runs as it (the crashed
// server's sandboxes may outlive it until a Reap kills them).
package uidpool

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// Defaults: the range lies above systemd's container range
// (524288–1879048191) and below its foreign range (0x7FFE0000), so no
// login user, /etc/subuid range, systemd dynamic user or nspawn container
// shares a uid with a sandbox.
const (
	DefaultFirst = 2_000_000_000
	DefaultCount = 65536
	// DefaultDir holds the lock files; /run is a tmpfs, so a reboot (which
	// ends every sandbox) clears it. Every server on the host must use the
	// same directory, whatever its state directory.
	DefaultDir = "/run/vertal/uids"
)

// ErrExhausted means every uid of the range is leased.
var ErrExhausted = errors.New("uidpool: every sandbox uid is in use")

// Pool leases uids of one range. It is safe for concurrent use.
type Pool struct {
	dir          string
	first, count uint32
	// running reports whether any host process runs as uid; replaced in
	// tests.
	running func(uid uint32) bool

	mu   sync.Mutex
	next uint32 // offset where the next search starts
}

// New returns a pool of count uids from first, locked in dir (created if
// missing). Zero values take the defaults.
func New(dir string, first, count uint32) (*Pool, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if first == 0 {
		first = DefaultFirst
	}
	if count == 0 {
		count = DefaultCount
	}
	if first < 1000 || uint64(first)+uint64(count) > 1<<31 {
		return nil, fmt.Errorf("uidpool: range %d+%d: want uids from 1000 to 2^31-1", first, count)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("uidpool: creating %s: %w", dir, err)
	}
	// Start each process at a different place: two servers then rarely
	// try the same lock files.
	return &Pool{dir: dir, first: first, count: count, running: uidRunning, next: rand.Uint32N(count)}, nil
}

// Lease is one uid held for one sandbox.
type Lease struct {
	UID  uint32
	path string
	file *os.File
	once sync.Once
}

// Acquire leases a uid no live sandbox or process uses.
func (p *Pool) Acquire() (*Lease, error) {
	p.mu.Lock()
	start := p.next
	p.next = (p.next + 1) % p.count
	p.mu.Unlock()
	for i := range p.count {
		uid := p.first + (start+i)%p.count
		l, err := p.try(uid)
		if err != nil {
			return nil, err
		}
		if l != nil {
			p.mu.Lock()
			p.next = (start + i + 1) % p.count
			p.mu.Unlock()
			return l, nil
		}
	}
	return nil, ErrExhausted
}

// try leases uid, or returns nil if it is in use.
func (p *Pool) try(uid uint32) (*Lease, error) {
	path := filepath.Join(p.dir, strconv.FormatUint(uint64(uid), 10))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("uidpool: locking uid %d: %w", uid, err)
	}
	// The lock must be on the file that is at the path now: a holder
	// that released the uid meanwhile removed the file we opened.
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	if now, err := os.Stat(path); err != nil || !os.SameFile(fi, now) {
		f.Close()
		return nil, nil
	}
	// A holder writes its pid and removes the file on Release: a file
	// that is not empty was held by a process that died with its lease.
	if fi.Size() > 0 && p.running(uid) {
		f.Close()
		return nil, nil
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("uidpool: %w", err)
	}
	return &Lease{UID: uid, path: path, file: f}, nil
}

// Release gives the uid back. Call it only once nothing of the sandbox
// runs any more. Releasing twice, or a nil lease, does nothing.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		// Removed while still locked: whoever opened it meanwhile finds
		// it is no longer at the path and does not take it.
		_ = os.Remove(l.path)
		l.file.Close()
	})
}

// Abandon gives the uid back without vouching that nothing of the sandbox
// runs any more (its cleanup failed): the next holder first checks that no
// process runs as the uid.
func (l *Lease) Abandon() {
	if l == nil {
		return
	}
	l.once.Do(func() { l.file.Close() })
}

// Reap releases the leases that holders which died left behind: every
// lock file of the range whose lock no live process holds and whose uid no
// process runs as is removed, so the uid is as free as one never leased.
// Call it after the sandboxes of a crashed server were killed (the
// drivers' Reap); a uid that still runs something keeps its file. It
// returns how many leases it released.
func (p *Pool) Reap() (int, error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return 0, fmt.Errorf("uidpool: reap: %w", err)
	}
	released := 0
	var errs []error
	for _, e := range ents {
		uid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || uid < uint64(p.first) || uid >= uint64(p.first)+uint64(p.count) || !e.Type().IsRegular() {
			continue // not a lease of this range
		}
		ok, err := p.reapOne(uint32(uid))
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			released++
		}
	}
	return released, errors.Join(errs...)
}

// reapOne removes uid's lock file if its holder is dead and nothing runs
// as uid.
func (p *Pool) reapOne(uid uint32) (bool, error) {
	path := filepath.Join(p.dir, strconv.FormatUint(uint64(uid), 10))
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, nil // released meanwhile
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil // a live holder
		}
		return false, fmt.Errorf("uidpool: reap: locking uid %d: %w", uid, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("uidpool: reap: %w", err)
	}
	if now, err := os.Stat(path); err != nil || !os.SameFile(fi, now) {
		return false, nil // released and perhaps leased again meanwhile
	}
	if p.running(uid) {
		return false, nil
	}
	// Removed while locked, as Release does: a concurrent try that opened
	// this file finds it is no longer at the path.
	if err := os.Remove(path); err != nil {
		return false, fmt.Errorf("uidpool: reap: %w", err)
	}
	return true, nil
}

// uidRunning reports whether a host process runs as uid: the owner of
// /proc/<pid> is the process's effective uid. A zombie runs nothing: a
// crashed server's sandbox that exited stays one under a PID 1 that does
// not reap orphans (a container's shell, say), and would hold the uid
// forever.
func uidRunning(uid uint32) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: do not reuse
	}
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name(), &st) == nil && st.Uid == uid && !zombie(e.Name()) {
			return true
		}
	}
	return false
}

// zombie reports whether process pid has exited and waits to be reaped
// (state Z, or X while it goes). A process gone meanwhile counts as one.
func zombie(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold anything, so look after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}
