//go:build linux

// Package oci is the daemon-less sandbox driver: each execution is an OCI
// bundle over a shared read-only root filesystem, run by crun, runc or runsc.
//
// Per execution the driver writes a bundle (config.json and the code file),
// creates and limits a parent cgroup, and starts one runtime process
// (`<runtime> run`) whose stdio are the sandbox's. Everything the execution
// creates lives under Options.StateDir and the cgroup "<CgroupParent>/<id>",
// so it can be removed whatever the outcome, and found again by Reap after
// the server was killed.
package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// Options configure the driver.
type Options struct {
	// Runtime is "crun", "runc", "runsc", "bwrap" (bubblewrap, see
	// bwrap_linux.go) or "" to pick the best installed
	// (bwrap where the host allows it, else crun, else runc).
	Runtime string
	// StateDir holds bundles and runtime state; it is cleaned by Reap.
	// Default /run/vertal/oci. It should be on a local filesystem (tmpfs).
	StateDir string
	// CgroupParent names the cgroup every execution's cgroup is created
	// under: in each hierarchy's root on cgroup v1; on v2 in the cgroup
	// delegated to the server (a systemd unit with Delegate=yes, a
	// container's cgroup namespace), else at the root. Default "vertal".
	CgroupParent string
	// Init is a static init binary bind-mounted as the sandbox's pid 1, so
	// user code gets normal signal and zombie handling. Default: tini-static.
	Init string
	// UIDs leases each sandbox a host uid of its own. Default: the
	// host-wide pool every driver shares (uidpool.DefaultDir).
	UIDs   *uidpool.Pool
	Logger *slog.Logger
}

// Driver runs sandboxes with an OCI runtime binary.
//
// A Driver owns an instance directory under StateDir, locked for its
// lifetime: Reap on any driver sharing the StateDir removes only what
// drivers no longer alive (crashed, killed) left behind.
type Driver struct {
	opts        Options
	log         *slog.Logger
	rt          runtimeKind
	rtPath      string
	initPath    string
	cg          *cgroups
	uids        *uidpool.Pool
	instance    string // StateDir/<token>
	bundlesDir  string // instance/bundles
	runtimeRoot string // instance/<runtime>: the runtime's --root
	lock        *os.File
	// sweepRoots replaces hostTempDirs for Reap's sweep in tests.
	sweepRoots []string

	// seccompBPF is the profile compiled for bwrap, once.
	seccompBPF []byte

	mu        sync.Mutex
	templates map[templateKey]*template
	plans     map[templateKey]*bwrapPlan // bwrap
	images    map[string]error           // image dir -> validation result
	agents    map[agentSource]string     // agentCopy's copies
}

// Defaults.
const (
	DefaultStateDir     = "/run/vertal/oci"
	DefaultCgroupParent = "vertal"
)

// New checks that the runtime is usable and returns a driver. An error
// wrapping engine.ErrUnavailable says what to install or set up.
//
// With crun on a cgroup v1 host in hybrid mode, New moves the controllers
// the unified hierarchy owns (usually hugetlb) to cgroup v1 mounts, which is
// what crun 1.8 needs; see docs/SECURITY.md.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir
	}
	if opts.CgroupParent == "" {
		opts.CgroupParent = DefaultCgroupParent
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the oci driver must run as root (it creates cgroups and namespaces)", engine.ErrUnavailable)
	}
	cg, err := discoverCgroups(opts.CgroupParent)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
	}
	rt, rtPath, err := pickRuntime(opts.Runtime, cg, log)
	if err != nil {
		return nil, err
	}
	opts.Runtime = rt.name
	var initPath string
	var seccompBPF []byte
	if rt.bwrap {
		if seccompBPF, err = sandbox.CompileSeccomp(sandbox.Seccomp(rt.name)); err != nil {
			return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
		}
	} else if initPath, err = findInit(opts.Init); err != nil {
		return nil, err
	}
	if err := cg.ensureBase(); err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
	}
	if cg.v2 != nil {
		p := cg.v2.place
		how := "at the root of the hierarchy (the server's cgroup is not delegated to it)"
		if p.Delegated {
			how = "in the cgroup delegated to the server, which moved to " + p.Supervisor
		}
		log.Info("oci: cgroup v2: executions' cgroups "+how, "base", p.Base,
			"peak", map[bool]string{true: "memory.peak", false: "memory.current polled"}[cg.v2.peak])
	}
	if opts.UIDs == nil {
		if opts.UIDs, err = uidpool.New("", 0, 0); err != nil {
			return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
		}
	}
	d := &Driver{
		opts: opts, log: log, rt: rt, rtPath: rtPath, initPath: initPath, cg: cg, uids: opts.UIDs,
		templates: map[templateKey]*template{}, images: map[string]error{},
		seccompBPF: seccompBPF, plans: map[templateKey]*bwrapPlan{},
	}
	if err := d.claimInstance(); err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
	}
	return d, nil
}

