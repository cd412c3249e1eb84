package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Reap removes whatever drivers that are no longer alive (crashed, killed)
// left under StateDir: their runtime processes, sandboxes, runtime state,
// cgroups, mounts and bundles. A driver's lock on its instance directory
// tells the living from the dead, so Reap is safe while other drivers
// share the StateDir. It returns the number of sandboxes removed. What
// sandbox uids left in the host's temporary directories is
// SweepHostFiles's, which may take long, so a server runs it after
// listening.
func (d *Driver) Reap(ctx context.Context) (int, error) {
	ents, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		return 0, fmt.Errorf("oci: reap: %w", err)
	}
	own := filepath.Base(d.instance)
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name()] = true
	}
	removed := 0
	var errs []error
	for _, e := range ents {
		name := e.Name()
		inst, isLock := strings.CutSuffix(name, lockSuffix)
		switch {
		case inst == own:
			continue
		case isLock:
			lockPath := filepath.Join(d.opts.StateDir, name)
			f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
			if err != nil {
				continue // reaped meanwhile by another driver
			}
			if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
				f.Close() // alive
				continue
			}
			n, err := reapInstance(ctx, d, filepath.Join(d.opts.StateDir, inst))
			removed += n
			if err == nil {
				err = os.Remove(lockPath)
			}
			f.Close()
			if err != nil {
				errs = append(errs, err)
			}
		case e.IsDir() && !names[name+lockSuffix]:
			// A directory whose lock is gone: its reaper was interrupted.
			n, err := reapInstance(ctx, d, filepath.Join(d.opts.StateDir, name))
			removed += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if removed > 0 {
		d.log.Info("oci: reaped sandboxes left by a previous server", "removed", removed)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("oci: reap: %w", err)
	}
	return removed, nil
}

// reapInstance removes one dead driver's instance directory and everything
// its executions created.
func reapInstance(ctx context.Context, d *Driver, inst string) (int, error) {
	// Runtime processes (`crun run`, runsc's sandbox and gofer) still
	// waiting on sandboxes would race with the cleanup: they go first.
	killProcsMentioning(inst)

	bundles := filepath.Join(inst, "bundles")
	ids := map[string]bool{}
	if ents, err := os.ReadDir(bundles); err == nil {
		for _, e := range ents {
			ids[e.Name()] = true
		}
	}
	var errs []error
	for name, rt := range runtimes {
		root := filepath.Join(inst, name)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		stateIDs := stateIDs(rt, root)
		for _, id := range stateIDs {
			ids[id] = true
		}
		path, err := exec.LookPath(rt.name)
		if err != nil {
			continue // processes and cgroups are still removed below
		}
		for _, id := range stateIDs {
			if err := forceDelete(ctx, rt, path, root, id); err != nil {
				d.log.Warn("oci: reap: runtime delete failed; removing by hand", "id", id, "err", err)
			}
		}
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	slices.Sort(sorted)
	for _, id := range sorted {
		if !validID(id) {
			continue
		}
		if err := d.cg.remove(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountUnder(inst); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(inst); err != nil {
		errs = append(errs, err)
	}
	return len(sorted), errors.Join(errs...)
}

// killProcsMentioning SIGKILLs every process whose command line contains s
// (a path only this driver's runtime invocations carry).
func killProcsMentioning(s string) {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
	}
}
