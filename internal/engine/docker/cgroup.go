package docker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// accounting reads an execution's CPU time and peak memory after its
// container is gone. The container's own cgroup is deleted when it exits,
// before Docker's wait returns, so each execution gets a parent cgroup
// (HostConfig.CgroupParent) of its own: the kernel charges CPU time and
// memory to every ancestor as it happens, and the parent keeps both totals
// until we read them and remove it. It costs no API round trip.
//
// With the engine's systemd cgroup driver (Docker's default on cgroup v2
// hosts run by systemd) a parent must be a slice. systemd keeps a slice
// after its last container has gone, and removes its cgroup when the unit
// is stopped, which remove does through systemd's D-Bus API.
type accounting struct {
	root    string // where the cgroup hierarchies are mounted
	v2      bool
	systemd bool // parents are slices (v2 only)
	// stopUnit stops a systemd unit; nil: through D-Bus.
	stopUnit func(name string) error
}

// newAccounting returns the accounting for an engine with the given cgroup
// version ("1", "2") and driver ("cgroupfs", "systemd"), or nil where it
// cannot work.
func newAccounting(cgroupVersion, cgroupDriver string) *accounting {
	a := &accounting{root: "/sys/fs/cgroup", v2: cgroupVersion == "2"}
	switch {
	case cgroupDriver == "systemd" && a.v2:
		a.systemd = true
	case cgroupDriver != "cgroupfs":
		return nil
	}
	probe := filepath.Join(a.root, "memory")
	if a.v2 {
		probe = filepath.Join(a.root, "cgroup.controllers")
	}
	if _, err := os.Stat(probe); err != nil {
		return nil // the engine's cgroups are not visible here
	}
	return a
}

// sliceParent is the slice all systemd-driver parents are in: the "vertal"
// before the first dash of their names.
const sliceParent = "vertal.slice"

// prefix starts the cgroup names of one driver instance's executions.
func prefix(inst string) string { return "vertal-docker_" + inst + "_" }

// parent is the CgroupParent for one execution. It sits at the top of each
// hierarchy, one directory per execution, so removing it never races with
// another execution creating its own. With the systemd driver it is the
// slice "vertal-docker_<inst>_<id>.slice", which systemd nests in
// vertal.slice (a dash in a slice's name means nesting, so the id's dashes
// are escaped as systemd-escape does).
func (a *accounting) parent(inst, id string) string {
	if a.systemd {
		return prefix(inst) + strings.ReplaceAll(id, "-", `\x2d`) + ".slice"
	}
	return "/" + prefix(inst) + id
}

// dir is the execution's parent cgroup directory on v2.
func (a *accounting) dir(inst, id string) string {
	if a.systemd {
		return filepath.Join(a.root, sliceParent, a.parent(inst, id))
	}
	return filepath.Join(a.root, a.parent(inst, id))
}

// usage reads what the execution's parent cgroup recorded. Missing files
// (an old kernel without memory.peak, a controller not mounted) give 0.
func (a *accounting) usage(inst, id string) (cpuSeconds float64, peakBytes int64) {
	p := a.parent(inst, id)
	if a.v2 {
		dir := a.dir(inst, id)
		if usec, ok := sandbox.CgroupStatField(filepath.Join(dir, "cpu.stat"), "usage_usec"); ok {
			cpuSeconds = float64(usec) / 1e6
		}
		peakBytes, _ = sandbox.ReadCgroupInt(filepath.Join(dir, "memory.peak"))
		return cpuSeconds, peakBytes
	}
	return sandbox.CgroupV1Usage(filepath.Join(a.root, "cpuacct", p), filepath.Join(a.root, "memory", p))
}

