package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/pkg/stdcopy"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

var _ engine.Starter = (*Driver)(nil)

// Start creates and starts a sandbox that stays: a container with the
// walls of an execution's (walls), whose one process is the agent,
// bind-mounted read-only at engine.AgentPath and run under the sandbox's
// own deadline (sandbox.DeadlineArgv with Limits.Lifetime) as the
// sandbox's uid. Its connection is a unix socket under runc (listen),
// the container's attached stdin and stdout under runsc. The home
// (engine.HomeDir) is a tmpfs of HomeBytes owned by that uid; nothing of
// the host's but the agent is mounted. The container carries the driver's
// labels and is marked running until Discard, so Reap leaves it alone
// while the driver lives and removes it after a crash. With
// spec.EgressDir, that directory is mounted read-only, nosuid, nodev and
// noexec at engine.EgressDir (bindEgress); under runsc, Docker's runtime
// arguments let the sandbox connect to a host socket there
// (scripts/dockerd.sh, --host-uds=open).
func (d *Driver) Start(ctx context.Context, spec engine.LiveSpec) (_ engine.Live, err error) {
	if !validID(spec.ID) {
		return nil, fmt.Errorf("docker: invalid sandbox id %q", spec.ID)
	}
	if err := spec.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("docker: sandbox %s: %w", spec.ID, err)
	}
	if spec.HomeBytes <= 0 {
		return nil, fmt.Errorf("docker: sandbox %s: no home size", spec.ID)
	}
	if spec.Deadline.IsZero() {
		return nil, fmt.Errorf("docker: sandbox %s: no deadline", spec.ID)
	}
	if err := checkAgent(spec.Agent); err != nil {
		return nil, fmt.Errorf("docker: sandbox %s: %w", spec.ID, err)
	}
	if spec.EgressDir != "" {
		if err := checkEgressDir(spec.EgressDir); err != nil {
			return nil, fmt.Errorf("docker: sandbox %s: %w", spec.ID, err)
		}
	}
	if err := d.begin(spec.ID); err != nil {
		return nil, err
	}
	l := &liveContainer{d: d, id: spec.ID, name: containerName(d.instance, spec.ID)}
	defer func() {
		if err != nil {
			_ = l.Discard(context.Background())
		}
	}()
	// The uid is the sandbox's until Discard.
	if l.uid, err = d.uids.Acquire(); err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	if d.acct != nil {
		if l.oom, err = d.acct.limitParent(d.instance, spec.ID, spec.Limits.MemoryBytes); err != nil {
			return nil, fmt.Errorf("docker: %w", err)
		}
	}
	sock := ""
	if !d.gvisor {
		if sock, err = l.listen(); err != nil {
			return nil, err
		}
	}
	if spec.EgressDir != "" {
		if err := l.bindEgress(spec.EgressDir); err != nil {
			return nil, err
		}
	}
	cfg, host := d.liveConfig(spec, os.Getpid(), l.uid.UID, sock)
	if err := d.createAttached(ctx, cfg, host, l.name, &l.attachedContainer); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	l.conn = &liveConn{att: l.att, r: pr}
	stderr := &logWriter{log: d.log, id: spec.ID, max: liveStderrBytes}
	go func() {
		// Once the connection is closed, what the agent still writes is
		// read and dropped, so that it never blocks on a full pipe.
		_, err := stdcopy.StdCopy(dropClosed{pw}, stderr, l.att.Reader)
		stderr.flush()
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	l.started = d.opts.Now()
	if err := d.cli.ContainerStart(ctx, l.cid, container.StartOptions{}); err != nil {
		return nil, fmt.Errorf("docker: starting container: %w", err)
	}
	if l.ln != nil {
		conn, err := l.accept(ctx)
		if err != nil {
			return nil, err
		}
		// The attached stdin and stdout carry nothing now: stdin is at
		// its end, and what reaches stdout is dropped.
		_ = l.att.CloseWrite()
		pr.Close()
		l.conn = &sockConn{UnixConn: conn}
	}
	return l, nil
}