// pickRuntime resolves the runtime to use: the one asked for, or the first
// of crun and runc that is installed and can run on this host.
func pickRuntime(name string, cg *cgroups, log *slog.Logger) (runtimeKind, string, error) {
	candidates := []string{name}
	if name == "" {
		candidates = preference
	}
	var errs []error
	for _, c := range candidates {
		rt, path, err := findRuntime(c)
		if err == nil {
			err = prepareHost(rt, path, cg, log)
		}
		if err == nil {
			return rt, path, nil
		}
		errs = append(errs, err)
		if name == "" {
			log.Warn("oci: runtime not usable, trying the next", "runtime", c, "err", err)
		}
	}
	if len(errs) == 1 {
		return runtimeKind{}, "", errs[0]
	}
	return runtimeKind{}, "", fmt.Errorf("%w: no usable OCI runtime (apt-get install crun, or runc): %w", engine.ErrUnavailable, errors.Join(errs...))
}

// prepareHost applies what a runtime needs from this host. crun 1.8 on a
// cgroup v1 host in hybrid mode refuses to run while the unified (v2)
// hierarchy owns any controller; it usually owns hugetlb, which nothing
// uses, so it is moved to a cgroup v1 mount as the others are.
func prepareHost(rt runtimeKind, path string, cg *cgroups, log *slog.Logger) error {
	if rt.bwrap {
		return usableBwrap(path)
	}
	ctrls := cg.hybridControllers()
	if rt.name != "crun" || len(ctrls) == 0 {
		return nil
	}
	if err := cg.moveToV1(ctrls); err != nil {
		return fmt.Errorf("%w: crun cannot run while the unified cgroup hierarchy owns %v, and moving them to cgroup v1 failed: %w "+
			"(as root: mkdir -p /sys/fs/cgroup/hugetlb && mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb; or use --runtime runc)",
			engine.ErrUnavailable, ctrls, err)
	}
	log.Info("oci: moved cgroup controllers from the unified hierarchy to cgroup v1 for crun", "controllers", ctrls)
	return nil
}

// claimInstance creates and locks this driver's instance directory. The
// lock file is created and locked before the directory exists, so Reap
// never mistakes a starting driver for a dead one.
func (d *Driver) claimInstance() error {
	mode := os.FileMode(0o700)
	if d.rt.bwrap {
		mode = 0o711 // see searchable
	}
	if err := os.MkdirAll(d.opts.StateDir, mode); err != nil {
		return fmt.Errorf("creating state dir: %w", err)
	}
	var tok [6]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("instance token: %w", err)
	}
	name := hex.EncodeToString(tok[:])
	if d.rt.bwrap {
		if err := searchable(d.opts.StateDir); err != nil {
			return err
		}
	}
	lock, err := os.OpenFile(filepath.Join(d.opts.StateDir, name+lockSuffix), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("creating instance lock: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return fmt.Errorf("locking instance: %w", err)
	}
	d.lock = lock
	d.instance = filepath.Join(d.opts.StateDir, name)
	d.bundlesDir = filepath.Join(d.instance, "bundles")
	d.runtimeRoot = filepath.Join(d.instance, d.rt.name)
	for _, dir := range []string{d.instance, d.bundlesDir, d.runtimeRoot} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			d.Close()
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	if d.rt.bwrap {
		// bwrap, as the sandbox's uid, resolves the bundle's mount
		// sources by path: the way there may be searched, not listed;
		// each bundle is open to its own sandbox's group only.
		for _, dir := range []string{d.instance, d.bundlesDir} {
			if err := os.Chmod(dir, 0o711); err != nil {
				d.Close()
				return err
			}
		}
		if err := prepareDev(d.devDir()); err != nil {
			d.Close()
			return fmt.Errorf("bwrap /dev: %w", err)
		}
	}
	return nil
}

// vertalRun is the platform's state root, the default state dirs' parent.
var vertalRun = filepath.Dir(DefaultStateDir)

// searchable makes dir searchable by any uid (o+x) and checks that its
// ancestors are: bwrap runs as the sandbox's uid and must reach the
// bundles under it.
func searchable(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 == 0 {
		if err := os.Chmod(dir, fi.Mode().Perm()|0o011); err != nil {
			return fmt.Errorf("making the state dir searchable for bwrap: %w", err)
		}
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 && (p == vertalRun || strings.HasPrefix(p, vertalRun+"/")) {
			// The platform's own state root (0700 by default): search
			// without listing reveals nothing; what is under it keeps
			// its own modes.
			if err := os.Chmod(p, fi.Mode().Perm()|0o011); err != nil {
				return fmt.Errorf("making %s searchable for bwrap: %w", p, err)
			}
		} else if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("the bwrap runtime runs as the sandbox's uid, which cannot reach the state dir %s: %s is not searchable (chmod o+x %s, or choose another state dir)", dir, p, p)
		}
		if p == "/" {
			return nil
		}
	}
}

