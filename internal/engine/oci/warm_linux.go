package oci

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/launcher"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// Prestarter creates warm sandboxes for package pool. A warm sandbox is
// the cold path's bundle, cgroup and runtime invocation, with the
// language's launcher waiting in it (see package launcher): the same
// config.json but for the command line (node gets --require) and, for
// python, one more read-only file mount (the shadowed sitecustomize).
type Prestarter struct {
	d *Driver

	mu        sync.Mutex
	templates map[templateKey]*warmTemplate
}

// NewPrestarter returns the warm-sandbox capability of d. Its sandboxes
// live in d's instance directory and cgroups, so d's Close and Reap
// remove them like cold ones.
func NewPrestarter(d *Driver) *Prestarter {
	return &Prestarter{d: d, templates: map[templateKey]*warmTemplate{}}
}

var _ engine.Prestarter = (*Prestarter)(nil)

// warmTemplate is a language's warm config.json and launcher.
type warmTemplate struct {
	tpl      *template
	plan     *bwrapPlan // bwrap: the spec translated, instead of tpl
	launcher launcher.Launcher
	err      error // the language cannot be pre-started
}

// template returns the warm config of a language and limits, built once
// from the cold path's spec.
func (p *Prestarter) template(lang engine.Language, l engine.Limits) (*warmTemplate, error) {
	key := templateKey{image: lang.Image, file: lang.File, command: fmt.Sprint(lang.Command), limits: l}
	p.mu.Lock()
	defer p.mu.Unlock()
	if wt, ok := p.templates[key]; ok {
		return wt, wt.err
	}
	wt := &warmTemplate{}
	wt.tpl, wt.plan, wt.launcher, wt.err = p.build(lang, l)
	if len(p.templates) > 256 {
		clear(p.templates)
	}
	p.templates[key] = wt
	return wt, wt.err
}

func (p *Prestarter) build(lang engine.Language, l engine.Limits) (*template, *bwrapPlan, launcher.Launcher, error) {
	d := p.d
	s, err := d.spec(lang, l, idPlaceholder)
	if err != nil {
		return nil, nil, launcher.Launcher{}, err
	}
	// Process.Args is [init, "--", the deadline, the cold command line...]
	// (bwrap: no init); the launcher runs under the same deadline (the
	// pool's Lifetime).
	ln, err := launcher.For(lang, lang.Argv(), os.DirFS(lang.Image))
	if err != nil {
		return nil, nil, launcher.Launcher{}, fmt.Errorf("%w: %s: %w", engine.ErrUnsupported, lang.Name, err)
	}
	keep := 2
	if d.rt.bwrap {
		keep = 0
	}
	s.Process.Args = append(s.Process.Args[:keep:keep], sandbox.DeadlineArgv(timeoutPath, l.Lifetime, ln.Args)...)
	for _, f := range ln.Files {
		src, err := p.writeShared(f.Content)
		if err != nil {
			return nil, nil, launcher.Launcher{}, err
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: f.Target, Type: "bind", Source: src,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		})
	}
	if d.rt.bwrap {
		plan, err := d.bwrapPlanOf(s, lang)
		return nil, plan, ln, err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, nil, launcher.Launcher{}, fmt.Errorf("encoding config.json: %w", err)
	}
	t, err := newTemplate(b)
	if err != nil {
		return nil, nil, launcher.Launcher{}, err
	}
	return t, nil, ln, nil
}

// writeShared stores a launcher file once in the driver's instance
// directory; every sandbox of the language mounts it read-only.
func (p *Prestarter) writeShared(content []byte) (string, error) {
	dir := filepath.Join(p.d.instance, "launchers")
	if err := os.Mkdir(dir, 0o755); err == nil && p.d.rt.bwrap {
		// bwrap keeps a bind source's mount flags: the launcher files'
		// noexec comes from a tmpfs of their own (removed with the
		// instance: Close and Reap unmount what is under it).
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC|unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=4m"); err != nil {
			return "", fmt.Errorf("mounting launcher dir: %w", err)
		}
	} else if err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating launcher dir: %w", err)
	}
	sum := sha256.Sum256(content)
	path := filepath.Join(dir, hex.EncodeToString(sum[:8]))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, content, 0o644); err != nil {
		return "", fmt.Errorf("writing launcher: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("writing launcher: %w", err)
	}
	return path, nil
}

