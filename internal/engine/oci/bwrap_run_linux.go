package oci

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/launcher"
)

// bundlePlaceholder stands for the bundle directory in a cached plan.
const bundlePlaceholder = "@@VERTAL_BUNDLE@@"

// bwrapPlan returns the cached translation of the spec for a language and
// limits, with egress through agent unless it is "" (withEgress); the
// execution's bundle and uid are filled in by render.
func (d *Driver) bwrapPlan(lang engine.Language, l engine.Limits, agent string) (*bwrapPlan, error) {
	return cachedFromSpec(d, d.plans, lang, l, agent, func(spec *specs.Spec) (*bwrapPlan, error) {
		return d.bwrapPlanOf(spec, lang)
	})
}

// bwrapPlanOf translates a spec of lang's image, with bundle and uid
// placeholders.
func (d *Driver) bwrapPlanOf(spec *specs.Spec, lang engine.Language) (*bwrapPlan, error) {
	if err := reachableByOthers(lang.Image); err != nil {
		return nil, fmt.Errorf("oci: the bwrap runtime runs as the sandbox's uid, which cannot reach the image %s: %w "+
			"(chmod o+x that directory, or use --runtime crun)", lang.Image, err)
	}
	p, err := bwrapPlanFor(spec, bwrapEnv{bundle: bundlePlaceholder, dev: d.devDir(), exists: func(path string) (bool, bool) {
		host := filepath.Join(lang.Image, path)
		if path == "/proc" || strings.HasPrefix(path, "/proc/") {
			host = path
		}
		fi, err := os.Lstat(host)
		return err == nil && fi.IsDir(), err == nil
	}})
	if err != nil {
		return nil, err
	}
	if err := d.checkSeccomp(p); err != nil {
		return nil, err
	}
	return p, nil
}

// reachableByOthers checks that a user who owns none of dir and its
// ancestors can pass through all of them: bwrap resolves its mount
// sources as the sandbox's uid. (What is inside keeps its own modes; an
// image's files are world-readable by construction.)
func reachableByOthers(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by other users", p)
		}
		if p == "/" {
			return nil
		}
	}
}

// devDir is the /dev of the driver's bwrap sandboxes (prepareDev).
func (d *Driver) devDir() string { return filepath.Join(d.instance, "dev") }

// openBundleTo lets only the sandbox's group (its uid = gid) pass into
// the bundle: bwrap, as that uid, resolves its mount sources there.
func openBundleTo(bundle string, gid uint32) error {
	if err := os.Chown(bundle, 0, int(gid)); err != nil {
		return err
	}
	return os.Chmod(bundle, 0o710)
}

// checkSeccomp makes sure the plan's profile is the one the driver
// compiled at New.
func (d *Driver) checkSeccomp(p *bwrapPlan) error {
	if p.seccomp == nil {
		return nil
	}
	want, _ := json.Marshal(sandbox.Seccomp(d.rt.name))
	got, _ := json.Marshal(p.seccomp)
	if string(got) != string(want) {
		return fmt.Errorf("bwrap: the spec's seccomp profile is not the one compiled at start-up")
	}
	return nil
}

// render is the plan for one execution: its bundle, its uid as uid and
// gid, and the request's arguments and environment.
func (p *bwrapPlan) render(bundle string, uid uint32, args, env []string) *bwrapPlan {
	r := *p
	u := strconv.FormatUint(uint64(uid), 10)
	ph := strconv.FormatUint(uidPlaceholder, 10)
	fill := func(s string) string {
		if s == ph {
			return u
		}
		return strings.ReplaceAll(s, bundlePlaceholder, bundle)
	}
	r.args = make([]string, len(p.args))
	for i, a := range p.args {
		r.args[i] = fill(a)
	}
	r.checks = make([]mountCheck, len(p.checks))
	for i, c := range p.checks {
		r.checks[i] = mountCheck{fill(c.path), c.flags}
	}
	if p.uid == uidPlaceholder {
		r.uid = uid
	}
	if p.gid == uidPlaceholder {
		r.gid = uid
	}
	r.command, r.inner = innerCommand(p.command, args, env)
	if r.inner != nil {
		r.args = append(r.args, "--args", strconv.Itoa(bwrapArgsFD))
	}
	return &r
}