const lockSuffix = ".lock"

// Close releases the driver's instance directory. Sandboxes must not be
// running; the driver must not be used afterwards.
func (d *Driver) Close() error {
	if d.lock == nil {
		return nil
	}
	err := unmountUnder(d.instance) // bwrap's /dev and launcher tmpfs
	if rerr := os.RemoveAll(d.instance); rerr != nil && err == nil {
		err = rerr
	}
	if rerr := os.Remove(d.lock.Name()); rerr != nil && err == nil {
		err = rerr
	}
	d.lock.Close()
	d.lock = nil
	return err
}

var _ engine.Driver = (*Driver)(nil)

// Name identifies driver and runtime, e.g. "oci/crun".
func (d *Driver) Name() string { return "oci/" + d.rt.name }

// Runtime is the OCI runtime the driver uses.
func (d *Driver) Runtime() string { return d.rt.name }

// Enforced reports which protections this driver enforces with its runtime
// on this host's cgroup mode, and how, for `vertal doctor` and the security
// documentation.
func (d *Driver) Enforced() []sandbox.Protection {
	return enforced(d.rt, d.cg.mode)
}

// CgroupMode is the host's cgroup mode the driver works in: CgroupV1,
// CgroupHybrid or CgroupV2.
func (d *Driver) CgroupMode() string { return d.cg.mode }

// CgroupBases are the directories the executions' cgroups are created in,
// one per hierarchy (one on v2). The driver keeps them, empty, after Close.
func (d *Driver) CgroupBases() []string { return d.cg.bases() }

// cgroupHow says how each cgroup mode enforces the cgroup protections.
var cgroupHow = map[string]struct{ memory, cpu, pids, kill string }{
	CgroupV1: {
		memory: "cgroup v1 memory.limit_in_bytes = memory.memsw.limit_in_bytes (no swap); OOM from a memory.oom_control eventfd",
		cpu:    "cgroup v1 cpu.cfs_quota_us",
		pids:   "cgroup v1 pids.max",
		kill:   "SIGKILL to every process of the sandbox's cgroup (pidfd, membership checked)",
	},
	CgroupV2: {
		memory: "cgroup v2 memory.max + memory.swap.max=0; OOM from memory.events oom_kill",
		cpu:    "cgroup v2 cpu.max",
		pids:   "cgroup v2 pids.max",
		kill:   "cgroup v2 cgroup.kill on the sandbox's cgroup (freeze and SIGKILL where missing)",
	},
}

