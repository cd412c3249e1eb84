package oci

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// A live sandbox (engine.Starter) is a held sandbox like a warm one, on
// the cold path's spec (Driver.spec) with three changes: its program is
// the agent (LiveSpec.Agent, mounted read-only at engine.AgentPath) under
// the sandbox's own deadline (and the cold path's init, see liveSpec);
// /code is not mounted; and its home, engine.HomeDir, is a host tmpfs of
// LiveSpec.HomeBytes owned by the sandbox's uid, mode 0700, noexec,
// nosuid and nodev like /tmp, which is also its working directory and
// HOME. With LiveSpec.EgressDir, that host directory is bind-mounted
// read-only, nosuid, nodev and noexec at engine.EgressDir (hostBind, then
// the spec's bind of it), and runsc may connect to the host's unix socket
// there (--host-uds=open). Everything else (walls, cgroup limits, cleanup,
// Reap) is the cold path's.

var _ engine.Starter = (*Driver)(nil)

// liveStderrBytes bounds what a live sandbox's stderr may put in the log;
// the rest is read and dropped.
const liveStderrBytes = 64 << 10

// Start starts a live sandbox and returns once its agent runs.
func (d *Driver) Start(ctx context.Context, ls engine.LiveSpec) (_ engine.Live, err error) {
	if err := ls.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if !validID(ls.ID) {
		return nil, fmt.Errorf("oci: invalid sandbox id %q", ls.ID)
	}
	if ls.HomeBytes <= 0 {
		return nil, fmt.Errorf("oci: sandbox %s: HomeBytes is not set", ls.ID)
	}
	if ls.Deadline.IsZero() {
		return nil, fmt.Errorf("oci: sandbox %s: Deadline is not set", ls.ID)
	}
	if ls.EgressDir != "" {
		if err := checkEgressDir(ls.EgressDir); err != nil {
			return nil, fmt.Errorf("oci: sandbox %s: %w", ls.ID, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	image := resolveImage(ls.Image)
	if err := d.checkImage(image); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if err := agentMountPoints(image); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	agent, err := d.agentCopy(ls.Agent)
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	spec, err := d.liveSpec(image, ls, agent)
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	var plan *bwrapPlan
	if d.rt.bwrap {
		if plan, err = d.bwrapPlanOf(spec, engine.Language{Name: "live", Image: image}); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}

	h, err := d.newHeld(ls.ID)
	if err != nil {
		return nil, err
	}
	h.agentChannel = true
	h.hostUDS = ls.EgressDir != ""
	s := &liveSandbox{held: h, started: time.Now()}
	s.beforeCleanup = s.snapshot
	defer func() {
		if err != nil {
			_ = s.Discard(context.Background())
		}
	}()
	uid := s.uid.UID
	if err := d.hostTmpfsMounts(s.bundle, ls.Limits); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	home := fmt.Sprintf("mode=0700,uid=%d,gid=%d", uid, uid)
	if err := hostTmpfs(filepath.Join(s.bundle, "home"), home, ls.HomeBytes); err != nil {
		return nil, fmt.Errorf("oci: home: %w", err)
	}
	if ls.EgressDir != "" {
		if err := hostBind(ls.EgressDir, filepath.Join(s.bundle, egressSource)); err != nil {
			return nil, fmt.Errorf("oci: egress: %w", err)
		}
	}
	if plan == nil {
		spec.Process.User = specs.User{UID: uid, GID: uid}
		b, err := json.Marshal(spec)
		if err != nil {
			return nil, fmt.Errorf("oci: encoding config.json: %w", err)
		}
		if err := os.WriteFile(filepath.Join(s.bundle, "config.json"), b, 0o600); err != nil {
			return nil, fmt.Errorf("oci: writing config.json: %w", err)
		}
	} else if err := openBundleTo(s.bundle, uid); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if s.cg, err = d.cg.create(s.id, d.cgLimitsFor(ls.Limits)); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if plan != nil {
		rp := plan.render(s.bundle, uid, nil, nil)
		rp.agentChannel = true
		err = s.startBwrap(ctx, rp)
	} else {
		err = s.start()
		if err == nil {
			err = s.waitCreated(ctx)
		}
	}
	if err != nil {
		return nil, err
	}
	s.conn = &liveConn{w: s.stdin, r: s.stdout}
	go s.logStderr()
	s.done = make(chan struct{})
	go s.watch()
	return s, nil
}

// liveSpec is the cold path's spec changed for a live sandbox (see the
// top of this file); the uid is still uidPlaceholder.
func (d *Driver) liveSpec(image string, ls engine.LiveSpec, agent string) (*specs.Spec, error) {
	// The language only names the image: the command is replaced.
	s, err := d.spec(engine.Language{Name: "live", Image: image, File: "agent", Command: []string{engine.AgentPath}}, ls.Limits, ls.ID)
	if err != nil {
		return nil, err
	}
	argv := []string{engine.AgentPath, "serve", "--deadline", strconv.FormatInt(ls.Deadline.Unix(), 10)}
	if d.rt.proxiesStdio {
		argv = append(argv, "--fd", "3") // the agent's socket (held.start)
	}
	// Under the OCI runtimes the cold path's init stays pid 1 (bwrap's
	// own pid 1 stands for it): timeout(1) as pid 1 would reap only the
	// agent, and every orphan of a command would stay a zombie, holding
	// a pid of the sandbox's limit.
	keep := 2
	if d.rt.bwrap {
		keep = 0
	}
	s.Process.Args = append(s.Process.Args[:keep:keep], sandbox.DeadlineArgv(timeoutPath, ls.Limits.Lifetime, argv)...)
	s.Process.Cwd = engine.HomeDir
	s.Process.Env = sandbox.LiveEnvFor(ls.Limits)
	// No /code: commands run in the home.
	s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == engine.CodeDir })
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: engine.HomeDir, Type: "bind", Source: "home", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		agentMount(agent),
	)
	if ls.EgressDir != "" {
		s.Mounts = append(s.Mounts, egressMount())
	}
	return s, nil
}

