package oci

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	cgroupsmode "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// Cgroup modes, as Driver.CgroupMode reports them.
const (
	// CgroupV1: only cgroup v1 hierarchies.
	CgroupV1 = "v1"
	// CgroupHybrid: cgroup v1 controllers, plus a cgroup2 mount that owns
	// at most a few controllers (/sys/fs/cgroup/unified).
	CgroupHybrid = "hybrid"
	// CgroupV2: only the unified hierarchy at /sys/fs/cgroup.
	CgroupV2 = "v2"
)

// cgroups manages the cgroups of the driver's executions, with
// github.com/containerd/cgroups/v3: its cgroup1 package on v1 and hybrid
// hosts, cgroup2 on pure v2 hosts.
//
// Each execution gets a parent cgroup "<base>/<id>" that we create and
// limit ourselves, and the runtime puts the sandbox in the child
// "<base>/<id>/sandbox", which it creates and removes. Limits on the parent
// bound the whole subtree, and the parent outlives the runtime's cleanup, so
// the peak memory, CPU time and OOM kills of the execution can be read
// after the runtime has exited, without a second runtime process. On v2 the
// parent holds no process itself, as the kernel requires of inner nodes.
type cgroups struct {
	mode string // CgroupV1, CgroupHybrid or CgroupV2
	// base is where the executions' parents are created: relative to each
	// v1 hierarchy's root ("vertal"), or to the cgroup2 mount on v2
	// ("/vertal", "/system.slice/vertal.service/vertal").
	base string
	// all are the mount points the runtime may create the sandbox's cgroup
	// in: every v1 hierarchy (named ones and the hybrid unified one too),
	// or the cgroup2 mount.
	all []string

	// v1 and hybrid
	mounts  map[string]string // controller -> v1 mount point
	unified string            // the cgroup2 mount point in hybrid mode, or ""

	// v2
	v2 *unifiedHost
}

// unifiedHost is what the driver knows of a pure cgroup v2 host.
type unifiedHost struct {
	mount string      // the cgroup2 mount point, /sys/fs/cgroup
	place v2Placement // where our subtree is
	// peak: the kernel has memory.peak (5.19+); without it the driver
	// polls memory.current.
	peak bool
	// localEvents: cgroup2 is mounted with memory_localevents, so a
	// parent's memory.events counts only its own events, and oom_kill
	// (charged to the victim's cgroup, the runtime's) never reaches it.
	localEvents bool
}

// sandboxLeaf is the runtime's cgroup under each execution's parent.
const sandboxLeaf = "sandbox"

// v1Controllers are the v1 hierarchies the driver creates parents in.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids"}

// v2Controllers are enabled for the executions' subtree on v2.
var v2Controllers = []string{"memory", "pids", "cpu"}