// innerCommand keeps a request's args and env off every host process:
// bwrap's parent runs in the host's namespaces, its command line is
// world-readable in /proc, and its environment would be read by the
// host's dynamic loader when bwrap starts (LD_PRELOAD, LD_DEBUG_OUTPUT).
// Both go into options bwrap reads from a descriptor (--args), as
// --setenv, which bwrap applies with setenv(3) after it started: the
// loader never sees them, and its /proc/<pid>/environ is what it was
// started with. Args travel as VERTAL_ARG_<i> (a reserved prefix), and a
// fixed /bin/sh line inside the sandbox appends them to the command and
// unsets them before it execs: the program gets exactly its command line
// and environment. Without args or env, nothing changes (no extra exec).
func innerCommand(command, args, env []string) ([]string, []byte) {
	if len(args) == 0 && len(env) == 0 {
		return command, nil
	}
	var b []byte
	setenv := func(name, value string) {
		for _, s := range []string{"--setenv", name, value} {
			b = append(append(b, s...), 0)
		}
	}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		setenv(name, value)
	}
	if len(args) == 0 {
		return command, b
	}
	for i, a := range args {
		setenv("VERTAL_ARG_"+strconv.Itoa(i+1), a)
	}
	script := `i=0; while [ "$i" -lt ` + strconv.Itoa(len(args)) + ` ]; do i=$((i+1)); ` +
		`eval "set -- \"\$@\" \"\$VERTAL_ARG_$i\"; unset VERTAL_ARG_$i"; done; exec "$@"`
	return append([]string{"/bin/sh", "-c", script, "sh"}, command...), b
}

// bwrapProcess is one bwrap sandbox as sandbox.Supervise drives it.
type bwrapProcess struct {
	d      *Driver
	id     string
	bundle string
	cg     *execCgroup
	plan   *bwrapPlan
	cmd    *exec.Cmd
	stdio
	// info, block and status are the host's ends of bwrap's control
	// descriptors.
	info, block, status *os.File
	extra               []*os.File // bwrap's ends of the control descriptors
	cgroupFD            *os.File   // cgroup v2: the directory bwrap is born in
	initPid             int        // the sandbox's pid 1, from --info-fd
	ran                 bool       // bwrap reported the command's exit
}

func (d *Driver) newBwrapProcess(id, bundle string, cg *execCgroup, plan *bwrapPlan) (_ *bwrapProcess, err error) {
	p := &bwrapProcess{d: d, id: id, bundle: bundle, cg: cg, plan: plan}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	open := p.stdio.open
	if plan.agentChannel {
		open = p.stdio.openAgent
	}
	if err := open(); err != nil {
		return nil, err
	}
	// The OCI runtimes chown the sandbox's stdio to its user; bwrap does
	// not, and the sandbox's user namespace does not map the host's
	// root, so /dev/stdin, /dev/stdout and /dev/stderr (reopened through
	// /proc/self/fd) were EACCES. The pipes are the sandbox's own, so
	// giving them to its uid gives it nothing of the host.
	if err := p.stdio.chown(plan.uid, plan.gid); err != nil {
		return nil, err
	}
	// Control descriptors, in bwrap's fd order (3, 4, 5).
	var ends [3][2]*os.File
	for i := range ends {
		r, w, err := os.Pipe()
		if err != nil {
			for _, e := range ends[:i] {
				e[0].Close()
				e[1].Close()
			}
			return nil, fmt.Errorf("oci: pipe: %w", err)
		}
		ends[i] = [2]*os.File{r, w}
	}
	p.info, p.block, p.status = ends[0][0], ends[1][1], ends[2][0]
	p.extra = []*os.File{ends[0][1], ends[1][0], ends[2][1]}
	if plan.inner != nil {
		f, err := innerArgsFile(plan.inner)
		if err != nil {
			return nil, err
		}
		p.extra = append(p.extra, f) // bwrapArgsFD; bwrap closes it once read
	}

	argv := append(append(append([]string(nil), plan.args...), "--"), plan.command...)
	// Not CommandContext: cancelling must kill the sandbox (Kill).
	p.cmd = exec.Command(d.rtPath, argv...)
	p.cmd.Env = plan.env
	p.cmd.Dir = "/"
	p.stdio.attach(p.cmd)
	p.cmd.ExtraFiles = p.extra
	p.cmd.SysProcAttr = &syscall.SysProcAttr{
		// The leased uid and gid, no supplementary groups: an
		// unprivileged bwrap. Run as root, it would map the sandbox's
		// user to the host's root.
		Credential: &syscall.Credential{Uid: plan.uid, Gid: plan.gid, Groups: []uint32{}},
	}
	if cg.v2 != nil {
		// cgroup v2: born in its cgroup (clone3 CLONE_INTO_CGROUP), so
		// no process of the sandbox ever runs outside it, and its
		// cgroup namespace is rooted there.
		leaf := filepath.Join(cg.dir, sandboxLeaf)
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("oci: creating cgroup %s: %w", leaf, err)
		}
		if p.cgroupFD, err = os.Open(leaf); err != nil {
			return nil, fmt.Errorf("oci: opening cgroup %s: %w", leaf, err)
		}
		p.cmd.SysProcAttr.UseCgroupFD = true
		p.cmd.SysProcAttr.CgroupFD = int(p.cgroupFD.Fd())
	}
	return p, nil
}

