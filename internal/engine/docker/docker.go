// Package docker runs each execution as a hardened container through the
// Docker Engine API (the official Go client, never the docker CLI).
//
// One Run is one container: created with the sandbox policy (no network,
// read-only root, a small noexec /tmp, a host uid of its own, no capabilities, our
// seccomp profile, cgroup limits), attached before it starts, waited for
// with the execution's timeout, and force-removed whatever happens. Every
// container carries labels naming this driver instance, so Reap can remove
// what a crashed process left behind.
package docker

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
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// Labels put on every container. Reap finds ours by labelSandbox and
// tells a live owner from a dead one by the lock file in labelOwner.
const (
	labelSandbox   = "vertal.sandbox"   // "1"
	labelInstance  = "vertal.instance"  // the owning driver's instance token
	labelOwner     = "vertal.owner"     // the owning driver's lock file
	labelExecution = "vertal.execution" // engine.Spec.ID
	labelPID       = "vertal.pid"       // the owning server's process ID
)

// Defaults.
const (
	// DefaultImage is the image a language without one runs in: the
	// sandbox root filesystem imported by scripts/dockerd.sh.
	DefaultImage = "vertal/default:latest"
	// DefaultStateDir is on tmpfs: code files are small and short-lived,
	// and a reboot (which also ends every container) clears it.
	DefaultStateDir = "/run/vertal/docker"
)

const lockSuffix = ".lock"

// Options configure the driver. Zero values pick the defaults.
type Options struct {
	// Runtime is the Docker runtime: "runc" (Docker's default) or "runsc"
	// for gVisor, as registered in /etc/docker/daemon.json.
	Runtime string
	// StateDir holds this driver's lock and per-execution code
	// directories, bind-mounted read-only at engine.CodeDir; it must be on
	// the Docker engine's host. Default DefaultStateDir.
	StateDir string
	// Host is the Docker Engine address (e.g. unix:///var/run/docker.sock).
	// Empty means DOCKER_HOST, else the default socket.
	Host string
	// Image runs languages whose Language.Image is empty. Default
	// DefaultImage.
	Image string
	// Logger receives cleanup failures; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// UIDs leases each sandbox a host uid of its own. Default: the
	// host-wide pool every driver shares (uidpool.DefaultDir).
	UIDs *uidpool.Pool
}

// Driver runs sandboxes with the Docker Engine. It is safe for concurrent
// use.
//
// Each Driver is an instance with a random token, holding a lock file
// StateDir/<token>.lock for its lifetime; its code directories live in
// StateDir/<token>/. Reap on any driver removes what instances whose lock
// is no longer held (crashed, killed) left behind, and never touches a
// live instance's sandboxes, so servers and test binaries can share one
// Docker engine.
type Driver struct {
	opts     Options
	cli      *client.Client
	log      *slog.Logger
	acct     *accounting // nil when cgroup accounting is unavailable
	uids     *uidpool.Pool
	policy   policy
	gvisor   bool
	instance string   // random token
	lock     *os.File // StateDir/<instance>.lock, flocked

	mu       sync.Mutex
	inFlight map[string]bool // execution IDs this process is running
}

// New connects to the Docker Engine, checks that the runtime is registered
// and the default image exists, and returns a driver. Errors that an
// operator can fix wrap engine.ErrUnavailable and say what to do.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Runtime == "" {
		opts.Runtime = "runc"
	}
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir
	}
	dir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("docker: state directory: %w", err)
	}
	opts.StateDir = dir
	if opts.Image == "" {
		opts.Image = DefaultImage
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}

	copts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if opts.Host != "" {
		copts = append(copts, client.WithHost(opts.Host))
	}
	cli, err := client.NewClientWithOpts(copts...)
	if err != nil {
		return nil, fmt.Errorf("%w: docker client: %v", engine.ErrUnavailable, err)
	}
	d, err := newDriver(ctx, cli, opts, log)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return d, nil
}

