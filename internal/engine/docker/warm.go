package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/launcher"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// Prestarter creates warm sandboxes for package pool: containers made by
// containerConfig exactly as for a cold execution, with the language's
// launcher as the command (see package launcher), stdin always attached,
// and for python the image's sitecustomize shadowed by a read-only file
// mount. They carry the driver's labels and are marked running, so Reap
// leaves them alone while the driver lives and removes them after a crash.
type Prestarter struct {
	d *Driver

	mu        sync.Mutex
	launchers map[string]*warmLauncher // by image and command
}

// NewPrestarter returns the warm-sandbox capability of d.
func NewPrestarter(d *Driver) *Prestarter {
	return &Prestarter{d: d, launchers: map[string]*warmLauncher{}}
}

var _ engine.Prestarter = (*Prestarter)(nil)

type warmLauncher struct {
	ln  launcher.Launcher
	err error
}

// launcher finds a language's launcher once per image and command; for
// python it reads the image through a container that is created, never
// started, and removed.
func (p *Prestarter) launcher(ctx context.Context, lang engine.Language, img string) (launcher.Launcher, error) {
	argv := command(lang)
	key := img + "\x00" + fmt.Sprint(argv)
	p.mu.Lock()
	defer p.mu.Unlock()
	if wl, ok := p.launchers[key]; ok {
		return wl.ln, wl.err
	}
	var image fs.FS
	probe, err := p.d.newProbe(ctx, lang)
	if err == nil {
		defer probe.close()
		image = probe
	} else {
		p.d.log.Warn("docker: cannot read the image; python's launcher falls back to the main-script one", "image", img, "err", err)
	}
	ln, err := launcher.For(lang, argv, image)
	if err != nil {
		err = fmt.Errorf("%w: %s: %w", engine.ErrUnsupported, lang.Name, err)
	}
	p.launchers[key] = &warmLauncher{ln: ln, err: err}
	return ln, err
}

