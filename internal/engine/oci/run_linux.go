package oci

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox/uidpool"
)

// Run executes spec in a fresh sandbox and destroys it.
func (d *Driver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	if spec.Timeout <= 0 {
		spec.Timeout = engine.DefaultTimeout
	}
	spec.Limits = spec.Limits.WithDefaults()
	if spec.ID == "" {
		spec.ID = newID()
	}
	if !validID(spec.ID) {
		return engine.Result{}, fmt.Errorf("oci: invalid execution id %q", spec.ID)
	}
	if err := ctx.Err(); err != nil {
		return engine.Result{}, err
	}
	if err := d.checkImage(spec.Language.Image); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	tpl, err := d.template(spec.Language, spec.Limits)
	if err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}

	bundle := filepath.Join(d.bundlesDir, spec.ID)
	// The bundle directory is the first thing created and the last removed:
	// while it exists, Reap knows which execution to clean up.
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return engine.Result{}, fmt.Errorf("oci: creating bundle: %w", err)
	}
	var (
		cg  *execCgroup
		uid *uidpool.Lease
	)
	defer func() {
		if err := d.cleanup(spec.ID, bundle, cg); err != nil {
			d.log.Error("oci: sandbox cleanup failed; Reap will retry at start-up", "id", spec.ID, "err", err)
			uid.Abandon()
			return
		}
		uid.Release()
	}()

	// A host uid of its own for the sandbox's lifetime: no per-user
	// kernel limit is shared with another execution.
	if uid, err = d.uids.Acquire(); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	if err := d.writeBundle(bundle, tpl, spec, uid.UID); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	cg, err = d.cg.create(spec.ID, d.cgLimitsFor(spec.Limits))
	if err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	return d.execute(ctx, spec, bundle, cg)
}

// writeBundle writes config.json and the code file, and for runsc mounts
// the host tmpfs that becomes /tmp.
func (d *Driver) writeBundle(bundle string, tpl *template, spec engine.Spec, uid uint32) error {
	code := filepath.Join(bundle, "code")
	if err := os.Mkdir(code, 0o755); err != nil {
		return fmt.Errorf("creating code dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(code, spec.Language.File), []byte(spec.Code), 0o644); err != nil {
		return fmt.Errorf("writing code: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), tpl.render(spec.ID, uid), 0o600); err != nil {
		return fmt.Errorf("writing config.json: %w", err)
	}
	if d.rt.gvisor {
		tmp := filepath.Join(bundle, "tmp")
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return fmt.Errorf("creating tmp: %w", err)
		}
		// The same options as sandbox.TmpfsOptions, as flags and data.
		data := "mode=1777,size=" + strconv.FormatInt(spec.Limits.TmpBytes, 10)
		if err := unix.Mount("tmpfs", tmp, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
			return fmt.Errorf("mounting tmpfs for /tmp: %w", err)
		}
	}
	return nil
}

// execute runs the runtime and turns its outcome into a Result.
func (d *Driver) execute(ctx context.Context, spec engine.Spec, bundle string, cg *execCgroup) (engine.Result, error) {
	logPath := filepath.Join(bundle, "runtime.log")
	pidPath := filepath.Join(bundle, "init.pid")
	// Not CommandContext: cancelling must kill the sandbox, not orphan it
	// by killing only the runtime process.
	cmd := d.runtimeCmd(context.Background(), logPath, "run", "--bundle", bundle, "--pid-file", pidPath, spec.ID)
	// Always a pipe, even when empty: runtimes chown the sandbox's stdio to
	// its user, and a host file here (exec's default is the host's
	// /dev/null) would be handed to uid 65534.
	cmd.Stdin = strings.NewReader(spec.Stdin)
	stdout := &engine.CappedBuffer{Max: spec.Limits.OutputBytes}
	stderr := &engine.CappedBuffer{Max: spec.Limits.OutputBytes}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// If a sandbox process escaped the kill and kept the pipes open, do
	// not wait for it forever; cleanup kills it through the cgroup.
	cmd.WaitDelay = 5 * time.Second

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return engine.Result{}, fmt.Errorf("oci: starting %s: %w", d.rt.name, err)
	}
	var (
		mu       sync.Mutex
		finished bool
		timedOut bool
		canceled bool
	)
	stop := func(reason *bool) {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			*reason = true
			d.kill(spec.ID, cmd.Process)
		}
	}
	timer := time.AfterFunc(spec.Timeout, func() { stop(&timedOut) })
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop(&canceled)
		case <-done:
		}
	}()
	waitErr := cmd.Wait()
	duration := time.Since(start)
	mu.Lock()
	finished = true
	mu.Unlock()
	timer.Stop()
	close(done)

	if canceled && !timedOut {
		return engine.Result{}, ctx.Err()
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return engine.Result{}, fmt.Errorf("oci: waiting for %s: %w", d.rt.name, waitErr)
	}
	code := exitCode(cmd.ProcessState)
	oom := cg.oomKilled()
	cpu, peak := cg.usage()
	if !timedOut && !oom && code != 0 {
		// The runtime writes the pid file once the sandbox exists; if it
		// failed before that, the platform failed, not the user's code.
		if _, err := os.Stat(pidPath); err != nil {
			msg := runtimeError(logPath)
			if msg == "" {
				msg = "exit status " + strconv.Itoa(code) + ", sandbox not created"
			}
			return engine.Result{}, fmt.Errorf("oci: %s failed: %s", d.rt.name, msg)
		}
	}
	if timedOut {
		code = 128 + int(syscall.SIGKILL)
	}
	return engine.Result{
		Status:    engine.Classify(code, timedOut, oom),
		Stdout:    stdout.String(),
		Stderr:    stderr.String(),
		ExitCode:  code,
		Duration:  duration,
		Truncated: stdout.Truncated() || stderr.Truncated(),
		Usage: engine.Usage{
			SandboxSeconds:  duration.Seconds(),
			CPUSeconds:      cpu,
			PeakMemoryBytes: peak,
		},
	}, nil
}