// agentSocket is where a live sandbox's agent finds the host's socket
// (its --connect) under runc.
const agentSocket = "/.vertal/agent.sock"

// listen makes the host's end of the agent's channel under runc: a unix
// socket in the sandbox's state directory, only for its uid, bind-mounted
// at agentSocket. The container's attached stdio stays for stderr: its
// pipes are held by the container's init and timeout too, which code of
// the same uid opens through /proc, and a socket never opens there
// (docs/SANDBOXES.md, "The agent's channel"). gVisor does not connect to
// host sockets by default (--host-uds): under runsc the channel stays the
// attached stdio.
func (l *liveContainer) listen() (string, error) {
	l.dir = l.d.codeDir(l.id)
	if err := os.Mkdir(l.dir, 0o711); err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	path := filepath.Join(l.dir, "agent.sock")
	// Bound through the directory's descriptor: a socket's path may hold
	// at most 107 bytes, and a state directory may be deeper than that.
	dir, err := os.Open(l.dir)
	if err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/agent.sock", dir.Fd()), Net: "unix"})
	dir.Close()
	if err != nil {
		return "", fmt.Errorf("docker: agent socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // its name went with the descriptor; Discard removes l.dir
	l.ln = ln
	uid := int(l.uid.UID)
	if err := os.Chown(path, uid, uid); err != nil {
		return "", fmt.Errorf("docker: agent socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return "", fmt.Errorf("docker: agent socket: %w", err)
	}
	return path, nil
}

// bindEgress binds the host directory src into the sandbox's state
// directory (made here under runsc), read-only, nosuid, nodev and noexec
// (bindInto).
func (l *liveContainer) bindEgress(src string) error {
	if l.dir == "" {
		l.dir = l.d.codeDir(l.id)
		if err := os.Mkdir(l.dir, 0o711); err != nil {
			return fmt.Errorf("docker: %w", err)
		}
	}
	if err := bindInto(src, filepath.Join(l.dir, egressSource), false); err != nil {
		return fmt.Errorf("docker: egress: %w", err)
	}
	return nil
}

// agentConnectTimeout bounds how long a started container's agent may
// take to connect.
const agentConnectTimeout = 30 * time.Second

// accept takes the agent's one connection, closes the listener and
// removes its file: nothing runs in the sandbox before the agent, and
// nothing can connect after it. The peer must have the sandbox's uid.
func (l *liveContainer) accept(ctx context.Context) (*net.UnixConn, error) {
	type result struct {
		c   *net.UnixConn
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := l.ln.AcceptUnix()
		got <- result{c, err}
	}()
	timer := time.NewTimer(agentConnectTimeout)
	defer timer.Stop()
	var err error
	select {
	case r := <-got:
		l.ln.Close()
		os.Remove(filepath.Join(l.dir, "agent.sock"))
		if r.err != nil {
			return nil, fmt.Errorf("docker: agent socket: %w", r.err)
		}
		if err := checkPeer(r.c, l.uid.UID); err != nil {
			r.c.Close()
			return nil, err
		}
		return r.c, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-l.done:
		err = fmt.Errorf("docker: sandbox %s ended before its agent connected (exit %d)", l.id, l.exitCode)
	case <-timer.C:
		err = fmt.Errorf("docker: sandbox %s: the agent did not connect within %v", l.id, agentConnectTimeout)
	}
	l.ln.Close()
	if r := <-got; r.c != nil {
		r.c.Close()
	}
	return nil, err
}

// checkPeer refuses a connection from any uid but the sandbox's.
func checkPeer(c *net.UnixConn, uid uint32) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("docker: agent socket: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return fmt.Errorf("docker: agent socket: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("docker: agent socket: %w", cerr)
	}
	if cred.Uid != uid {
		return fmt.Errorf("docker: agent socket: a peer with uid %d, not the sandbox's %d", cred.Uid, uid)
	}
	return nil
}

// liveStderrBytes bounds what of a live sandbox's stderr reaches the log.
const liveStderrBytes = 64 << 10

// liveConfig is the container of a live sandbox: the walls, the agent as
// its command, the home tmpfs and the agent's bind mount.
// sock, when set, is the host's socket for the agent (listen).
func (d *Driver) liveConfig(spec engine.LiveSpec, pid int, uid uint32, sock string) (*container.Config, *container.HostConfig) {
	cfg, host := d.walls(spec.ID, spec.Image, spec.Limits, pid, uid)
	agent := []string{engine.AgentPath, "serve", "--deadline", strconv.FormatInt(spec.Deadline.Unix(), 10)}
	if sock != "" {
		agent = append(agent, "--connect", agentSocket)
	}
	cfg.Cmd = sandbox.DeadlineArgv("timeout", spec.Limits.Lifetime, agent)
	cfg.Env = sandbox.LiveEnvFor(spec.Limits)
	cfg.WorkingDir = engine.HomeDir
	host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeBind, Source: spec.Agent, Target: engine.AgentPath, ReadOnly: true})
	if sock != "" {
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeBind, Source: sock, Target: agentSocket, ReadOnly: true})
	}
	if spec.EgressDir != "" {
		// bindEgress's mount, already read-only, nosuid, nodev and
		// noexec (see egress.go).
		host.Mounts = append(host.Mounts, d.stateBind(spec.ID, egressSource, engine.EgressDir))
	}
	d.addTmpfs(cfg, host, engine.HomeDir, homeOptions(spec.HomeBytes, uid))
	if n := len(host.Mounts); d.gvisor && host.Mounts[n-1].Target == engine.HomeDir {
		// The image's directory there (if any) is neither copied into the
		// volume nor lends it its owner: the home is the sandbox uid's.
		host.Mounts[n-1].VolumeOptions.NoCopy = true
	}
	return cfg, host
}