// Prestart creates and starts a container whose interpreter waits for the
// code, and returns once it is ready.
func (p *Prestarter) Prestart(ctx context.Context, lang engine.Language, limits engine.Limits) (_ engine.Warm, err error) {
	d := p.d
	if err := limits.Validate(); err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	if f := lang.File; f == "" || f != filepath.Base(f) || f == "." || f == ".." {
		return nil, fmt.Errorf("docker: language %q: the code file needs a plain name, not %q", lang.Name, f)
	}
	img := lang.Image
	if img == "" {
		img = d.opts.Image
	}
	ln, err := p.launcher(ctx, lang, img)
	if err != nil {
		return nil, err
	}
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	w := &warmContainer{d: d, id: "warm_" + hex.EncodeToString(tok[:]), file: lang.File}
	if err := d.begin(w.id); err != nil {
		return nil, err
	}
	w.dir = d.codeDir(w.id)
	defer func() {
		if err != nil {
			_ = w.Discard(context.Background())
		}
	}()
	if err := os.Mkdir(w.dir, 0o755); err != nil {
		return nil, fmt.Errorf("docker: code directory: %w", err)
	}
	codeDir := filepath.Join(w.dir, "code")
	if err := sandbox.MountWorkdir(codeDir, limits); err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	if ln.Program != nil {
		if err := sandbox.WriteCode(codeDir, lang.File, ln.Program); err != nil {
			return nil, fmt.Errorf("docker: writing launcher: %w", err)
		}
	}
	wl := lang
	wl.Command = ln.Args
	// Stdin is attached, as for every cold container: the go line comes
	// through it before the user's stdin.
	// The uid is the sandbox's until Discard.
	if w.uid, err = d.uids.Acquire(); err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	cfg, host := d.containerConfig(engine.Spec{ID: w.id, Language: wl, Stdin: "attached", Limits: limits}, codeDir, os.Getpid(), w.uid.UID)
	for i, f := range ln.Files {
		src := filepath.Join(w.dir, fmt.Sprintf("launcher-%d", i))
		if err := os.WriteFile(src, f.Content, 0o644); err != nil {
			return nil, fmt.Errorf("docker: writing launcher: %w", err)
		}
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeBind, Source: src, Target: f.Target, ReadOnly: true})
	}
	if d.acct != nil {
		if w.oom, err = d.acct.limitParent(d.instance, w.id, limits.MemoryBytes); err != nil {
			return nil, fmt.Errorf("docker: %w", err)
		}
	}
	w.name = containerName(d.instance, w.id)
	if err := d.createAttached(ctx, cfg, host, w.name, &w.attachedContainer); err != nil {
		return nil, err
	}
	w.stdout = &handoverSink{ready: make(chan struct{})}
	w.stderr = &handoverSink{}
	w.copied = make(chan struct{})
	go func() {
		_, _ = stdcopy.StdCopy(w.stdout, w.stderr, w.att.Reader)
		close(w.copied)
	}()
	if err := d.cli.ContainerStart(ctx, w.cid, container.StartOptions{}); err != nil {
		return nil, fmt.Errorf("docker: starting container: %w", err)
	}
	select {
	case <-w.stdout.ready:
		if w.stdout.bad {
			return nil, fmt.Errorf("docker: pre-started %s sandbox: launcher not ready: %q", lang.Name, w.stdout.pending.String())
		}
	case <-w.done:
		return nil, fmt.Errorf("docker: pre-started %s sandbox exited with %d before it was ready: %s", lang.Name, w.exitCode, clip(w.stderr.pending.String()))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if d.acct != nil {
		_, w.mem = d.acct.usage(d.instance, w.id)
	}
	return w, nil
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// handoverSink receives one output stream of a warm container. Until the
// hand-over it holds what arrives (on stdout, first of all the launcher's
// Ready, which it consumes); from then on it writes to the execution's
// capped buffer, so output before the code ran (interpreter warnings)
// lands where the cold path would have put it.
type handoverSink struct {
	mu      sync.Mutex
	ready   chan struct{} // stdout only: closed once Ready was read
	seen    int           // bytes of Ready read so far
	bad     bool          // the first bytes were not Ready
	pending bytes.Buffer  // before the hand-over; bounded below
	dst     io.Writer
}

func (s *handoverSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(p)
	if s.ready != nil && s.seen < len(launcher.Ready) {
		k := min(len(launcher.Ready)-s.seen, len(p))
		if string(p[:k]) != launcher.Ready[s.seen:s.seen+k] {
			s.bad = true
			s.seen = len(launcher.Ready)
			s.pending.Write(p)
			close(s.ready)
			return n, nil
		}
		s.seen += k
		p = p[k:]
		if s.seen == len(launcher.Ready) {
			close(s.ready)
		}
	}
	if s.dst != nil {
		return s.dst.Write(p)
	}
	if s.pending.Len() < 1<<20 {
		s.pending.Write(p)
	}
	return n, nil
}

// handOver sends everything from now on, and what is pending, to dst.
func (s *handoverSink) handOver(dst io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst.Write(s.pending.Bytes())
	s.pending.Reset()
	s.dst = dst
}

// warmContainer is one pre-started container.
type warmContainer struct {
	d    *Driver
	id   string // execution-like id: labels, code dir, cgroup parent
	name string
	dir  string
	file string
	mem  int64
	uid  *uidpool.Lease
	oom  *sandbox.OOMWatch // the parent's OOM notification (cgroup v1)

	attachedContainer
	stdout, stderr *handoverSink
	copied         chan struct{}

	used     atomic.Bool
	discard  sync.Once
	discErr  error
	removeMu sync.Mutex
	removed  bool
}

func (w *warmContainer) Done() <-chan struct{} { return w.done }
func (w *warmContainer) MemoryBytes() int64    { return w.mem }

// Exec hands the code (and the request's files) over and runs it through
// the engine's execution loop, as a cold Run does; time and CPU count
// from the hand-over.
func (w *warmContainer) Exec(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	d := w.d
	if !w.used.CompareAndSwap(false, true) {
		return engine.Result{}, fmt.Errorf("docker: warm sandbox %s already used", w.id)
	}
	if len(spec.Env) > 0 || len(spec.Args) > 0 {
		// The launcher started with the cold path's fixed environment
		// and command line.
		return engine.Result{}, fmt.Errorf("%w: env and args need a cold sandbox", engine.ErrNotStarted)
	}
	if spec.EgressDir != "" {
		// Nor has it the egress mount or the agent's relay.
		return engine.Result{}, fmt.Errorf("%w: egress needs a cold sandbox", engine.ErrNotStarted)
	}
	select {
	case <-w.done:
		return engine.Result{}, fmt.Errorf("%w: sandbox ended before the hand-over", engine.ErrNotStarted)
	default:
	}
	dir := filepath.Join(w.dir, "code")
	if err := sandbox.PlaceFiles(dir, spec.Files, w.uid.UID); err != nil {
		return engine.Result{}, fmt.Errorf("%w: %v", engine.ErrNotStarted, err)
	}
	if err := sandbox.WriteCode(dir, w.file, []byte(spec.Code)); err != nil {
		return engine.Result{}, fmt.Errorf("%w: %v", engine.ErrNotStarted, err)
	}
	var cpu0 float64
	if d.acct != nil {
		cpu0, _ = d.acct.usage(d.instance, w.id)
	}
	p := &process{
		d: d, cid: w.cid, acctID: w.id, oom: w.oom, att: w.att, dir: dir,
		// stdin stays the pipe, as on the cold path.
		start: func(ctx context.Context) error {
			if _, err := w.att.Conn.Write(launcher.GoLine(false)); err != nil {
				return fmt.Errorf("%w: go line: %v", engine.ErrNotStarted, err)
			}
			return nil
		},
		// Output before the hand-over (interpreter warnings) lands where
		// the cold path would have put it.
		copyOut: func(stdout, stderr io.Writer) error {
			w.stdout.handOver(stdout)
			w.stderr.handOver(stderr)
			<-w.copied
			return nil
		},
		wait: func() (int, error) {
			<-w.done
			if w.waitErr != nil {
				return 0, fmt.Errorf("docker: waiting for container: %w", w.waitErr)
			}
			return w.exitCode, nil
		},
		kill:     w.remove,
		finished: func() error { return nil }, // Discard removes it
		usage: func() (float64, int64) {
			if d.acct == nil {
				return 0, 0
			}
			cpu1, peak := d.acct.usage(d.instance, w.id)
			return cpu1 - cpu0, peak
		},
	}
	return sandbox.Supervise(ctx, spec, p, sandbox.LoopOptions{Now: d.opts.Now})
}

// remove force-removes the container, killing what runs in it.
func (w *warmContainer) remove() error {
	w.removeMu.Lock()
	defer w.removeMu.Unlock()
	return w.d.removeOnce(w.cid, w.name, &w.removed)
}

// Discard removes the container, its code directory and parent cgroup.
func (w *warmContainer) Discard(ctx context.Context) error {
	w.discard.Do(func() {
		defer w.oom.Close()
		var errs []error
		if err := w.remove(); err != nil {
			errs = append(errs, err)
		}
		if w.att != nil {
			w.att.Close()
		}
		if w.stopWait != nil {
			w.stopWait()
		}
		if w.dir != "" {
			if err := sandbox.UnmountWorkdir(filepath.Join(w.dir, "code")); err != nil {
				errs = append(errs, fmt.Errorf("docker: %w", err))
			} else if err := os.RemoveAll(w.dir); err != nil {
				errs = append(errs, fmt.Errorf("docker: removing code directory: %w", err))
			}
		}
		if w.d.acct != nil && w.removed {
			if err := w.d.acct.remove(w.d.instance, w.id); err != nil {
				errs = append(errs, fmt.Errorf("docker: %w", err))
			}
		}
		if len(errs) == 0 {
			w.uid.Release()
		} else {
			w.uid.Abandon()
		}
		w.d.end(w.id)
		w.discErr = errors.Join(errs...)
	})
	return w.discErr
}

// probe reads files of an image through a created, never started,
// container: enough for the launcher to find the interpreter and its
// sitecustomize. It implements fs.FS, fs.StatFS, fs.ReadFileFS and
// fs.ReadLinkFS.
type probe struct {
	d   *Driver
	ctx context.Context
	id  string // execution-like id
	cid string
}

func (d *Driver) newProbe(ctx context.Context, lang engine.Language) (*probe, error) {
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	p := &probe{d: d, ctx: ctx, id: "probe_" + hex.EncodeToString(tok[:])}
	if err := d.begin(p.id); err != nil {
		return nil, err
	}
	dir := d.codeDir(p.id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		d.end(p.id)
		return nil, fmt.Errorf("docker: probe directory: %w", err)
	}
	// Never started: nothing runs as its uid, so none is leased.
	cfg, host := d.containerConfig(engine.Spec{ID: p.id, Language: lang, Limits: engine.DefaultLimits(0)}, dir, os.Getpid(), sandbox.UID)
	host.CgroupParent = "" // never started: no cgroup to account
	created, err := d.cli.ContainerCreate(ctx, cfg, host, nil, nil, containerName(d.instance, p.id))
	if err != nil {
		p.close()
		return nil, fmt.Errorf("docker: creating probe container: %w", err)
	}
	p.cid = created.ID
	return p, nil
}

func (p *probe) close() {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	ref := p.cid
	if ref == "" {
		ref = containerName(p.d.instance, p.id)
	}
	if err := p.d.cli.ContainerRemove(ctx, ref, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !errNotFound(err) {
		p.d.log.Warn("docker: removing probe container", "err", err)
	}
	_ = os.RemoveAll(p.d.codeDir(p.id))
	p.d.end(p.id)
}

type probeInfo struct {
	name string
	size int64
	mode fs.FileMode
	mod  time.Time
}

func (i probeInfo) Name() string       { return i.name }
func (i probeInfo) Size() int64        { return i.size }
func (i probeInfo) Mode() fs.FileMode  { return i.mode }
func (i probeInfo) ModTime() time.Time { return i.mod }
func (i probeInfo) IsDir() bool        { return i.mode.IsDir() }
func (i probeInfo) Sys() any           { return nil }

func (p *probe) lstat(op, name string) (probeInfo, string, error) {
	if !fs.ValidPath(name) {
		return probeInfo{}, "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	st, err := p.d.cli.ContainerStatPath(p.ctx, p.cid, "/"+name)
	if err != nil {
		if errNotFound(err) {
			err = fs.ErrNotExist
		}
		return probeInfo{}, "", &fs.PathError{Op: op, Path: name, Err: err}
	}
	return probeInfo{name: path.Base(name), size: st.Size, mode: st.Mode, mod: st.Mtime}, st.LinkTarget, nil
}

// Stat does not follow a final symlink: the launcher resolves links
// itself before it stats.
func (p *probe) Stat(name string) (fs.FileInfo, error) {
	fi, _, err := p.lstat("stat", name)
	if err != nil {
		return nil, err
	}
	return fi, nil
}

func (p *probe) ReadLink(name string) (string, error) {
	fi, target, err := p.lstat("readlink", name)
	if err != nil {
		return "", err
	}
	if fi.mode&fs.ModeSymlink == 0 {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	return target, nil
}

func (p *probe) Lstat(name string) (fs.FileInfo, error) { return p.Stat(name) }

func (p *probe) ReadFile(name string) ([]byte, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrInvalid}
	}
	rc, _, err := p.d.cli.CopyFromContainer(p.ctx, p.cid, "/"+name)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	if h.Typeflag != tar.TypeReg {
		return nil, &fs.PathError{Op: "read", Path: name, Err: errors.New("not a regular file")}
	}
	return io.ReadAll(io.LimitReader(tr, 8<<20))
}

func (p *probe) Open(name string) (fs.File, error) {
	b, err := p.ReadFile(name)
	if err != nil {
		return nil, err
	}
	fi, err := p.Stat(name)
	if err != nil {
		return nil, err
	}
	return &probeFile{Reader: bytes.NewReader(b), fi: fi}, nil
}

type probeFile struct {
	*bytes.Reader
	fi fs.FileInfo
}

func (f *probeFile) Stat() (fs.FileInfo, error) { return f.fi, nil }
func (f *probeFile) Close() error               { return nil }