// innerArgsFile is a sealed memfd holding data, read from its start: no
// path on the host names it, and its size needs no pipe buffer.
func innerArgsFile(data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("vertal-bwrap-args", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("oci: memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "vertal-bwrap-args")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("oci: writing bwrap's args: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("oci: sealing bwrap's args: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("oci: bwrap's args: %w", err)
	}
	return f, nil
}

// Start runs bwrap and, while it waits for the go-ahead, does what the
// spec asks that bwrap cannot: cgroup placement (v1), rlimits, OOM score,
// and the user namespace's uid and gid maps.
//
// bubblewrap 0.8.0 (bubblewrap.c, main) forks the sandbox's pid 1 with
// clone(CLONE_NEWUSER|CLONE_NEWPID|...) first. The parent then writes
// {"child-pid": N} to --info-fd and blocks reading --userns-block-fd;
// only after that does it write the eventfd the child waits on before
// doing anything at all ("Wait for the parent to init uid/gid maps").
// The child then mounts the new root, drops its capabilities, loads the
// seccomp filter and forks the command (pid 2, which inherits pid 1's
// rlimits, OOM score and cgroups) or execs it. So no code of the
// sandbox, bwrap's or the user's, runs before the driver has finished
// here and written the block descriptor. If the server dies first, the
// parent dies with it (--die-with-parent is set before it blocks) and
// the child waits on the eventfd forever, until Reap kills it; it never
// runs the command. (--block-fd would not do: its EOF lets the child go
// on.) With --userns-block-fd the driver writes the maps, "U U 1": the
// sandbox's uid is the one leased, inside and out.
func (p *bwrapProcess) Start(ctx context.Context) error {
	if err := p.verifyMounts(); err != nil {
		return err
	}
	// Descriptors the server inherited without close-on-exec (from
	// whatever started it) would pass through bwrap, which closes none,
	// to the program; the OCI runtimes close them. The server opens
	// everything close-on-exec, so this changes only those.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("oci: bwrap: marking inherited descriptors close-on-exec: %w", err)
	}
	err := p.cmd.Start()
	p.closeChild()
	for _, f := range p.extra {
		f.Close()
	}
	p.extra = nil
	if p.cgroupFD != nil {
		p.cgroupFD.Close()
		p.cgroupFD = nil
	}
	if err != nil {
		return fmt.Errorf("oci: starting bwrap: %w", err)
	}
	if err := p.prepare(); err != nil {
		p.Kill()
		p.block.Close()
		return fmt.Errorf("oci: bwrap: %w", err)
	}
	// The go-ahead byte, then the filter (a few KiB: within the pipe's
	// buffer, so the write does not wait for the reader).
	_, err = p.block.Write(append([]byte{1}, p.d.seccompBPF...))
	p.block.Close()
	if err != nil {
		p.Kill()
		return fmt.Errorf("oci: bwrap: releasing the sandbox: %w", err)
	}
	// As the OCI runtimes' --pid-file: the sandbox exists, and its pid 1
	// is this (for tests and operators; nothing reads it back).
	if err := os.WriteFile(filepath.Join(p.bundle, "init.pid"), []byte(strconv.Itoa(p.initPid)), 0o600); err != nil {
		p.Kill()
		return fmt.Errorf("oci: bwrap: %w", err)
	}
	return nil
}

