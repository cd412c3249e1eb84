package oci

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// Run executes spec in a fresh sandbox and destroys it.
func (d *Driver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	if err := spec.Validate(); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	if !validID(spec.ID) {
		return engine.Result{}, fmt.Errorf("oci: invalid execution id %q", spec.ID)
	}
	if err := ctx.Err(); err != nil {
		return engine.Result{}, err
	}
	spec.Language.Image = resolveImage(spec.Language.Image)
	if err := d.checkImage(spec.Language.Image); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	agent, err := d.oneShotEgress(spec)
	if err != nil {
		return engine.Result{}, fmt.Errorf("oci: execution %s: %w", spec.ID, err)
	}
	var (
		tpl  *template
		plan *bwrapPlan
	)
	if d.rt.bwrap {
		plan, err = d.bwrapPlan(spec.Language, spec.Limits, agent)
	} else {
		tpl, err = d.template(spec.Language, spec.Limits)
	}
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
	if err := d.writeBundle(bundle, tpl, spec, agent, uid.UID); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	if spec.EgressDir != "" {
		// Unmounted with the bundle (cleanup, or Reap after a crash).
		if err := hostBind(spec.EgressDir, filepath.Join(bundle, egressSource)); err != nil {
			return engine.Result{}, fmt.Errorf("oci: egress: %w", err)
		}
	}
	cg, err = d.cg.create(spec.ID, d.cgLimitsFor(spec.Limits))
	if err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	if plan != nil {
		return d.executeBwrap(ctx, spec, bundle, cg, plan.render(bundle, uid.UID, spec.Args, sandbox.UserEnv(sandbox.SpecEnv(spec))))
	}
	return d.execute(ctx, spec, bundle, cg)
}

// executeBwrap runs a bwrap sandbox through the engine's execution loop.
func (d *Driver) executeBwrap(ctx context.Context, spec engine.Spec, bundle string, cg *execCgroup, plan *bwrapPlan) (engine.Result, error) {
	if err := openBundleTo(bundle, plan.gid); err != nil {
		return engine.Result{}, fmt.Errorf("oci: %w", err)
	}
	p, err := d.newBwrapProcess(spec.ID, bundle, cg, plan)
	if err != nil {
		return engine.Result{}, err
	}
	defer p.close()
	return sandbox.Supervise(ctx, spec, p, sandbox.LoopOptions{})
}

// writeBundle writes config.json and fills the working directory (the
// code file and spec's files, on a tmpfs of its own), and for runsc
// mounts the host tmpfs that becomes /tmp. agent is the driver's copy of
// the agent when spec has an EgressDir (oneShotEgress), else "".
func (d *Driver) writeBundle(bundle string, tpl *template, spec engine.Spec, agent string, uid uint32) error {
	code := filepath.Join(bundle, "code")
	if err := sandbox.MountWorkdir(code, spec.Limits); err != nil {
		return err
	}
	if err := sandbox.WriteCode(code, spec.Language.File, []byte(spec.Code)); err != nil {
		return err
	}
	if err := sandbox.PlaceFiles(code, spec.Files, uid); err != nil {
		return err
	}
	if tpl != nil { // bwrap has no config.json: its plan is the spec
		config, err := d.config(tpl, spec, agent, uid)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o600); err != nil {
			return fmt.Errorf("writing config.json: %w", err)
		}
	}
	return d.hostTmpfsMounts(bundle, spec.Limits)
}

// hostTmpfsMounts mounts, for runsc and bwrap, the host tmpfs that become
// /tmp and /dev/shm (see Driver.spec).
func (d *Driver) hostTmpfsMounts(bundle string, l engine.Limits) error {
	if d.rt.gvisor || d.rt.bwrap {
		if err := hostTmpfs(filepath.Join(bundle, "tmp"), "mode=1777", l.TmpBytes); err != nil {
			return fmt.Errorf("/tmp: %w", err)
		}
		if err := hostTmpfs(filepath.Join(bundle, "shm"), "mode=1777", sandbox.ShmBytes(l)); err != nil {
			return fmt.Errorf("/dev/shm: %w", err)
		}
	}
	return nil
}