// homeOptions are the home tmpfs's mount options in Docker's form: /tmp's
// (noexec, nosuid, nodev), but owned by the sandbox's uid and closed to
// every other.
func homeOptions(size int64, uid uint32) string {
	u := strconv.FormatUint(uint64(uid), 10)
	return strings.Join([]string{"rw", "noexec", "nosuid", "nodev", "mode=0700", "uid=" + u, "gid=" + u, "size=" + strconv.FormatInt(size, 10)}, ",")
}

// liveContainer is one started sandbox that stays.
type liveContainer struct {
	d    *Driver
	id   string // the sandbox's id: labels, parent cgroup
	name string
	uid  *uidpool.Lease
	oom  *sandbox.OOMWatch // the parent's OOM notification (cgroup v1)

	attachedContainer
	conn io.ReadWriteCloser // liveConn, or sockConn under runc
	ln   *net.UnixListener  // until the agent connected (listen)
	dir  string             // the state directory (socket, egress mount), removed by Discard

	started time.Time
	mu      sync.Mutex
	final   *engine.Usage // once Discard removed the cgroup

	discard sync.Once
	discErr error
}

func (l *liveContainer) Conn() io.ReadWriteCloser { return l.conn }
func (l *liveContainer) Done() <-chan struct{}    { return l.done }

// Usage reads the sandbox's parent cgroup, which outlives its container
// until Discard; SandboxSeconds run from Start to the exit.
func (l *liveContainer) Usage() engine.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.final != nil {
		return *l.final
	}
	return l.usage()
}

// usage reads the cgroup; SandboxSeconds end at the exit, or now.
func (l *liveContainer) usage() engine.Usage {
	end := l.d.opts.Now()
	select {
	case <-l.done:
		end = l.exitedAt
	default:
	}
	var u engine.Usage
	if !l.started.IsZero() {
		u.SandboxSeconds = end.Sub(l.started).Seconds()
	}
	if l.d.acct != nil {
		u.CPUSeconds, u.PeakMemoryBytes = l.d.acct.usage(l.d.instance, l.id)
	}
	return u
}