// kill ends the sandbox at once. SIGKILL to every process of the sandbox's
// cgroup includes the pid namespace's init, whose death makes the kernel
// kill everything else in the namespace (double-forked, setsid,
// SIGTERM-ignoring processes too); under runsc it is gVisor's sandbox and
// gofer. If the sandbox has no process yet, the runtime process is killed
// and cleanup removes whatever it had created.
func (d *Driver) kill(id string, runtime *os.Process) {
	if d.cg.kill(id) == 0 {
		_ = runtime.Kill()
	}
}

// cleanup removes everything execution id created, in reverse order:
// runtime state, processes and cgroups, the runsc tmpfs, the bundle.
func (d *Driver) cleanup(id, bundle string, cg *execCgroup) error {
	var errs []error
	if cg != nil {
		cg.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.forceDelete(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := d.cg.remove(id); err != nil {
		errs = append(errs, err)
	}
	if d.rt.gvisor {
		// runsc creates a container's lock file before its state file.
		// Stopped in between (a cancel or timeout while it starts, seen
		// under emulation), it leaves the lock, which no delete removes.
		lock := filepath.Join(d.runtimeRoot, id+"_sandbox:"+id+".lock")
		if err := os.Remove(lock); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing runsc lock: %w", err))
		}
	}
	if err := unmountUnder(bundle); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(bundle); err != nil {
		errs = append(errs, fmt.Errorf("removing bundle: %w", err))
	}
	return errors.Join(errs...)
}

// runtimeError returns the first error the runtime logged, if any.
func runtimeError(logPath string) string {
	b, err := os.ReadFile(logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &entry) != nil {
			continue
		}
		if entry.Level == "error" || entry.Level == "fatal" {
			return entry.Msg
		}
	}
	return ""
}

// unmountUnder detaches every mount at or below dir (the runsc tmpfs, or
// anything a crashed runtime left), deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, in mount order.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mp, _, _, ok := parseMountinfo(sc.Text())
		if ok && (mp == dir || strings.HasPrefix(mp, dir+"/")) {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}