// discoverCgroups reads the cgroup setup of this host and checks that it
// has what the driver limits with. On v2 it decides where our subtree
// lives (see placeV2); ensureBase then creates it.
func discoverCgroups(base string) (*cgroups, error) {
	c := &cgroups{base: base, mounts: map[string]string{}}
	switch cgroupsmode.Mode() {
	case cgroupsmode.Unified:
		c.mode = CgroupV2
	case cgroupsmode.Hybrid:
		c.mode = CgroupHybrid
	case cgroupsmode.Legacy:
		c.mode = CgroupV1
	default:
		return nil, errors.New("no cgroup filesystem is mounted at /sys/fs/cgroup")
	}
	mounts, err := sandbox.CgroupMounts()
	if err != nil {
		return nil, err
	}
	var v2Opts []string
	for _, m := range mounts {
		mp := m.Point
		switch m.Version {
		case 1:
			c.all = append(c.all, mp)
			for _, o := range m.Options {
				switch o {
				case "memory", "cpu", "cpuacct", "pids", "cpuset", "devices", "freezer", "blkio", "hugetlb", "net_cls", "net_prio", "perf_event", "rdma", "misc":
					c.mounts[o] = mp
				}
			}
		case 2:
			if c.mode == CgroupV2 && mp == unifiedMount {
				v2Opts = m.Options
			}
			if c.mode != CgroupV2 {
				c.all = append(c.all, mp)
				c.unified = mp
			}
		}
	}
	if c.mode == CgroupV2 {
		return c, c.discoverV2(v2Opts)
	}
	for _, need := range v1Controllers {
		if c.mounts[need] == "" {
			return nil, fmt.Errorf("cgroup v1 controller %q is not mounted (on a v1 or hybrid host this driver needs memory, cpu, cpuacct and pids mounted)", need)
		}
	}
	if _, err := os.Stat(filepath.Join(c.mounts["memory"], "memory.memsw.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("memory+swap accounting is off (boot with swapaccount=1): %w", err)
	}
	return c, nil
}

// unifiedMount is where a pure v2 host mounts its one hierarchy (and where
// containerd/cgroups and the runtimes expect it).
const unifiedMount = "/sys/fs/cgroup"

// discoverV2 places our subtree in the unified hierarchy.
func (c *cgroups) discoverV2(mountOpts []string) error {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return fmt.Errorf("reading our own cgroup: %w", err)
	}
	place, err := placeV2(self, os.DirFS(unifiedMount), hasDelegateXattr, c.base)
	if err != nil {
		return err
	}
	c.v2 = &unifiedHost{
		mount: unifiedMount, place: place,
		localEvents: slices.Contains(mountOpts, "memory_localevents"),
	}
	c.base = place.Base
	c.all = []string{unifiedMount}
	return nil
}

// hasDelegateXattr reports whether systemd marked dir as delegated: since
// systemd 252 a unit with Delegate=yes gets trusted.delegate=1 on its
// cgroup (user.delegate under a user manager).
func hasDelegateXattr(dir string) bool {
	for _, name := range []string{"trusted.delegate", "user.delegate"} {
		var buf [8]byte
		n, err := unix.Getxattr(filepath.Join(unifiedMount, dir), name, buf[:])
		if err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	return false
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
// On v2 it first makes our subtree usable: our own processes leave the
// delegated cgroup for a leaf, and the controllers are enabled down to
// the base.
func (c *cgroups) ensureBase() error {
	if c.v2 == nil {
		for _, ctrl := range v1Controllers {
			if err := os.MkdirAll(filepath.Join(c.mounts[ctrl], c.base), 0o755); err != nil {
				return fmt.Errorf("creating cgroup %s/%s: %w", ctrl, c.base, err)
			}
		}
		return nil
	}
	v2, p := c.v2, c.v2.place
	dir := func(rel string) string { return filepath.Join(v2.mount, rel) }
	avail, err := os.ReadFile(filepath.Join(dir(p.Owned), "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("reading the controllers of cgroup %s: %w", p.Owned, err)
	}
	for _, ctrl := range v2Controllers {
		if !slices.Contains(strings.Fields(string(avail)), ctrl) {
			return fmt.Errorf("cgroup v2 controller %q is not available in %s (run the server in a cgroup delegated to it, e.g. a systemd unit with Delegate=yes)", ctrl, dir(p.Owned))
		}
	}
	if p.Supervisor != "" {
		if err := moveProcs(dir(p.Owned), dir(p.Supervisor)); err != nil {
			return err
		}
	}
	for _, rel := range []string{p.Owned, p.Base} {
		if err := os.MkdirAll(dir(rel), 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir(rel), err)
		}
		if err := enableControllers(dir(rel)); err != nil {
			return err
		}
	}
	for _, f := range []string{"memory.swap.max", "memory.max", "pids.max", "cpu.max"} {
		// The base is an inner node like every execution's parent: what
		// it has, they have.
		if _, err := os.Stat(filepath.Join(dir(p.Base), f)); err != nil {
			hint := ""
			if f == "memory.swap.max" {
				hint = " (swap accounting is off: boot with swapaccount=1)"
			}
			return fmt.Errorf("cgroup v2: %s missing in %s%s", f, dir(p.Base), hint)
		}
	}
	_, err = os.Stat(filepath.Join(dir(p.Base), "memory.peak"))
	v2.peak = err == nil
	return nil
}

// moveProcs moves every process of cgroup from into the leaf to (created
// if needed), so that controllers can be enabled for from's children: a
// v2 cgroup with processes cannot hand controllers down.
func moveProcs(from, to string) error {
	if err := os.MkdirAll(to, 0o755); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", to, err)
	}
	b, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("reading %s/cgroup.procs: %w", from, err)
	}
	for _, pid := range strings.Fields(string(b)) {
		err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(pid), 0)
		if err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("moving process %s to cgroup %s: %w", pid, to, err)
		}
	}
	return nil
}