// hostTmpfs mounts a tmpfs of size bytes at dir, with the options of
// sandbox.TmpfsOptions as flags and data, for runtimes that bind it in.
// owner holds the data options for its root ("mode=1777", or mode, uid
// and gid).
func hostTmpfs(dir, owner string, size int64) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	data := owner + ",size=" + strconv.FormatInt(size, 10)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mounting tmpfs at %s: %w", dir, err)
	}
	return nil
}

// config is the execution's config.json: the cached template's, unless
// the request brings env, args or egress (agent, see withEgress), which
// are part of the process spec.
func (d *Driver) config(tpl *template, spec engine.Spec, agent string, uid uint32) ([]byte, error) {
	if len(spec.Env) == 0 && len(spec.Args) == 0 && agent == "" {
		return tpl.render(spec.ID, uid), nil
	}
	s, err := d.spec(spec.Language, spec.Limits, spec.ID)
	if err != nil {
		return nil, err
	}
	if agent != "" {
		d.withEgress(s, spec.Language, spec.Limits, agent)
	}
	s.Process.Args = append(s.Process.Args, spec.Args...)
	s.Process.Env = append(s.Process.Env, sandbox.UserEnv(sandbox.SpecEnv(spec))...)
	s.Process.User.UID, s.Process.User.GID = uid, uid
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding config.json: %w", err)
	}
	return b, nil
}

// execute runs the sandbox through the engine's execution loop.
func (d *Driver) execute(ctx context.Context, spec engine.Spec, bundle string, cg *execCgroup) (engine.Result, error) {
	p, err := d.newColdProcess(spec.ID, bundle, cg, spec.EgressDir != "")
	if err != nil {
		return engine.Result{}, err
	}
	defer p.close()
	return sandbox.Supervise(ctx, spec, p, sandbox.LoopOptions{})
}

// coldProcess is `<runtime> run` on a bundle, as sandbox.Supervise drives it.
type coldProcess struct {
	d       *Driver
	id      string
	bundle  string
	cg      *execCgroup
	cmd     *exec.Cmd
	pidPath string
	logPath string
	stdio
}

// newColdProcess prepares `<runtime> run` on bundle; hostUDS lets the
// sandbox connect to a host unix socket mounted into it (egress), which
// runsc refuses by default.
func (d *Driver) newColdProcess(id, bundle string, cg *execCgroup, hostUDS bool) (*coldProcess, error) {
	p := &coldProcess{d: d, id: id, bundle: bundle, cg: cg,
		pidPath: filepath.Join(bundle, "init.pid"), logPath: filepath.Join(bundle, "runtime.log")}
	if err := p.stdio.open(); err != nil {
		return nil, err
	}
	// Not CommandContext: cancelling must kill the sandbox, not orphan it
	// by killing only the runtime process.
	p.cmd = d.runtimeCmd(context.Background(), p.logPath, d.runArgs(hostUDS, "run", "--bundle", bundle, "--pid-file", p.pidPath, id)...)
	p.stdio.attach(p.cmd)
	return p, nil
}

func (p *coldProcess) Start(ctx context.Context) error {
	err := p.cmd.Start()
	p.closeChild()
	if err != nil {
		return fmt.Errorf("oci: starting %s: %w", p.d.rt.name, err)
	}
	return nil
}

func (p *coldProcess) Wait() (int, error) {
	err := p.cmd.Wait()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return 0, fmt.Errorf("oci: waiting for %s: %w", p.d.rt.name, err)
	}
	return exitCode(p.cmd.ProcessState), nil
}

func (p *coldProcess) Kill() error {
	p.d.kill(p.id, p.cmd.Process)
	return nil
}

func (p *coldProcess) Finish(ctx context.Context, e sandbox.Exit) (sandbox.Exit, error) {
	e.OOMKilled = p.cg.oomKilled()
	e.CPUSeconds, e.PeakMemoryBytes = p.cg.usage()
	if !e.TimedOut && !e.OOMKilled && e.Code != 0 {
		// The runtime writes the pid file once the sandbox exists; if it
		// failed before that, the platform failed, not the user's code.
		if _, err := os.Stat(p.pidPath); err != nil {
			msg := runtimeError(p.logPath)
			if msg == "" {
				msg = "exit status " + strconv.Itoa(e.Code) + ", sandbox not created"
			}
			return e, fmt.Errorf("oci: %s failed: %s", p.d.rt.name, msg)
		}
	}
	return e, nil
}

func (p *coldProcess) Workdir() string { return filepath.Join(p.bundle, "code") }