func newDriver(ctx context.Context, cli *client.Client, opts Options, log *slog.Logger) (*Driver, error) {
	// Info answers the ping, negotiates the API version once for every
	// later call, and lists runtimes and the cgroup setup in one round trip.
	info, err := cli.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot reach the Docker engine at %s (%v): install docker.io and start dockerd (scripts/dockerd.sh does both)",
			engine.ErrUnavailable, cli.DaemonHost(), err)
	}
	rt, ok := info.Runtimes[opts.Runtime]
	if !ok {
		names := make([]string, 0, len(info.Runtimes))
		for n := range info.Runtimes {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%w: the Docker engine has no runtime %q (it has %s): install it (apt-get install runsc) and register it in /etc/docker/daemon.json (scripts/dockerd.sh does both)",
			engine.ErrUnavailable, opts.Runtime, strings.Join(names, ", "))
	}
	gvisor := isGVisor(opts.Runtime, rt.Path)
	if gvisor && !slices.Contains(rt.Args, "--oci-seccomp") {
		// Without it runsc ignores the container's seccomp profile: a
		// protection would be dropped silently.
		return nil, fmt.Errorf("%w: the Docker runtime %q runs gVisor without --oci-seccomp, so our seccomp profile would not apply: add \"--oci-seccomp\" (and \"--network=none\") to its runtimeArgs in /etc/docker/daemon.json (scripts/dockerd.sh does)",
			engine.ErrUnavailable, opts.Runtime)
	}
	if _, err := cli.ImageInspect(ctx, opts.Image); err != nil {
		return nil, fmt.Errorf("%w: the Docker engine has no image %s (%v): build the root filesystem (vertal image build) and import it (scripts/dockerd.sh)",
			engine.ErrUnavailable, opts.Image, err)
	}
	policyRuntime := "runc"
	if gvisor {
		policyRuntime = "runsc"
	}
	pol, err := newPolicy(policyRuntime)
	if err != nil {
		return nil, fmt.Errorf("docker: sandbox policy: %w", err)
	}
	if opts.UIDs == nil {
		// The uids must be the Docker engine's host's: it is this one
		// whenever the engine's socket is local, as the code directories'
		// bind mounts already require.
		if opts.UIDs, err = uidpool.New("", 0, 0); err != nil {
			return nil, fmt.Errorf("%w: docker: %w", engine.ErrUnavailable, err)
		}
	}
	d := &Driver{
		opts:     opts,
		cli:      cli,
		log:      log,
		policy:   pol,
		gvisor:   gvisor,
		uids:     opts.UIDs,
		inFlight: make(map[string]bool),
	}
	if err := d.claimInstance(); err != nil {
		return nil, fmt.Errorf("%w: docker: %w", engine.ErrUnavailable, err)
	}
	// Usage comes from a per-execution parent cgroup that outlives the
	// container; that needs the engine's cgroups on this host.
	if strings.HasPrefix(cli.DaemonHost(), "unix://") {
		d.acct = newAccounting(info.CgroupVersion, info.CgroupDriver)
	}
	return d, nil
}

// isGVisor reports whether a Docker runtime is runsc, by name or binary.
func isGVisor(name, path string) bool {
	return name == "runsc" || filepath.Base(path) == "runsc"
}

// claimInstance creates and locks this driver's lock file, then its
// directory. The lock exists before the directory, so Reap never takes a
// starting driver for a dead one.
func (d *Driver) claimInstance() error {
	if err := os.MkdirAll(d.opts.StateDir, 0o711); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	var tok [6]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("instance token: %w", err)
	}
	name := hex.EncodeToString(tok[:])
	lock, err := os.OpenFile(filepath.Join(d.opts.StateDir, name+lockSuffix), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("creating instance lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		os.Remove(lock.Name())
		return fmt.Errorf("locking instance: %w", err)
	}
	// 0711: the engine's runtime must traverse it to bind-mount code
	// directories; nobody may list it.
	if err := os.Mkdir(filepath.Join(d.opts.StateDir, name), 0o711); err != nil {
		lock.Close()
		os.Remove(lock.Name())
		return fmt.Errorf("creating instance directory: %w", err)
	}
	d.instance, d.lock = name, lock
	return nil
}

var _ engine.Driver = (*Driver)(nil)

// Name identifies driver and runtime, e.g. "docker/runsc".
func (d *Driver) Name() string { return "docker/" + d.opts.Runtime }

// Close removes the driver's instance directory and lock and closes the
// connection to the Docker Engine. No Run may be in flight.
func (d *Driver) Close() error {
	var errs []error
	if d.lock != nil {
		errs = append(errs, removeInstanceDir(filepath.Join(d.opts.StateDir, d.instance)), os.Remove(d.lock.Name()))
		d.lock.Close()
		d.lock = nil
	}
	errs = append(errs, d.cli.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("docker: closing: %w", err)
	}
	return nil
}

func (d *Driver) lockPath() string {
	return filepath.Join(d.opts.StateDir, d.instance+lockSuffix)
}

// codeDir is the host directory holding one execution's code file.
func (d *Driver) codeDir(id string) string {
	return filepath.Join(d.opts.StateDir, d.instance, id)
}

func (d *Driver) begin(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[id] {
		return fmt.Errorf("docker: execution %s is already running", id)
	}
	d.inFlight[id] = true
	return nil
}

func (d *Driver) end(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.inFlight, id)
}

func (d *Driver) running(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inFlight[id]
}

// errNotFound reports whether err says the object is already gone, which
// cleanup treats as success.
func errNotFound(err error) bool {
	return err != nil && (cerrdefs.IsNotFound(err) || errors.Is(err, os.ErrNotExist))
}