// MemoryBytes is the parent cgroup's current usage.
func (l *liveContainer) MemoryBytes() int64 {
	l.mu.Lock()
	gone := l.final != nil
	l.mu.Unlock()
	if gone || l.d.acct == nil {
		return 0
	}
	return l.d.acct.memory(l.d.instance, l.id)
}

// Discard force-removes the container (killing every process in it) and
// then its parent cgroup, and gives the uid back.
func (l *liveContainer) Discard(ctx context.Context) error {
	l.discard.Do(func() {
		d := l.d
		defer l.oom.Close()
		var errs []error
		ref := l.cid
		if ref == "" {
			ref = l.name
		}
		removed := false
		if err := d.forceRemove(ref); err != nil {
			errs = append(errs, err)
		} else {
			removed = true
		}
		if l.att != nil {
			l.att.Close()
		}
		if l.conn != nil {
			l.conn.Close()
		}
		if l.ln != nil {
			l.ln.Close()
		}
		if l.dir != "" {
			if err := unmountEgress(l.dir); err != nil {
				errs = append(errs, err)
			} else if err := os.RemoveAll(l.dir); err != nil {
				errs = append(errs, fmt.Errorf("docker: %w", err))
			}
		}
		if l.stopWait != nil {
			l.stopWait()
		}
		l.mu.Lock()
		u := l.usage()
		l.final = &u
		l.mu.Unlock()
		// The parent goes once the container's own cgroup in it is gone.
		if d.acct != nil && removed {
			if err := d.acct.remove(d.instance, l.id); err != nil {
				errs = append(errs, fmt.Errorf("docker: %w", err))
			}
		}
		if len(errs) == 0 {
			l.uid.Release()
		} else {
			l.uid.Abandon()
		}
		d.end(l.id)
		l.discErr = errors.Join(errs...)
	})
	return l.discErr
}

// liveConn is the agent's transport: writes go to the container's stdin,
// reads come from its demultiplexed stdout.
type liveConn struct {
	att  *types.HijackedResponse
	r    *io.PipeReader
	once sync.Once
	err  error
}

func (c *liveConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *liveConn) Write(p []byte) (int, error) { return c.att.Conn.Write(p) }

// Close ends the agent's stdin, which it takes as the end of the sandbox,
// and stops reading; later Reads fail.
func (c *liveConn) Close() error {
	c.once.Do(func() {
		c.err = c.att.CloseWrite()
		c.r.Close()
	})
	return c.err
}

// sockConn is the agent's socket under runc; closing it is the end of
// the sandbox for the agent.
type sockConn struct{ *net.UnixConn }

// dropClosed writes to a pipe and drops what comes after its reader has
// closed.
type dropClosed struct{ w *io.PipeWriter }

func (d dropClosed) Write(p []byte) (int, error) {
	n, err := d.w.Write(p)
	if errors.Is(err, io.ErrClosedPipe) {
		return len(p), nil
	}
	return n, err
}

// logWriter logs a stream line by line, each line clipped to
// logLineBytes, and at most max bytes in all; the rest is counted and
// dropped.
type logWriter struct {
	log     *slog.Logger
	id      string
	max     int
	mu      sync.Mutex
	line    bytes.Buffer
	logged  int
	dropped int
}

const logLineBytes = 1 << 10

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := logLineBytes - w.line.Len(); room > 0 {
			w.line.Write(chunk[:min(room, len(chunk))])
		}
		if i < 0 {
			break
		}
		w.emit()
		p = p[i+1:]
	}
	return n, nil
}

// emit logs the line held, if the budget allows.
func (w *logWriter) emit() {
	if w.logged+w.line.Len() <= w.max {
		w.log.Info("docker: sandbox stderr", "sandbox", w.id, "line", w.line.String())
		w.logged += w.line.Len()
	} else {
		w.dropped += w.line.Len()
	}
	w.line.Reset()
}

// flush logs a last unterminated line and what was dropped.
func (w *logWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.line.Len() > 0 {
		w.emit()
	}
	if w.dropped > 0 {
		w.log.Warn("docker: sandbox stderr over its log budget", "sandbox", w.id, "dropped_bytes", w.dropped)
	}
}