func (p *coldProcess) close() { p.stdio.close() }

// stdio is a sandbox's standard streams, always pipes (stdin too, even
// when empty): runtimes chown the sandbox's stdio to its user, and a host
// file (exec's default is the host's /dev/null) would be handed to the
// sandbox's uid. ours are the host's ends, child the sandbox's, closed
// once it started. Embedded, it gives a process sandbox.Process's Stdin,
// CopyOutput and CloseOutput.
type stdio struct{ ours, child [3]*os.File }

// open makes the three pipes; on an error none is left open.
func (s *stdio) open() error {
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			s.close()
			return fmt.Errorf("oci: pipe: %w", err)
		}
		if i == 0 {
			s.child[i], s.ours[i] = r, w
		} else {
			s.child[i], s.ours[i] = w, r
		}
	}
	return nil
}

// openAgent is open with the agent's channel for stdin and stdout: one
// unix socket pair instead of two pipes (stderr stays a pipe). The
// sandbox's pid 1 and the deadline's timeout hold the sandbox's end as
// well as the agent, and they are dumpable, so code of the same uid
// reaches their /proc/<pid>/fd; a pipe there opens, but a socket never
// does (ENXIO, under gVisor too), and pidfd_getfd, the other way to take
// a descriptor, is denied by the seccomp profile. See docs/SANDBOXES.md,
// "What the host trusts".
func (s *stdio) openAgent() error {
	ours, child, err := agentSocket()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		ours.Close()
		child.Close()
		return fmt.Errorf("oci: pipe: %w", err)
	}
	s.ours = [3]*os.File{ours, ours, r}
	s.child = [3]*os.File{child, child, w}
	return nil
}

// agentSocket is the agent's channel: the host's end, which goes through
// the poller (deadlines, a Close that ends a blocked Read), and the
// sandbox's, its own open file description, left blocking.
func agentSocket() (ours, child *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("oci: socketpair: %w", err)
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("oci: socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "agent"), os.NewFile(uintptr(fds[1]), "agent-sandbox"), nil
}

// chown gives the pipes to the sandbox's uid and gid, as the OCI
// runtimes do (one inode per pipe: both ends change).
func (s *stdio) chown(uid, gid uint32) error {
	for _, f := range s.child {
		if err := f.Chown(int(uid), int(gid)); err != nil {
			return fmt.Errorf("oci: giving the sandbox its stdio: %w", err)
		}
	}
	return nil
}

// attach gives cmd the sandbox's ends.
func (s *stdio) attach(cmd *exec.Cmd) {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.child[0], s.child[1], s.child[2]
}

func (s *stdio) Stdin() io.WriteCloser { return s.ours[0] }

func (s *stdio) CopyOutput(stdout, stderr io.Writer) error {
	return copyStreams(stdout, stderr, s.ours[1], s.ours[2])
}

func (s *stdio) CloseOutput() {
	s.closeChild()
	closeReads(s.ours[1], s.ours[2])
}

func (s *stdio) closeChild() {
	for i, f := range s.child {
		if f != nil {
			f.Close() // a second Close of openAgent's shared end is a no-op error
			s.child[i] = nil
		}
	}
}

// close closes both ends of every pipe still open.
func (s *stdio) close() {
	s.closeChild()
	for i, f := range s.ours {
		if f != nil {
			f.Close()
			s.ours[i] = nil
		}
	}
}

// copyStreams copies a sandbox's two output pipes until both end.
func copyStreams(stdout, stderr io.Writer, out, errs *os.File) error {
	var wg sync.WaitGroup
	var e1, e2 error
	wg.Add(2)
	go func() { defer wg.Done(); _, e1 = io.Copy(stdout, out) }()
	go func() { defer wg.Done(); _, e2 = io.Copy(stderr, errs) }()
	wg.Wait()
	return errors.Join(e1, e2)
}

// closeReads makes pending and future reads of the pipes return at once.
func closeReads(files ...*os.File) {
	for _, f := range files {
		_ = f.SetReadDeadline(time.Now())
	}
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

// unmountUnder detaches every mount at or below dir (the working
// directory, the runsc and bwrap tmpfs, the egress bind, or anything a
// crashed runtime left), deepest first. A mount point is never a link,
// and none is followed: the working directory is the code's to fill.
func unmountUnder(dir string) error {
	mounts, err := sandbox.MountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}