// enableControllers makes the v2 controllers the driver limits with
// available to dir's children.
func enableControllers(dir string) error {
	cur, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	var add []string
	for _, ctrl := range v2Controllers {
		if !slices.Contains(strings.Fields(string(cur)), ctrl) {
			add = append(add, "+"+ctrl)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
		return fmt.Errorf("enabling %v in %s/cgroup.subtree_control: %w", add, dir, err)
	}
	return nil
}

// bases returns the base cgroup's directory in every hierarchy.
func (c *cgroups) bases() []string {
	var out []string
	for _, mp := range c.all {
		out = append(out, filepath.Join(mp, c.base))
	}
	return out
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
	rel string // "<base>/<id>"
	c   *cgroups

	// v1 and hybrid
	v1  cgroup1.Cgroup
	oom *sandbox.OOMWatch // the parent's OOM notification

	// v2
	v2       *cgroup2.Manager
	dir      string    // the parent's directory
	peakFile *os.File  // memory.peak, reset at a warm hand-over (kernel 6.12+)
	poller   *peakPoll // kernels without memory.peak
}

// create makes and limits the parent cgroup of execution id and arms the
// OOM notification. On error nothing is left behind.
func (c *cgroups) create(id string, l cgLimits) (_ *execCgroup, err error) {
	e := &execCgroup{rel: path.Join(c.base, id), c: c}
	defer func() {
		if err != nil {
			e.close()
			_ = c.remove(id)
		}
	}()
	if c.v2 != nil {
		return e, e.createV2(l)
	}
	zero := uint64(0)
	res := &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &l.memory, Swap: &l.memory, Swappiness: &zero},
		CPU:    &specs.LinuxCPU{Quota: &l.cpuQuota, Period: &l.cpuPeriod},
		Pids:   &specs.LinuxPids{Limit: &l.pids},
	}
	e.v1, err = cgroup1.New(cgroup1.StaticPath("/"+e.rel), res, cgroup1.WithHierarchy(c.v1Hierarchy))
	if err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", e.rel, err)
	}
	// cgroup v1 keeps the oom_kill counter in the victim's cgroup, which
	// the runtime deletes; the notification is delivered to the cgroup
	// whose limit was hit, which is ours.
	if e.oom, err = sandbox.WatchOOM(e.v1); err != nil {
		return nil, err
	}
	return e, nil
}

// v1Hierarchy is the set of v1 hierarchies an execution's parent is
// created in (the runtime creates the sandbox's in all of them).
func (c *cgroups) v1Hierarchy() ([]cgroup1.Subsystem, error) {
	root := filepath.Dir(c.mounts["memory"])
	return []cgroup1.Subsystem{cgroup1.NewMemory(root), cgroup1.NewCpu(root), cgroup1.NewCpuacct(root), cgroup1.NewPids(root)}, nil
}