func enforced(rt runtimeKind, mode string) []sandbox.Protection {
	yes := func(name, how string) sandbox.Protection {
		return sandbox.Protection{Name: name, Enforced: true, How: how}
	}
	how, ok := cgroupHow[mode]
	if !ok { // hybrid: the v1 controllers do the work
		how = cgroupHow[CgroupV1]
	}
	ps := []sandbox.Protection{
		yes(sandbox.ProtNetwork, "new network namespace without interfaces but lo"),
		yes(sandbox.ProtReadonly, "root.readonly over the shared image"),
		yes(sandbox.ProtTmp, "tmpfs mount options"),
		yes(sandbox.ProtUser, "process.user: a host uid/gid leased per sandbox (uidpool)"),
		yes(sandbox.ProtCaps, "empty capability sets"),
		yes(sandbox.ProtNoNewPrivs, "process.noNewPrivileges"),
		yes(sandbox.ProtSeccomp, "linux.seccomp, allowlist, ENOSYS default"),
		yes(sandbox.ProtNamespaces, "linux.namespaces"),
		yes(sandbox.ProtMasked, "linux.maskedPaths, /sys not mounted"),
		yes(sandbox.ProtEnv, "fixed process.env; runtime closes fds above 2"),
		yes(sandbox.ProtMemory, how.memory),
		yes(sandbox.ProtCPU, how.cpu),
		yes(sandbox.ProtPids, how.pids),
		yes(sandbox.ProtFileSize, "RLIMIT_FSIZE"),
		yes(sandbox.ProtTimeout, how.kill+", which includes the pid namespace's init"),
		yes(sandbox.ProtInit, "tini-static bind-mounted at /dev/init"),
		yes(sandbox.ProtCleanup, "bundle, runtime state and cgroups removed; Reap after a crash"),
		{Name: sandbox.ProtKernelIsol, Enforced: false, How: "host kernel shared (namespaces, seccomp)", Fix: "--runtime runsc"},
	}
	if rt.bwrap {
		// The kernel is shared as under crun and runc; the mechanisms
		// differ (bwrap_linux.go, docs/SECURITY.md).
		bw := map[string]string{
			sandbox.ProtNetwork:    "bwrap --unshare-net: new network namespace without interfaces but lo",
			sandbox.ProtReadonly:   "the image bind-mounted read-only as / (--ro-bind)",
			sandbox.ProtTmp:        "host tmpfs bind-mounted (bwrap's own tmpfs has no noexec); its flags are locked in the user namespace",
			sandbox.ProtUser:       "bwrap runs as a host uid/gid leased per sandbox (uidpool); its user namespace maps only that uid",
			sandbox.ProtCaps:       "--cap-drop ALL; no capability in the sandbox's user namespace",
			sandbox.ProtNoNewPrivs: "bwrap sets PR_SET_NO_NEW_PRIVS",
			sandbox.ProtSeccomp:    "our profile compiled once to BPF (sandbox.CompileSeccomp), loaded by bwrap --seccomp; ENOSYS default",
			sandbox.ProtNamespaces: "user, pid, ipc, uts, mount, net and cgroup namespaces (bwrap --unshare-*)",
			sandbox.ProtMasked:     "/dev/null or an empty read-only tmpfs over the masked paths, /sys not mounted; /proc/sys owned by the unmapped host root",
			sandbox.ProtEnv:        "fixed environment (its PWD is the working directory, which bwrap sets); descriptors above 2 marked close-on-exec before bwrap starts",
			sandbox.ProtFileSize:   "RLIMIT_FSIZE set with prlimit(2) while bwrap waits (--userns-block-fd)",
			sandbox.ProtTimeout:    how.kill + ", which includes bwrap's pid 1; --die-with-parent",
			sandbox.ProtInit:       "bwrap's own pid 1 (reaps zombies, passes the exit status on)",
			sandbox.ProtCleanup:    "bundle and cgroups removed; Reap after a crash",
		}
		ps = sandbox.Overlay(ps, bw)
	}
	if rt.gvisor {
		ps = sandbox.Overlay(ps, map[string]string{
			sandbox.ProtKernelIsol: "runsc, ptrace platform",
			sandbox.ProtTmp:        "host tmpfs bind-mounted through the gofer (gVisor's own tmpfs ignores noexec for mmap)",
			sandbox.ProtSeccomp:    "applied inside gVisor (--oci-seccomp)",
			sandbox.ProtPids:       "RLIMIT_NPROC inside gVisor (per sandbox kernel); host " + how.pids + " as a backstop",
			sandbox.ProtMemory:     how.memory + ", on the whole gVisor sandbox: over it the sandbox is killed, not one process",
			sandbox.ProtMasked:     "gVisor's synthetic /proc; /sys not mounted",
		})
	}
	return ps
}

// validID accepts ids usable as a container id and a path element.
func validID(id string) bool {
	if id == "" || len(id) > 128 || id[0] == '.' || id[0] == '-' {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// resolveImage is the real directory of an image root: a versioned image
// directory's rootfs is a link to its current version (see package
// image), which runc refuses as a root and which templates must not
// cache, since a rebuild switches it. The sandbox then keeps the version
// it started on, whatever happens to the link. A path that does not
// resolve is returned as it is, for checkImage to report.
func resolveImage(dir string) string {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		return real
	}
	return dir
}

// checkImage validates a language's root filesystem once: it must exist and
// carry the code mount point, so the runtime never writes into the shared
// image.
func (d *Driver) checkImage(dir string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err, ok := d.images[dir]; ok {
		return err
	}
	err := func() error {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("image %q: not an absolute root filesystem path", dir)
		}
		for _, p := range []string{"", "tmp", strings.TrimPrefix(engine.CodeDir, "/")} {
			fi, err := os.Stat(filepath.Join(dir, p))
			if err != nil || !fi.IsDir() {
				if p == strings.TrimPrefix(engine.CodeDir, "/") && err != nil && errors.Is(err, os.ErrNotExist) {
					// Older images lack the mount point; adding an empty
					// directory is the one change we make to an image.
					if merr := os.Mkdir(filepath.Join(dir, p), 0o755); merr == nil {
						continue
					}
				}
				return fmt.Errorf("image %q: missing directory /%s", dir, p)
			}
		}
		// The sandbox's own deadline runs the image's timeout(1); Lstat:
		// a link in the image must not be followed on the host.
		if fi, err := os.Lstat(filepath.Join(dir, timeoutPath)); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("image %q: no %s (coreutils), which every sandbox's own deadline runs", dir, timeoutPath)
		}
		return nil
	}()
	d.images[dir] = err
	return err
}
