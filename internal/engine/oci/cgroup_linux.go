package oci

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroups manages the cgroup v1 hierarchies of this host.
//
// Each execution gets a parent cgroup "<base>/<id>" that we create and
// limit ourselves, and the runtime puts the sandbox in the child
// "<base>/<id>/sandbox", which it creates and removes. Limits on the parent
// bound the whole subtree, and the parent outlives the runtime's cleanup, so
// the peak memory, CPU time and OOM notification of the execution can be
// read after the runtime has exited, without a second runtime process.
type cgroups struct {
	base    string            // e.g. "vertal"
	mounts  map[string]string // controller -> v1 mount point
	all     []string          // every cgroup mount point (v1, named, unified)
	unified string            // the cgroup2 mount point in hybrid mode, or ""
}

// sandboxLeaf is the runtime's cgroup under each execution's parent.
const sandboxLeaf = "sandbox"

// discoverCgroups reads the cgroup mounts of this host. It requires the
// cgroup v1 controllers the driver limits with.
func discoverCgroups(base string) (*cgroups, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	c := &cgroups{base: base, mounts: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mp, fstype, opts, ok := parseMountinfo(sc.Text())
		if !ok {
			continue
		}
		switch fstype {
		case "cgroup":
			c.all = append(c.all, mp)
			for _, o := range strings.Split(opts, ",") {
				switch o {
				case "memory", "cpu", "cpuacct", "pids", "cpuset", "devices", "freezer", "blkio", "hugetlb", "net_cls", "net_prio", "perf_event", "rdma", "misc":
					c.mounts[o] = mp
				}
			}
		case "cgroup2":
			c.all = append(c.all, mp)
			c.unified = mp
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	for _, need := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if c.mounts[need] == "" {
			return nil, fmt.Errorf("cgroup v1 controller %q is not mounted (this driver needs cgroup v1 or hybrid mode with memory, cpu, cpuacct and pids mounted)", need)
		}
	}
	if _, err := os.Stat(filepath.Join(c.mounts["memory"], "memory.memsw.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("memory+swap accounting is off (boot with swapaccount=1): %w", err)
	}
	return c, nil
}

// parseMountinfo returns the mount point, filesystem type and super
// options of one /proc/self/mountinfo line.
func parseMountinfo(line string) (mountPoint, fstype, superOpts string, ok bool) {
	pre, post, found := strings.Cut(line, " - ")
	if !found {
		return "", "", "", false
	}
	pf := strings.Fields(pre)
	qf := strings.Fields(post)
	if len(pf) < 5 || len(qf) < 3 {
		return "", "", "", false
	}
	return unescapeMount(pf[4]), qf[0], qf[2], true
}

// unescapeMount undoes the octal escapes mountinfo uses for spaces and tabs.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// hybridControllers returns the controllers the unified (v2) hierarchy owns
// in hybrid mode. crun 1.8 refuses to run while there are any ("cgroups in
// hybrid mode not supported, drop all controllers from cgroupv2").
func (c *cgroups) hybridControllers() []string {
	if c.unified == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(c.unified, "cgroup.controllers"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// moveToV1 binds each controller the unified hierarchy owns to a cgroup v1
// hierarchy of its own under the v1 mount root (usually /sys/fs/cgroup),
// which is what a hybrid systemd host does for the other controllers. The
// kernel allows this only while no v2 cgroup uses the controller.
func (c *cgroups) moveToV1(ctrls []string) error {
	root := filepath.Dir(c.mounts["memory"])
	sub, _ := os.ReadFile(filepath.Join(c.unified, "cgroup.subtree_control"))
	for _, ctrl := range ctrls {
		if slices.Contains(strings.Fields(string(sub)), ctrl) {
			return fmt.Errorf("controller %s is enabled in %s/cgroup.subtree_control, so it cannot be moved to cgroup v1", ctrl, c.unified)
		}
		mp := filepath.Join(root, ctrl)
		if err := os.MkdirAll(mp, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", mp, err)
		}
		if err := unix.Mount("cgroup", mp, "cgroup", 0, ctrl); err != nil {
			return fmt.Errorf("mount -t cgroup -o %s cgroup %s: %w", ctrl, mp, err)
		}
		c.mounts[ctrl] = mp
		c.all = append(c.all, mp)
	}
	return nil
}

// ensureBase creates the base cgroup every execution's parent lives in.
func (c *cgroups) ensureBase() error {
	for _, ctrl := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if err := os.MkdirAll(filepath.Join(c.mounts[ctrl], c.base), 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s/%s: %w", ctrl, c.base, err)
		}
	}
	return nil
}

// limits for one execution's parent cgroup.
type cgLimits struct {
	memory    int64 // bytes, also the memory+swap limit
	cpuQuota  int64 // µs per cpuPeriod
	cpuPeriod uint64
	pids      int64
}

// execCgroup is one execution's parent cgroup.
type execCgroup struct {
	rel    string // "<base>/<id>"
	c      *cgroups
	oomEfd int      // eventfd signalled when the parent hits OOM
	oomCtl *os.File // memory.oom_control, kept open for the notification
}

// path returns the parent's directory in ctrl's hierarchy.
func (e *execCgroup) path(ctrl string) string { return filepath.Join(e.c.mounts[ctrl], e.rel) }

// create makes and limits the parent cgroup of execution id and arms the
// OOM notification. On error nothing is left behind.
func (c *cgroups) create(id string, l cgLimits) (_ *execCgroup, err error) {
	e := &execCgroup{rel: filepath.Join(c.base, id), c: c, oomEfd: -1}
	defer func() {
		if err != nil {
			e.close()
			_ = c.remove(id)
		}
	}()
	mem := e.path("memory")
	writes := []struct{ ctrl, file, val string }{
		{"memory", "memory.limit_in_bytes", strconv.FormatInt(l.memory, 10)},
		{"memory", "memory.memsw.limit_in_bytes", strconv.FormatInt(l.memory, 10)},
		{"memory", "memory.swappiness", "0"},
		{"cpu", "cpu.cfs_period_us", strconv.FormatUint(l.cpuPeriod, 10)},
		{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(l.cpuQuota, 10)},
		{"pids", "pids.max", strconv.FormatInt(l.pids, 10)},
	}
	made := map[string]bool{}
	for _, w := range writes {
		dir := e.path(w.ctrl)
		if !made[dir] {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return nil, fmt.Errorf("creating cgroup: %w", err)
			}
			made[dir] = true
		}
		if err := os.WriteFile(filepath.Join(dir, w.file), []byte(w.val), 0); err != nil {
			return nil, fmt.Errorf("setting cgroup %s: %w", w.file, err)
		}
	}
	if dir := e.path("cpuacct"); !made[dir] {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating cgroup: %w", err)
		}
	}
	// cgroup v1 keeps the oom_kill counter in the victim's cgroup, which
	// the runtime deletes; the notification is delivered to the cgroup
	// whose limit was hit, which is ours.
	e.oomEfd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	e.oomCtl, err = os.Open(filepath.Join(mem, "memory.oom_control"))
	if err != nil {
		return nil, fmt.Errorf("opening memory.oom_control: %w", err)
	}
	reg := fmt.Sprintf("%d %d", e.oomEfd, e.oomCtl.Fd())
	if err := os.WriteFile(filepath.Join(mem, "cgroup.event_control"), []byte(reg), 0); err != nil {
		return nil, fmt.Errorf("arming OOM notification: %w", err)
	}
	return e, nil
}

// runtimePath is the cgroupsPath given to the runtime.
func (e *execCgroup) runtimePath() string { return "/" + e.rel + "/" + sandboxLeaf }

// oomKilled reports whether the memory limit made the kernel OOM-kill.
func (e *execCgroup) oomKilled() bool {
	if e.oomEfd < 0 {
		return false
	}
	var buf [8]byte
	n, err := unix.Read(e.oomEfd, buf[:])
	return err == nil && n == 8 && binary.NativeEndian.Uint64(buf[:]) > 0
}

// usage reads CPU time and peak memory of the whole execution.
func (e *execCgroup) usage() (cpuSeconds float64, peakBytes int64) {
	if ns, err := readInt(filepath.Join(e.path("cpuacct"), "cpuacct.usage")); err == nil {
		cpuSeconds = float64(ns) / 1e9
	}
	peakBytes, _ = readInt(filepath.Join(e.path("memory"), "memory.max_usage_in_bytes"))
	return cpuSeconds, peakBytes
}

func (e *execCgroup) close() {
	if e.oomEfd >= 0 {
		unix.Close(e.oomEfd)
		e.oomEfd = -1
	}
	if e.oomCtl != nil {
		e.oomCtl.Close()
		e.oomCtl = nil
	}
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

// dirs returns every cgroup directory execution id may have, deepest first.
func (c *cgroups) dirs(id string) []string {
	var out []string
	for _, mp := range c.all {
		parent := filepath.Join(mp, c.base, id)
		out = append(out, filepath.Join(parent, sandboxLeaf), parent)
	}
	return out
}

// procs lists the processes in execution id's cgroups.
func (c *cgroups) procs(id string) []int {
	var pids []int
	dir := filepath.Join(c.mounts["pids"], c.base, id)
	_ = filepath.WalkDir(dir, func(p string, de os.DirEntry, err error) error {
		if err != nil || !de.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// kill sends SIGKILL to every process in execution id's cgroups. A pidfd
// pins each process while its membership is checked, so a recycled pid
// is never signalled.
func (c *cgroups) kill(id string) int {
	n := 0
	want := "/" + filepath.Join(c.base, id) + "/"
	for _, pid := range c.procs(id) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		if err == nil && bytes.Contains(b, []byte(want)) {
			if unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
				n++
			}
		}
		unix.Close(fd)
	}
	return n
}

// remove deletes execution id's cgroups in every hierarchy, killing what
// still runs in them. It is idempotent.
func (c *cgroups) remove(id string) error {
	var errs []error
	for _, dir := range c.dirs(id) {
		if err := rmdirCgroup(dir, func() { c.kill(id) }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdirCgroup removes one cgroup directory. EBUSY means processes are still
// in it (or dying): kill them and retry for a bounded time.
func rmdirCgroup(dir string, kill func()) error {
	var err error
	for i := 0; i < 200; i++ {
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		// Children left by a runtime that crashed mid-way go first.
		if subs, _ := os.ReadDir(dir); len(subs) > 0 {
			for _, s := range subs {
				if s.IsDir() {
					_ = rmdirCgroup(filepath.Join(dir, s.Name()), kill)
				}
			}
		}
		kill()
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

// leftovers lists the execution ids that still have a parent cgroup.
func (c *cgroups) leftovers() []string {
	seen := map[string]bool{}
	var ids []string
	for _, mp := range c.all {
		ents, _ := os.ReadDir(filepath.Join(mp, c.base))
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				ids = append(ids, e.Name())
			}
		}
	}
	return ids
}