func (e *execCgroup) createV2(l cgLimits) error {
	v2 := e.c.v2
	zero := int64(0)
	res := &cgroup2.Resources{
		Memory: &cgroup2.Memory{Max: &l.memory, Swap: &zero},
		CPU:    &cgroup2.CPU{Max: cgroup2.NewCPUMax(&l.cpuQuota, &l.cpuPeriod)},
		Pids:   &cgroup2.Pids{Max: l.pids},
	}
	// The manager's root is the cgroup we own, so it enables controllers
	// in our subtree only, never above a delegation.
	owned := filepath.Join(v2.mount, v2.place.Owned)
	rel, err := filepath.Rel(owned, filepath.Join(v2.mount, e.rel))
	if err != nil {
		return err
	}
	e.dir = filepath.Join(v2.mount, e.rel)
	e.v2, err = cgroup2.NewManager(owned, "/"+rel, res)
	if err != nil {
		return fmt.Errorf("creating cgroup %s: %w", e.dir, err)
	}
	if !v2.peak {
		e.poller = startPeakPoll(filepath.Join(e.dir, "memory.current"), 10*time.Millisecond)
	}
	return nil
}

// runtimePath is the cgroupsPath given to the runtime for execution id:
// on v2 relative to the cgroup2 root, on v1 to each hierarchy's.
func (c *cgroups) runtimePath(id string) string { return path.Join("/", c.base, id, sandboxLeaf) }

// oomKilled reports whether the memory limit made the kernel OOM-kill.
//
// v2: the parent's memory.events counts the OOM kills of its whole
// subtree (the kernel propagates each event to the ancestors), so
// oom_kill > 0 is a kill in this execution. With memory_localevents it
// counts only the parent's own, and the kill is charged to the victim's
// cgroup; the parent's own "oom" counter is then read: the limit was hit
// and reclaim failed, the same event v1's notification reports.
func (e *execCgroup) oomKilled() bool {
	if e.v2 != nil {
		m, err := e.v2.StatFiltered(cgroup2.StatMemoryEvents)
		if err != nil || m.MemoryEvents == nil {
			return false
		}
		if e.c.v2.localEvents {
			return m.MemoryEvents.Oom > 0
		}
		return m.MemoryEvents.OomKill > 0
	}
	return e.oom.Fired()
}

// usage reads CPU time and peak memory of the whole execution.
func (e *execCgroup) usage() (cpuSeconds float64, peakBytes int64) {
	if e.v2 != nil {
		m, err := e.v2.StatFiltered(cgroup2.StatCPU | cgroup2.StatMemory)
		if err != nil {
			return 0, 0
		}
		if m.CPU != nil {
			cpuSeconds = float64(m.CPU.UsageUsec) / 1e6
		}
		switch {
		case e.poller != nil:
			peakBytes = e.poller.max()
		case e.peakFile != nil:
			peakBytes, _ = sandbox.ReadCgroupIntFrom(e.peakFile)
		case m.Memory != nil:
			peakBytes = int64(m.Memory.MaxUsage)
		}
		return cpuSeconds, peakBytes
	}
	if e.v1 == nil {
		return 0, 0
	}
	return sandbox.CgroupV1Usage(filepath.Join(e.c.mounts["cpuacct"], e.rel), filepath.Join(e.c.mounts["memory"], e.rel))
}

// memoryCurrent is the memory the execution holds now.
func (e *execCgroup) memoryCurrent() int64 {
	if e.v2 != nil {
		n, _ := sandbox.ReadCgroupInt(filepath.Join(e.dir, "memory.current"))
		return n
	}
	n, _ := sandbox.ReadCgroupInt(filepath.Join(e.c.mounts["memory"], e.rel, "memory.usage_in_bytes"))
	return n
}