// verifyMounts checks that the bind sources carry the mount flags the
// spec wants (noexec, nosuid, ...): bwrap keeps a source's flags.
func (p *bwrapProcess) verifyMounts() error {
	for _, c := range p.plan.checks {
		var st unix.Statfs_t
		if err := unix.Statfs(c.path, &st); err != nil {
			return fmt.Errorf("oci: bwrap: %w", err)
		}
		if st.Flags&c.flags != c.flags {
			return fmt.Errorf("oci: bwrap: %s is mounted with flags %#x, want %#x", c.path, st.Flags, c.flags)
		}
	}
	return nil
}

// prepareDev makes the /dev every bwrap sandbox of the driver shares: a
// small tmpfs in the instance directory, nosuid and noexec, holding the
// standard device nodes (the host's numbers) and links, then remounted
// read-only. Close and Reap unmount it with the instance.
func prepareDev(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	const flags = unix.MS_NOSUID | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", dir, "tmpfs", flags, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mounting %s: %w", dir, err)
	}
	for _, dev := range bwrapDevices {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return fmt.Errorf("%s: not a character device on the host (%v)", dev, err)
		}
		if err := unix.Mknod(filepath.Join(dir, filepath.Base(dev)), unix.S_IFCHR|0o666, int(st.Rdev)); err != nil {
			return fmt.Errorf("creating %s: %w", dev, err)
		}
		// mknod applies the umask; the nodes are world read-write.
		if err := os.Chmod(filepath.Join(dir, filepath.Base(dev)), 0o666); err != nil {
			return err
		}
	}
	for _, l := range bwrapDevLinks {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			return err
		}
	}
	// The mount point of the sandbox's own /dev/shm (a bind of its
	// bundle's shm tmpfs).
	if err := os.Mkdir(filepath.Join(dir, "shm"), 0o755); err != nil {
		return err
	}
	// The mount point of node's warm launcher: bwrap cannot create it
	// in this read-only /dev. Empty and root's, it is all a cold sandbox
	// sees of it.
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(launcher.NodePreload)), nil, 0o444); err != nil {
		return err
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("remounting %s read-only: %w", dir, err)
	}
	return nil
}