// agentMountPoints makes sure the image has the mount points of a
// sandbox with the agent (a live one, or a one-shot one with egress), an
// empty HomeDir and EgressDir and an empty file at AgentPath, as
// checkImage adds CodeDir: a runtime must never create them in the
// shared image (nor can it, under a read-only root). Lstat: a link in
// the image is not followed on the host.
func agentMountPoints(image string) error {
	for _, p := range []string{engine.HomeDir, engine.EgressDir} {
		dir := filepath.Join(image, p)
		if fi, err := os.Lstat(dir); err != nil {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("image %q: adding %s: %w", image, p, err)
			}
		} else if !fi.IsDir() {
			return fmt.Errorf("image %q: %s is not a directory", image, p)
		}
	}
	agent := filepath.Join(image, engine.AgentPath)
	if fi, err := os.Lstat(agent); err != nil {
		if err := os.MkdirAll(filepath.Dir(agent), 0o755); err != nil {
			return fmt.Errorf("image %q: adding %s: %w", image, filepath.Dir(engine.AgentPath), err)
		}
		f, err := os.OpenFile(agent, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("image %q: adding %s: %w", image, engine.AgentPath, err)
		}
		if f != nil {
			f.Close()
		}
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("image %q: %s is not a regular file", image, engine.AgentPath)
	}
	return nil
}

// agentCopy is the driver's own copy of the agent binary at path, made
// once per content in the instance directory (world-readable, so bwrap,
// as the sandbox's uid, can mount it): a sandbox never sees a file the
// host may change, and the source may be anywhere root can read. The
// copy is found again by the source's identity (agentSource), so that
// every one-shot execution with egress costs a stat, not a read and a
// hash of a binary of megabytes.
func (d *Driver) agentCopy(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("agent %q: not an absolute path", path)
	}
	// The identity before the content: a change in between makes the
	// next call hash again, never keeps an old copy for new content.
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	src := agentSource{path: path, dev: uint64(st.Dev), ino: uint64(st.Ino), size: int64(st.Size), mtime: st.Mtim, ctime: st.Ctim}
	d.mu.Lock()
	dst, ok := d.agents[src]
	d.mu.Unlock()
	if ok {
		if _, err := os.Stat(dst); err == nil {
			return dst, nil
		}
	}
	dst, err := d.copyAgent(path)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	if d.agents == nil || len(d.agents) > 16 {
		d.agents = map[agentSource]string{}
	}
	d.agents[src] = dst
	d.mu.Unlock()
	return dst, nil
}

