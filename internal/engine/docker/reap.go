package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"

	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// Reap removes what dead driver instances (a server that crashed or was
// SIGKILLed) left behind: their containers, /tmp volumes, code
// directories, lock files and parent cgroups, plus anything of this driver's own that a failed
// cleanup left. A live instance's sandboxes, and this driver's running
// executions, are never touched, so Reap is safe at any time. It returns
// the number of containers removed.
func (d *Driver) Reap(ctx context.Context) (int, error) {
	list, err := d.cli.ContainerList(ctx, container.ListOptions{
		All:     true,
		Filters: filters.NewArgs(filters.Arg("label", labelSandbox+"=1")),
	})
	if err != nil {
		return 0, fmt.Errorf("docker: listing leftover containers: %w", err)
	}

	var errs []error
	dead := map[string]*deadInstance{} // by lock path
	defer func() {
		for _, di := range dead {
			di.release()
		}
	}()
	// owner decides, once per lock file, whether its instance is dead.
	owner := func(lockPath, inst string) *deadInstance {
		if di, ok := dead[lockPath]; ok {
			return di
		}
		di := lockIfDead(lockPath, inst)
		if di != nil {
			dead[lockPath] = di
		}
		return di
	}

	// leftover says whether a container or volume with these labels is to
	// be removed: this driver's own that no running execution holds, or a
	// dead instance's (not a live one's, nor one with labels we did not
	// write).
	leftover := func(labels map[string]string) bool {
		inst, lockPath := labels[labelInstance], labels[labelOwner]
		if inst == d.instance {
			return !d.running(labels[labelExecution])
		}
		return validOwner(inst, lockPath) && owner(lockPath, inst) != nil
	}

	removed := 0
	for _, c := range list {
		if !leftover(c.Labels) {
			continue
		}
		err := d.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		switch {
		case errNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("docker: removing leftover container %.12s: %w", c.ID, err))
		default:
			removed++
			d.log.Info("docker: removed leftover container", "container", c.ID, "execution", c.Labels[labelExecution], "pid", c.Labels[labelPID])
		}
	}

	// gVisor sandboxes' /tmp volumes go with their containers; one is left
	// only if that removal failed.
	vols, err := d.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", labelSandbox+"=1"))})
	if err != nil {
		errs = append(errs, fmt.Errorf("docker: listing leftover volumes: %w", err))
	}
	for _, v := range vols.Volumes {
		if !leftover(v.Labels) {
			continue
		}
		if err := d.cli.VolumeRemove(ctx, v.Name, true); err != nil && !errNotFound(err) {
			errs = append(errs, fmt.Errorf("docker: removing leftover volume %.12s: %w", v.Name, err))
		}
	}

	// Dead instances without containers left: their lock files are here.
	entries, err := os.ReadDir(d.opts.StateDir)
	if err != nil {
		errs = append(errs, fmt.Errorf("docker: listing state directory: %w", err))
	}
	for _, e := range entries {
		inst := strings.TrimSuffix(e.Name(), lockSuffix)
		if inst == d.instance || !validInstance(inst) {
			continue
		}
		owner(filepath.Join(d.opts.StateDir, inst+lockSuffix), inst)
	}

	// The containers are gone: now their files and cgroups can go.
	for _, di := range dead {
		if d.acct != nil {
			for _, id := range d.acct.leftovers(di.instance) {
				if err := d.acct.remove(di.instance, id); err != nil {
					errs = append(errs, fmt.Errorf("docker: leftover %w", err))
				}
			}
		}
		if err := di.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := d.reapOwn(); err != nil {
		errs = append(errs, err)
	}
	if removed > 0 {
		d.log.Info("docker: reaped sandboxes left by a previous server", "removed", removed)
	}
	return removed, errors.Join(errs...)
}

// reapOwn removes this driver's code directories and cgroups that no
// running execution owns (left by a cleanup that failed).
func (d *Driver) reapOwn() error {
	var errs []error
	base := filepath.Join(d.opts.StateDir, d.instance)
	entries, err := os.ReadDir(base)
	if err != nil {
		errs = append(errs, fmt.Errorf("docker: listing code directories: %w", err))
	}
	for _, e := range entries {
		if d.running(e.Name()) {
			continue
		}
		if err := removeCodeDir(filepath.Join(base, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("docker: removing leftover code directory: %w", err))
		}
	}
	if d.acct != nil {
		for _, id := range d.acct.leftovers(d.instance) {
			if d.running(id) {
				continue
			}
			if err := d.acct.remove(d.instance, id); err != nil {
				errs = append(errs, fmt.Errorf("docker: leftover %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// deadInstance is an instance whose lock Reap now holds: nobody else will
// use or reap it meanwhile.
type deadInstance struct {
	instance string
	lockPath string
	lock     *os.File // nil when the lock file was already gone
}

// lockIfDead returns the instance if its owner is dead: its lock file is
// missing (a reaper removed it, or the host rebooted) or can be locked.
// It returns nil while the owner holds the lock.
func lockIfDead(lockPath, inst string) *deadInstance {
	f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return &deadInstance{instance: inst, lockPath: lockPath}
	}
	if err != nil {
		return nil // cannot tell: leave it
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil // alive
	}
	return &deadInstance{instance: inst, lockPath: lockPath, lock: f}
}

// remove deletes the dead instance's directory, then its lock file.
func (di *deadInstance) remove() error {
	if di.lock == nil {
		return nil
	}
	dir := strings.TrimSuffix(di.lockPath, lockSuffix)
	if err := removeInstanceDir(dir); err != nil {
		return fmt.Errorf("docker: removing leftover instance directory: %w", err)
	}
	if err := os.Remove(di.lockPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("docker: removing leftover instance lock: %w", err)
	}
	return nil
}

func (di *deadInstance) release() {
	if di.lock != nil {
		di.lock.Close()
	}
}

// validOwner accepts the labels we write: an instance token and the
// absolute path of its lock file.
func validOwner(inst, lockPath string) bool {
	return validInstance(inst) && filepath.IsAbs(lockPath) && filepath.Base(lockPath) == inst+lockSuffix
}

// validInstance accepts the tokens claimInstance makes (hex), so a label
// or file name we did not write never becomes a path to delete.
func validInstance(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// removeCodeDir removes one execution's directory: a cold one is the
// working directory's tmpfs itself, a warm one holds it as code/, a live
// one may hold the egress directory's mount (bindEgress), and a cold one
// with egress holds code/, the egress directory's mount and the agent's
// (egress.go). A cold one's names are the code's: nothing is unmounted
// through a link.
func removeCodeDir(dir string) error {
	for _, name := range []string{"code", egressSource, agentSource} {
		if err := unmountNoFollow(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	if err := sandbox.UnmountWorkdir(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// removeInstanceDir removes an instance directory and every execution
// directory in it.
func removeInstanceDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCodeDir(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(append(errs, os.RemoveAll(dir))...)
}