// remove deletes the execution's parent cgroup from every hierarchy,
// children first (a child is left only if the engine died mid-run).
func (a *accounting) remove(inst, id string) error {
	if a.systemd {
		dir := a.dir(inst, id)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		stop := a.stopUnit
		if stop == nil {
			stop = func(name string) error {
				m, err := cgroup2.LoadSystemd(sliceParent, name)
				if err != nil {
					return err
				}
				return m.DeleteSystemd()
			}
		}
		if err := stop(a.parent(inst, id)); err != nil {
			return fmt.Errorf("stopping %s: %w", a.parent(inst, id), err)
		}
		// Stopping the unit removed its cgroup; a directory still there
		// means systemd did not know the slice.
		return sandbox.RemoveCgroup(dir, nil)
	}
	var errs []error
	for _, h := range a.hierarchies() {
		if err := sandbox.RemoveCgroup(filepath.Join(h, prefix(inst)+id), nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// leftovers lists the execution IDs of instance inst that have a parent
// cgroup in any hierarchy.
func (a *accounting) leftovers(inst string) []string {
	seen := map[string]bool{}
	var ids []string
	if a.systemd {
		entries, _ := os.ReadDir(filepath.Join(a.root, sliceParent))
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), prefix(inst))
			if name, isSlice := strings.CutSuffix(name, ".slice"); ok && isSlice && e.IsDir() {
				ids = append(ids, strings.ReplaceAll(name, `\x2d`, "-"))
			}
		}
		return ids
	}
	for _, h := range a.hierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if id, ok := strings.CutPrefix(e.Name(), prefix(inst)); ok && e.IsDir() && !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// hierarchies are the mounted cgroup hierarchies: the root itself on v2,
// each controller's (and named) directory on v1.
func (a *accounting) hierarchies() []string {
	if a.v2 {
		return []string{a.root}
	}
	entries, err := os.ReadDir(a.root)
	if err != nil {
		return nil
	}
	var hs []string
	for _, e := range entries {
		// Combined controllers appear once as a directory ("cpu,cpuacct")
		// and again as symlinks ("cpu"); the directory is enough.
		if e.IsDir() {
			hs = append(hs, filepath.Join(a.root, e.Name()))
		}
	}
	return hs
}

// oomMargin is how much more memory a container may use than its parent
// cgroup on cgroup v1 (see limitParent), so the parent's limit is the one
// that is hit.
const oomMargin = 4 << 20

// limitParent, on cgroup v1, creates the execution's parent memory cgroup
// before the container, gives it the execution's memory limit (with swap),
// and arms an OOM notification on it: an OOM kill then happens at the
// parent's limit, which notifies the parent. Docker's own OOMKilled flag
// is not enough on v1: its OOM event can come after the exit event, and
// the flag is then lost (a memory hog reported as failed 137); and the
// kernel's oom_kill counter stays in the victim's cgroup, which is gone
// with the container. On v2 nothing is needed (nil): memory.events is
// hierarchical, so the parent counts the container's OOM kills.
func (a *accounting) limitParent(inst, id string, bytes int64) (*sandbox.OOMWatch, error) {
	if a.v2 {
		return nil, nil
	}
	zero := uint64(0)
	res := &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &bytes, Swap: &bytes, Swappiness: &zero}}
	memOnly := func() ([]cgroup1.Subsystem, error) { return []cgroup1.Subsystem{cgroup1.NewMemory(a.root)}, nil }
	cg, err := cgroup1.New(cgroup1.StaticPath(a.parent(inst, id)), res, cgroup1.WithHierarchy(memOnly))
	if err != nil {
		return nil, fmt.Errorf("creating memory cgroup %s: %w", a.parent(inst, id), err)
	}
	w, err := sandbox.WatchOOM(cg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", a.parent(inst, id), err)
	}
	return w, nil
}

// oomKilledV2 reports whether the kernel's OOM killer killed anything in
// the execution's parent cgroup or below it (v2 only).
func (a *accounting) oomKilledV2(inst, id string) bool {
	if !a.v2 {
		return false
	}
	n, _ := sandbox.CgroupStatField(filepath.Join(a.dir(inst, id), "memory.events"), "oom_kill")
	return n > 0
}

// memory is the execution's current memory use, its parent cgroup's
// (page cache and tmpfs pages included); 0 if unknown.
func (a *accounting) memory(inst, id string) int64 {
	f := filepath.Join(a.root, "memory", a.parent(inst, id), "memory.usage_in_bytes")
	if a.v2 {
		f = filepath.Join(a.dir(inst, id), "memory.current")
	}
	n, _ := sandbox.ReadCgroupInt(f)
	return n
}