// resetPeak makes the peak memory count from now on (a warm sandbox's
// hand-over). v1 resets memory.max_usage_in_bytes. On v2 a write to
// memory.peak resets it for reads through the same file (kernel 6.12+);
// older kernels keep the peak since the sandbox was created, which
// includes the interpreter's start-up, as the cold path's does.
func (e *execCgroup) resetPeak() {
	if e.v2 == nil {
		_ = os.WriteFile(filepath.Join(e.c.mounts["memory"], e.rel, "memory.max_usage_in_bytes"), []byte("0"), 0)
		return
	}
	if e.poller != nil {
		e.poller.reset()
		return
	}
	f, err := os.OpenFile(filepath.Join(e.dir, "memory.peak"), os.O_RDWR, 0)
	if err != nil {
		return
	}
	if _, err := f.WriteString("reset"); err != nil {
		f.Close()
		return
	}
	e.peakFile = f
}

// CPU weights: the kernel's minimum while a warm sandbox waits, and its
// default, which every cold sandbox has, once the code runs. v1 calls it
// cpu.shares (2, 1024), v2 cpu.weight (1, 100).
const (
	prestartShares = 2
	defaultShares  = 1024
	prestartWeight = 1
	defaultWeight  = 100
)

// setCPUWeight gives a warm sandbox the minimum weight while it waits
// (waiting), or the default one.
func (e *execCgroup) setCPUWeight(waiting bool) error {
	if e.v2 != nil {
		w := uint64(defaultWeight)
		if waiting {
			w = prestartWeight
		}
		if err := e.v2.Update(&cgroup2.Resources{CPU: &cgroup2.CPU{Weight: &w}}); err != nil {
			return fmt.Errorf("setting cpu.weight: %w", err)
		}
		return nil
	}
	s := uint64(defaultShares)
	if waiting {
		s = prestartShares
	}
	if err := e.v1.Update(&specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &s}}); err != nil {
		return fmt.Errorf("setting cpu.shares: %w", err)
	}
	return nil
}

// cpuWeightFile is the file setCPUWeight writes, for tests.
func (e *execCgroup) cpuWeightFile() string {
	if e.v2 != nil {
		return filepath.Join(e.dir, "cpu.weight")
	}
	return filepath.Join(e.c.mounts["cpu"], e.rel, "cpu.shares")
}

// adopt moves processes into the execution's cgroups on v1 (the parent
// in each hierarchy: bwrap has no runtime to create the sandbox's leaf).
// On v2 a process is born in its cgroup instead (CLONE_INTO_CGROUP).
func (e *execCgroup) adopt(pids ...int) error {
	for _, pid := range pids {
		if err := e.v1.Add(cgroup1.Process{Pid: pid}); err != nil {
			return fmt.Errorf("moving %d into cgroup %s: %w", pid, e.rel, err)
		}
	}
	return nil
}

func (e *execCgroup) close() {
	e.oom.Close()
	if e.poller != nil {
		e.poller.stop()
	}
	if e.peakFile != nil {
		e.peakFile.Close()
		e.peakFile = nil
	}
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

// procDir is the directory whose subtree holds execution id's processes.
func (c *cgroups) procDir(id string) string {
	if c.v2 != nil {
		return filepath.Join(c.v2.mount, c.base, id)
	}
	return filepath.Join(c.mounts["pids"], c.base, id)
}

// procs lists the processes in execution id's cgroups.
func (c *cgroups) procs(id string) []int {
	var pids []int
	_ = filepath.WalkDir(c.procDir(id), func(p string, de os.DirEntry, err error) error {
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

// kill sends SIGKILL to every process in execution id's cgroups and
// returns how many there were. v2 writes cgroup.kill (freezing and
// killing each process where the kernel lacks it, before 5.14). v1 has no
// such file: a pidfd pins each process while its membership is checked,
// so a recycled pid is never signalled.
func (c *cgroups) kill(id string) int {
	if c.v2 != nil {
		n := len(c.procs(id))
		if n == 0 {
			return 0
		}
		m, err := cgroup2.Load(path.Join(c.base, id), cgroup2.WithMountpoint(c.v2.mount))
		if err != nil || m.Kill() != nil {
			return 0
		}
		return n
	}
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
		if err := sandbox.RemoveCgroup(dir, func() { c.kill(id) }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
