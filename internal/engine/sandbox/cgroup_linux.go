package sandbox

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// What both drivers do with the cgroups of an execution and no library
// does for them: github.com/containerd/cgroups/v3 creates, limits, loads
// and kills the cgroups, and these read what they recorded and remove them
// once the runtime or the daemon is done. The layout of each driver's
// cgroups (the oci driver's subtree, the docker driver's parents) stays
// with the driver.

// ReadCgroupInt reads a cgroup file holding one number (memory.peak,
// cpuacct.usage). It opens and reads with plain system calls: os.ReadFile
// registers a cgroup file with the runtime's poller (kernfs files accept
// epoll) and so takes nine system calls where three do, and a sandbox's
// command reads two such files before and after it runs.
func ReadCgroupInt(path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var buf [64]byte // an int64 and a newline, with room to spare
	n := 0
	for n < len(buf) {
		k, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if k == 0 {
			break
		}
		n += k
	}
	if n == len(buf) {
		return 0, fmt.Errorf("%s: more than one number", path)
	}
	return strconv.ParseInt(string(bytes.TrimSpace(buf[:n])), 10, 64)
}

// ReadCgroupIntFrom reads a one-number cgroup file through an open
// descriptor (memory.peak after a reset counts per descriptor).
func ReadCgroupIntFrom(f *os.File) (int64, error) {
	var buf [32]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(buf[:n])), 10, 64)
}

// CgroupStatField reads "key value" from a flat-keyed cgroup file like
// cpu.stat or memory.events.
func CgroupStatField(path, key string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// CgroupV1Usage reads the CPU time and peak memory of a cgroup v1
// execution from its cpuacct and memory directories; a missing file gives
// 0. It reads the two files, not cgroup1's Stat: Stat parses every
// controller's statistics (memory.stat alone has ~40 lines), which perf
// showed as 4% of the whole machine's CPU on the API's hot path (issue 15).
func CgroupV1Usage(cpuacctDir, memoryDir string) (cpuSeconds float64, peakBytes int64) {
	if ns, err := ReadCgroupInt(filepath.Join(cpuacctDir, "cpuacct.usage")); err == nil {
		cpuSeconds = float64(ns) / 1e9
	}
	peakBytes, _ = ReadCgroupInt(filepath.Join(memoryDir, "memory.max_usage_in_bytes"))
	return cpuSeconds, peakBytes
}

// OOMWatch is an armed OOM notification of a cgroup v1 memory cgroup: the
// kernel signals it when the cgroup's own limit is hit. cgroup v1 keeps
// the oom_kill counter in the victim's cgroup, which the runtime or the
// daemon deletes with the sandbox; the notification goes to the cgroup
// whose limit was hit, which is the driver's. A nil OOMWatch never fired.
type OOMWatch struct{ fd int }

// WatchOOM arms the OOM notification of cg (containerd/cgroups hands out
// the eventfd; reading it is ours).
func WatchOOM(cg cgroup1.Cgroup) (*OOMWatch, error) {
	fd, err := cg.OOMEventFD()
	if err != nil {
		return nil, fmt.Errorf("arming OOM notification: %w", err)
	}
	if err := unix.SetNonblock(int(fd), true); err != nil {
		unix.Close(int(fd))
		return nil, fmt.Errorf("arming OOM notification: %w", err)
	}
	return &OOMWatch{fd: int(fd)}, nil
}

// Fired reports whether the cgroup hit OOM since the watch was armed (or
// since the last Fired that said so).
func (w *OOMWatch) Fired() bool {
	if w == nil {
		return false
	}
	var buf [8]byte
	n, err := unix.Read(w.fd, buf[:])
	return err == nil && n == 8 && binary.NativeEndian.Uint64(buf[:]) > 0
}

// Close disarms the watch. It is safe on nil and more than once.
func (w *OOMWatch) Close() {
	if w != nil && w.fd >= 0 {
		unix.Close(w.fd)
		w.fd = -1
	}
}

// RemoveCgroup removes one cgroup directory and the child cgroups a
// runtime that crashed mid-way left in it; a directory already gone is
// fine. Cgroup directories hold only kernel files, which rmdir removes
// with them. EBUSY means child cgroups or processes are still in it (or
// dying): the children are removed first and, with kill, the processes
// are killed and the removal retried for a bounded time; without kill it
// fails once no child is left to remove.
func RemoveCgroup(dir string, kill func()) error {
	var err error
	for i := 0; i < 200; i++ {
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		// ENOTEMPTY: not a cgroup filesystem (a test's fake), where child
		// directories are in the way too.
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) {
			break
		}
		subs, _ := os.ReadDir(dir)
		children := false
		for _, s := range subs {
			if !s.IsDir() {
				continue
			}
			children = true
			if err := RemoveCgroup(filepath.Join(dir, s.Name()), kill); err != nil && kill == nil {
				return err
			}
		}
		if kill == nil {
			if children {
				continue
			}
			break
		}
		if errors.Is(err, unix.ENOTEMPTY) && !children {
			break
		}
		kill()
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

// CgroupMount is one mounted cgroup hierarchy.
type CgroupMount struct {
	Point   string // where it is mounted
	Version int    // 1 or 2
	// Options are its superblock options: the controllers of a v1
	// hierarchy ("rw,memory"), flags like memory_localevents on v2.
	Options []string
}

// CgroupMounts lists this process's mounted cgroup hierarchies, in mount
// order.
func CgroupMounts() ([]CgroupMount, error) {
	infos, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	return cgroupMounts(infos), nil
}

func cgroupMounts(infos []*mountinfo.Info) []CgroupMount {
	var out []CgroupMount
	for _, m := range infos {
		v := 1
		if m.FSType == "cgroup2" {
			v = 2
		}
		out = append(out, CgroupMount{Point: m.Mountpoint, Version: v, Options: strings.Split(m.VFSOptions, ",")})
	}
	return out
}

// MountsUnder lists the mount points at or below dir, in mount order (so
// unmounting them backwards takes the deepest first).
func MountsUnder(dir string) ([]string, error) {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	return out, nil
}