// held is a sandbox the driver keeps running after it started it, its
// stdio pipes the host's: a warm sandbox (Prestart), a live one (Start).
// Its bundle directory, uid lease and cgroup are the sandbox's until
// Discard, which removes them as the cold path's cleanup does.
type held struct {
	d      *Driver
	id     string
	bundle string
	cg     *execCgroup
	uid    *uidpool.Lease
	cmd    *startedCmd

	stdin          *os.File // write end
	stdout, stderr *os.File // read ends
	// agentChannel: stdin and stdout are one socket, the agent's
	// (stdio.openAgent, or fd 3 under runc), so the same file.
	agentChannel bool
	proxyOut     *os.File // runc's stdout pipe, unused beside the agent's fd 3
	// hostUDS lets the sandbox connect to a host unix socket mounted into
	// it (a live sandbox's egress): runsc refuses them by default.
	hostUDS bool

	// beforeCleanup, if set, runs once in Discard when the sandbox's
	// processes are gone and its cgroup not yet removed.
	beforeCleanup func()

	discard sync.Once
	derr    error
}

// newHeld creates the bundle directory of sandbox id and leases it a uid.
// On an error nothing is left; otherwise Discard removes both.
func (d *Driver) newHeld(id string) (*held, error) {
	s := &held{d: d, id: id, bundle: filepath.Join(d.bundlesDir, id)}
	if err := os.Mkdir(s.bundle, 0o700); err != nil {
		return nil, fmt.Errorf("oci: creating bundle: %w", err)
	}
	// The uid is the sandbox's until Discard, like its cgroup.
	var err error
	if s.uid, err = d.uids.Acquire(); err != nil {
		_ = s.Discard(context.Background())
		return nil, fmt.Errorf("oci: %w", err)
	}
	return s, nil
}

// warmSandbox is one pre-started sandbox.
type warmSandbox struct {
	*held
	lang engine.Language
	mem  int64

	used atomic.Bool
}

// startedCmd is the runtime process and its exit.
type startedCmd struct {
	proc *os.Process
	done chan struct{}
	ps   *os.ProcessState
	err  error
}