// agentSource is what says that the agent binary at path is still the
// one agentCopy copied.
type agentSource struct {
	path         string
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

// copyAgent copies the agent at path into the instance directory, named
// by its content, unless a copy is there already.
func (d *Driver) copyAgent(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	sum := sha256.Sum256(b)
	dir := filepath.Join(d.instance, "agents")
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("agent: %w", err)
	}
	dst := filepath.Join(dir, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	tmp, err := os.CreateTemp(dir, ".tmp")
	if err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("agent: %w", err)
	}
	return dst, nil
}

// waitCreated returns once the runtime wrote the pid file (the sandbox
// exists and its process runs), or with the runtime's error if it ended
// first.
func (s *held) waitCreated(ctx context.Context) error {
	pidFile := filepath.Join(s.bundle, "init.pid")
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(pidFile); err == nil {
			return nil
		}
		select {
		case <-s.cmd.done:
			if _, err := os.Stat(pidFile); err == nil {
				return nil // it ran and ended already: Done tells
			}
			return fmt.Errorf("oci: starting sandbox %s%s", s.id, s.failure())
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// liveSandbox is one started sandbox that stays.
type liveSandbox struct {
	*held
	started time.Time
	ended   atomic.Int64 // unix nanoseconds the processes ended; 0 while they run
	conn    *liveConn
	done    chan struct{} // closed by watch

	mu    sync.Mutex
	final *engine.Usage // the usage at Discard, once the cgroup is going
}

func (s *liveSandbox) Conn() io.ReadWriteCloser { return s.conn }

// Done is closed once every process of the sandbox has ended.
func (s *liveSandbox) Done() <-chan struct{} { return s.done }

// watch closes done when the runtime process has ended and the cgroup is
// empty. bwrap's monitor can exit before its pid 1, which then ends the
// rest of the pid namespace: what is left then is killed, as it would
// be by Discard, and waited for (a bounded time: a process stuck in the
// kernel is Discard's to report).
func (s *liveSandbox) watch() {
	<-s.cmd.done
	for i := 0; i < 1000 && len(s.d.cg.procs(s.id)) > 0; i++ {
		if i == 0 {
			s.d.cg.kill(s.id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.ended.Store(time.Now().UnixNano())
	close(s.done)
}

func (s *liveSandbox) Usage() engine.Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final != nil {
		return *s.final
	}
	return s.usage()
}

// usage reads the cgroup; s.mu is held.
func (s *liveSandbox) usage() engine.Usage {
	end := time.Now()
	if n := s.ended.Load(); n != 0 {
		end = time.Unix(0, n)
	}
	cpu, peak := s.cg.usage()
	return engine.Usage{SandboxSeconds: end.Sub(s.started).Seconds(), CPUSeconds: cpu, PeakMemoryBytes: peak}
}

func (s *liveSandbox) MemoryBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final != nil || s.cg == nil {
		return 0
	}
	return s.cg.memoryCurrent()
}

// snapshot keeps the usage before Discard removes the cgroup.
func (s *liveSandbox) snapshot() {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := engine.Usage{}
	if s.cg != nil {
		u = s.usage()
		if n := s.ended.Load(); n == 0 {
			u.SandboxSeconds = time.Since(s.started).Seconds()
		}
	}
	s.final = &u
}

// logStderr passes the agent's stderr to the driver's log, line by line,
// up to liveStderrBytes; the rest is read and dropped so the agent never
// blocks on it.
func (s *liveSandbox) logStderr() {
	r := bufio.NewReaderSize(s.stderr, 4096)
	logged, dropped := 0, 0
	for {
		line, err := r.ReadSlice('\n')
		if len(line) > 0 {
			if logged < liveStderrBytes {
				logged += len(line)
				s.d.log.Warn("oci: live sandbox stderr", "id", s.id, "line", strings.TrimRight(string(line), "\n"))
			} else {
				dropped += len(line)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	if dropped > 0 {
		s.d.log.Warn("oci: live sandbox stderr over the log's cap, dropped", "id", s.id, "bytes", dropped)
	}
}

// liveConn is the agent's socket (stdio.openAgent: stdin and stdout are
// one file) as a connection.
type liveConn struct {
	w, r *os.File
	once sync.Once
}

func (c *liveConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *liveConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// Close ends the agent's input (it then ends every process and exits)
// and this side's reads.
func (c *liveConn) Close() error {
	c.once.Do(func() {
		c.w.Close()
		_ = c.r.SetReadDeadline(time.Now())
	})
	return nil
}