// prepare is the work done while bwrap waits (see Start).
func (p *bwrapProcess) prepare() error {
	pid, err := readChildPid(p.info)
	p.info.Close()
	p.info = nil
	if err != nil {
		return err
	}
	p.initPid = pid
	monitor := p.cmd.Process.Pid
	if p.cg.v1 != nil {
		if err := p.cg.adopt(monitor, pid); err != nil {
			return err
		}
	}
	if err := prlimitAs(p.plan.uid, p.plan.gid, pid, p.plan.rlimits); err != nil {
		return err
	}
	if p.plan.oomScoreAdj != nil {
		score := []byte(strconv.Itoa(*p.plan.oomScoreAdj))
		for _, q := range []int{monitor, pid} {
			if err := os.WriteFile("/proc/"+strconv.Itoa(q)+"/oom_score_adj", score, 0); err != nil {
				return fmt.Errorf("setting the OOM score: %w", err)
			}
		}
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/"
	for _, f := range []struct{ name, data string }{
		{"uid_map", fmt.Sprintf("%d %d 1\n", p.plan.uid, p.plan.uid)},
		{"setgroups", "deny\n"},
		{"gid_map", fmt.Sprintf("%d %d 1\n", p.plan.gid, p.plan.gid)},
	} {
		if err := os.WriteFile(dir+f.name, []byte(f.data), 0); err != nil {
			return fmt.Errorf("writing the user namespace's %s: %w", f.name, err)
		}
	}
	return nil
}

// prlimitAs sets rlimits on pid, a process whose uids are all uid and
// gids gid. prlimit(2) on another user's process needs CAP_SYS_RESOURCE
// (in the target's user namespace, which root's extends to), and
// containers commonly drop it; without it the kernel allows the call when
// the caller's real uid and gid equal the target's. So the call is made
// from a thread of its own whose real uid and gid are, for the call,
// the sandbox's: its effective ids stay 0 and it keeps its capabilities
// (they are lost only when no uid is 0), and credentials are per thread
// to the kernel. The thread is given back to the Go runtime only once
// its real ids are 0 again; otherwise it ends with the goroutine.
func prlimitAs(uid, gid uint32, pid int, rlimits []bwrapRlimit) error {
	if len(rlimits) == 0 {
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		const keep = ^uintptr(0) // -1: leave that id as it is
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), keep, keep); e != 0 {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setting rlimits: setresgid: %w", e)
			return
		}
		var err error
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), keep, keep); e != 0 {
			err = fmt.Errorf("setting rlimits: setresuid: %w", e)
		} else {
			for _, r := range rlimits {
				lim := r.limit
				if e := unix.Prlimit(pid, r.resource, &lim, nil); e != nil {
					err = fmt.Errorf("setting rlimit %d: %w", r.resource, e)
					break
				}
			}
		}
		_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, 0, keep, keep)
		_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, 0, keep, keep)
		if e1 == 0 && e2 == 0 {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// readChildPid reads --info-fd's {"child-pid": N}; bwrap closes it after.
func readChildPid(f *os.File) (int, error) {
	_ = f.SetReadDeadline(time.Now().Add(30 * time.Second))
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return 0, fmt.Errorf("reading --info-fd: %w", err)
	}
	if err := json.Unmarshal(b, &info); err != nil || info.ChildPid <= 0 {
		return 0, fmt.Errorf("bwrap exited before creating the sandbox (info %q)", b)
	}
	return info.ChildPid, nil
}

func (p *bwrapProcess) Wait() (int, error) {
	err := p.cmd.Wait()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return 0, fmt.Errorf("oci: waiting for bwrap: %w", err)
	}
	p.ran = commandRan(p.status)
	return exitCode(p.cmd.ProcessState), nil
}

// commandRan reads --json-status-fd once bwrap exited: bwrap writes
// {"exit-code": N} only when the command was executed.
func commandRan(f *os.File) bool {
	_ = f.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var st struct {
			ExitCode *int `json:"exit-code"`
		}
		if json.Unmarshal(sc.Bytes(), &st) == nil && st.ExitCode != nil {
			return true
		}
	}
	return false
}

// Kill kills every process of the sandbox's cgroup: bwrap's parent, the
// sandbox's pid 1 (whose death ends its pid namespace) and the program.
// Before the processes are in the cgroup (v1, during Start), bwrap's
// parent and pid 1 are killed directly.
func (p *bwrapProcess) Kill() error {
	if p.d.cg.kill(p.id) == 0 {
		if p.initPid > 0 {
			_ = unix.Kill(p.initPid, unix.SIGKILL)
		}
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Kill()
		}
	}
	return nil
}

func (p *bwrapProcess) Finish(ctx context.Context, e sandbox.Exit) (sandbox.Exit, error) {
	e.OOMKilled = p.cg.oomKilled()
	e.CPUSeconds, e.PeakMemoryBytes = p.cg.usage()
	if !e.TimedOut && !e.OOMKilled && e.Code != 0 && !p.ran {
		// bwrap failed before the command ran (its message is on the
		// sandbox's stderr): the platform failed, not the user's code.
		return e, fmt.Errorf("%w: bwrap exited with status %d before the program started", engine.ErrSetup, e.Code)
	}
	return e, nil
}

func (p *bwrapProcess) Workdir() string { return filepath.Join(p.bundle, "code") }

func (p *bwrapProcess) close() {
	p.stdio.close()
	for _, f := range []*os.File{p.info, p.block, p.status, p.cgroupFD} {
		if f != nil {
			f.Close()
		}
	}
	for _, f := range p.extra {
		f.Close()
	}
}