// Prestart creates a sandbox for lang with limits, starts its launcher and
// returns once the interpreter waits for code.
func (p *Prestarter) Prestart(ctx context.Context, lang engine.Language, limits engine.Limits) (_ engine.Warm, err error) {
	d := p.d
	if err := limits.Validate(); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	lang.Image = resolveImage(lang.Image)
	if err := d.checkImage(lang.Image); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	wt, err := p.template(lang, limits)
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	h, err := d.newHeld("warm_" + hex.EncodeToString(tok[:]))
	if err != nil {
		return nil, err
	}
	s := &warmSandbox{held: h, lang: lang}
	defer func() {
		if err != nil {
			_ = s.Discard(context.Background())
		}
	}()
	spec := engine.Spec{ID: s.id, Language: lang, Code: string(wt.launcher.Program), Limits: limits}
	if err := d.writeBundle(s.bundle, wt.tpl, spec, "", s.uid.UID); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if wt.plan != nil {
		if err := openBundleTo(s.bundle, s.uid.UID); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	if wt.launcher.Program == nil {
		// The code file appears at hand-over only.
		if err := os.Remove(s.codePath()); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	if s.cg, err = d.cg.create(s.id, d.cgLimitsFor(limits)); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	// While it starts, the sandbox yields the CPU to executions that are
	// running (CPU weight; the quota is unchanged). Exec gives it the
	// default weight back, the cold path's, before the code runs.
	if err := s.cg.setCPUWeight(true); err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	if wt.plan != nil {
		err = s.startBwrap(ctx, wt.plan.render(s.bundle, s.uid.UID, nil, nil))
	} else {
		err = s.start()
	}
	if err != nil {
		return nil, err
	}

	// Wait for the launcher's Ready, the sandbox dying, or ctx.
	ready := make(chan error, 1)
	go func() {
		buf := make([]byte, len(launcher.Ready))
		_, err := io.ReadFull(s.stdout, buf)
		if err == nil && string(buf) != launcher.Ready {
			err = fmt.Errorf("launcher wrote %q before it was ready", buf)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			return nil, fmt.Errorf("oci: pre-started %s sandbox: %w%s", lang.Name, err, s.failure())
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mem = s.cg.memoryCurrent()
	return s, nil
}

func (s *warmSandbox) codePath() string {
	return filepath.Join(s.bundle, "code", s.lang.File)
}

// start runs `<runtime> run` on the bundle with pipes for stdio.
func (s *held) start() error {
	d := s.d
	var pipes stdio
	open := pipes.open
	viaFD := s.agentChannel && d.rt.proxiesStdio
	if s.agentChannel && !viaFD {
		open = pipes.openAgent
	}
	if err := open(); err != nil {
		return err
	}
	s.stdin, s.stdout, s.stderr = pipes.ours[0], pipes.ours[1], pipes.ours[2]
	args := d.runArgs(s.hostUDS, "run", "--bundle", s.bundle, "--pid-file", filepath.Join(s.bundle, "init.pid"))
	var agentEnd *os.File
	if viaFD {
		ours, child, err := agentSocket()
		if err != nil {
			pipes.close()
			s.stdin, s.stdout, s.stderr = nil, nil, nil
			return err
		}
		// The proxied stdin and stdout carry nothing: stdin is closed on
		// our side (EOF), stdout kept open unread until Discard (a write
		// there must not be runc's SIGPIPE); the socket stands for both.
		s.stdin.Close()
		s.proxyOut = s.stdout
		s.stdin, s.stdout, agentEnd = ours, ours, child
		args = append(args, "--preserve-fds", "1")
	}
	// Not CommandContext: ending a context must kill the sandbox (Discard
	// does), not orphan it by killing only the runtime process.
	cmd := d.runtimeCmd(context.Background(), filepath.Join(s.bundle, "runtime.log"), append(args, s.id)...)
	pipes.attach(cmd)
	if agentEnd != nil {
		cmd.ExtraFiles = []*os.File{agentEnd} // fd 3, the agent's --fd
	}
	err := cmd.Start()
	pipes.closeChild()
	if agentEnd != nil {
		agentEnd.Close()
	}
	if err != nil {
		return fmt.Errorf("oci: starting %s: %w", d.rt.name, err)
	}
	c := &startedCmd{proc: cmd.Process, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		c.ps = cmd.ProcessState
		close(c.done)
	}()
	s.cmd = c
	return nil
}

// startBwrap starts the sandbox with bwrap, as the cold path does; the
// pipes and the process are the warm sandbox's from then on.
func (s *held) startBwrap(ctx context.Context, plan *bwrapPlan) error {
	bp, err := s.d.newBwrapProcess(s.id, s.bundle, s.cg, plan)
	if err != nil {
		return err
	}
	if err := bp.Start(ctx); err != nil {
		bp.close()
		return err
	}
	s.stdin, s.stdout, s.stderr = bp.ours[0], bp.ours[1], bp.ours[2]
	bp.ours = [3]*os.File{}
	c := &startedCmd{proc: bp.cmd.Process, done: make(chan struct{})}
	go func() {
		c.err = bp.cmd.Wait()
		c.ps = bp.cmd.ProcessState
		bp.close()
		close(c.done)
	}()
	s.cmd = c
	return nil
}

// failure describes why a sandbox ended before it was ready.
func (s *held) failure() string {
	select {
	case <-s.cmd.done:
	case <-time.After(time.Second):
		return ""
	}
	msg := runtimeError(filepath.Join(s.bundle, "runtime.log"))
	if msg == "" {
		msg = "exit status " + strconv.Itoa(exitCode(s.cmd.ps))
	}
	var b [512]byte
	_ = s.stderr.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	n, _ := s.stderr.Read(b[:])
	if n > 0 {
		msg += ", stderr: " + string(bytes.TrimSpace(b[:n]))
	}
	return " (" + msg + ")"
}

func (s *held) Done() <-chan struct{} { return s.cmd.done }

func (s *warmSandbox) MemoryBytes() int64 { return s.mem }

// Exec hands the code (and the request's files) over and runs it through
// the engine's execution loop, as the cold path does; time, CPU and peak
// memory count from the hand-over.
func (s *warmSandbox) Exec(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	if !s.used.CompareAndSwap(false, true) {
		return engine.Result{}, fmt.Errorf("oci: warm sandbox %s already used", s.id)
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
	case <-s.cmd.done:
		return engine.Result{}, fmt.Errorf("%w: sandbox ended before the hand-over", engine.ErrNotStarted)
	default:
	}
	if err := ctx.Err(); err != nil {
		return engine.Result{}, err
	}
	// The cold path's CPU weight first: once the code is in place, it
	// runs with it (and TestWarmCPUWeight, watching the file, sees it).
	if err := s.cg.setCPUWeight(false); err != nil {
		return engine.Result{}, fmt.Errorf("%w: %v", engine.ErrNotStarted, err)
	}
	dir := filepath.Join(s.bundle, "code")
	if err := sandbox.PlaceFiles(dir, spec.Files, s.uid.UID); err != nil {
		return engine.Result{}, fmt.Errorf("%w: %v", engine.ErrNotStarted, err)
	}
	if err := sandbox.WriteCode(dir, s.lang.File, []byte(spec.Code)); err != nil {
		return engine.Result{}, fmt.Errorf("%w: %v", engine.ErrNotStarted, err)
	}
	cpu0, _ := s.cg.usage()
	// Peak memory from here on; what the interpreter holds already counts,
	// as it does on the cold path.
	s.cg.resetPeak()
	return sandbox.Supervise(ctx, spec, &warmProcess{s: s, cpu0: cpu0}, sandbox.LoopOptions{})
}

// warmProcess is a warm sandbox's program after the hand-over, as
// sandbox.Supervise drives it.
type warmProcess struct {
	s    *warmSandbox
	cpu0 float64
}

// Start writes the go line. It fits the empty pipe, so the write does
// not block; if it fails the launcher is gone and no user code ran.
func (p *warmProcess) Start(ctx context.Context) error {
	if _, err := p.s.stdin.Write(launcher.GoLine(false)); err != nil {
		_ = p.Kill()
		return fmt.Errorf("%w: go line: %v", engine.ErrNotStarted, err)
	}
	return nil
}

// Stdin stays the pipe the go line came through, as on the cold path,
// which never hands a host file to the sandbox.
func (p *warmProcess) Stdin() io.WriteCloser { return p.s.stdin }

func (p *warmProcess) CopyOutput(stdout, stderr io.Writer) error {
	return copyStreams(stdout, stderr, p.s.stdout, p.s.stderr)
}

func (p *warmProcess) Wait() (int, error) {
	<-p.s.cmd.done
	var exitErr interface{ ExitCode() int }
	if p.s.cmd.err != nil && !errors.As(p.s.cmd.err, &exitErr) {
		return 0, fmt.Errorf("oci: waiting for %s: %w", p.s.d.rt.name, p.s.cmd.err)
	}
	return exitCode(p.s.cmd.ps), nil
}

func (p *warmProcess) Kill() error {
	p.s.d.kill(p.s.id, p.s.cmd.proc)
	return nil
}

func (p *warmProcess) CloseOutput() { closeReads(p.s.stdout, p.s.stderr) }

func (p *warmProcess) Finish(ctx context.Context, e sandbox.Exit) (sandbox.Exit, error) {
	e.OOMKilled = p.s.cg.oomKilled()
	cpu1, peak := p.s.cg.usage()
	e.CPUSeconds, e.PeakMemoryBytes = cpu1-p.cpu0, peak
	return e, nil
}

func (p *warmProcess) Workdir() string { return filepath.Join(p.s.bundle, "code") }

// Discard kills what still runs and removes the bundle, runtime state,
// cgroups and mounts, as the cold path's cleanup does, and ends the uid
// lease.
func (s *held) Discard(ctx context.Context) error {
	s.discard.Do(func() {
		if s.cmd != nil {
			select {
			case <-s.cmd.done:
			default:
				s.d.kill(s.id, s.cmd.proc)
				select {
				case <-s.cmd.done:
				case <-ctx.Done():
				}
			}
		}
		for _, f := range []*os.File{s.stdin, s.stdout, s.stderr, s.proxyOut} {
			if f != nil {
				f.Close()
			}
		}
		if s.beforeCleanup != nil {
			s.beforeCleanup()
		}
		s.derr = s.d.cleanup(s.id, s.bundle, s.cg)
		if s.derr != nil {
			s.uid.Abandon()
		} else {
			s.uid.Release()
		}
	})
	return s.derr
}
