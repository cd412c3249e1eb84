package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// validID keeps an execution ID usable as a file name, a cgroup name and
// part of a container name: [A-Za-z0-9][A-Za-z0-9_.-]{0,127}.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i, c := range id {
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '_' && c != '.' && c != '-') {
			return false
		}
	}
	return true
}

// cleanupTimeout bounds the force-remove done after ctx is already over.
const cleanupTimeout = 30 * time.Second

// A SIGKILLed container is inspected up to 1+oomEventRetries times,
// oomEventWait apart, for the engine's OOM mark.
const (
	oomEventRetries = 10
	oomEventWait    = 20 * time.Millisecond
)

// Run executes spec in a fresh container and removes it. API round trips:
// create, attach, wait, start, remove; inspect is added only when the exit
// status (137, SIGKILL) could be an OOM kill.
func (d *Driver) Run(ctx context.Context, spec engine.Spec) (res engine.Result, err error) {
	if !validID(spec.ID) {
		return engine.Result{}, fmt.Errorf("docker: invalid execution id %q", spec.ID)
	}
	if err := spec.Validate(); err != nil {
		return engine.Result{}, fmt.Errorf("docker: %w", err)
	}
	if spec.EgressDir != "" {
		if err := errors.Join(checkEgressDir(spec.EgressDir), checkAgent(spec.Agent)); err != nil {
			return engine.Result{}, fmt.Errorf("docker: execution %s: %w", spec.ID, err)
		}
	}
	if err := d.begin(spec.ID); err != nil {
		return engine.Result{}, err
	}
	defer d.end(spec.ID)

	s := &execution{d: d, spec: spec}
	defer func() {
		if cerr := s.cleanup(); cerr != nil {
			d.log.Error("docker: sandbox cleanup failed", "execution", spec.ID, "err", cerr)
			if err == nil {
				// A sandbox we could not remove is the platform's failure,
				// even if the user's code finished.
				res, err = engine.Result{}, cerr
			}
		}
	}()
	return s.run(ctx)
}

// execution is one Run's container and the host state around it.
type execution struct {
	d    *Driver
	spec engine.Spec

	dir     string // code directory on the host, "" until created
	base    string // with egress: the state directory holding dir (egress.go), "" until created
	uid     *uidpool.Lease
	name    string // container name, "" until creation was asked for
	id      string // container ID, "" until created
	removed bool   // the container was already force-removed
	oom     *sandbox.OOMWatch
}

func (s *execution) run(ctx context.Context) (engine.Result, error) {
	d, spec := s.d, s.spec
	if f := spec.Language.File; f == "" || f != filepath.Base(f) || f == "." || f == ".." {
		return engine.Result{}, fmt.Errorf("docker: language %q: the code file needs a plain name, not %q", spec.Language.Name, f)
	}
	var err error
	if s.uid, err = d.uids.Acquire(); err != nil {
		return engine.Result{}, fmt.Errorf("docker: %w", err)
	}
	s.dir = d.codeDir(spec.ID)
	if spec.EgressDir != "" {
		if err := os.Mkdir(s.dir, 0o711); err != nil {
			s.dir = "" // not ours to remove (e.g. an ID already in use)
			return engine.Result{}, fmt.Errorf("docker: %w", err)
		}
		s.base, s.dir = s.dir, filepath.Join(s.dir, "code")
	}
	if err := sandbox.MountWorkdir(s.dir, spec.Limits); err != nil {
		s.dir = "" // not ours to remove (e.g. an ID already in use)
		return engine.Result{}, fmt.Errorf("docker: %w", err)
	}
	if err := sandbox.WriteCode(s.dir, spec.Language.File, []byte(spec.Code)); err != nil {
		return engine.Result{}, fmt.Errorf("docker: %w", err)
	}
	if err := sandbox.PlaceFiles(s.dir, spec.Files, s.uid.UID); err != nil {
		return engine.Result{}, fmt.Errorf("docker: %w", err)
	}
	if s.base != "" {
		if err := bindInto(spec.EgressDir, filepath.Join(s.base, egressSource), false); err != nil {
			return engine.Result{}, fmt.Errorf("docker: egress: %w", err)
		}
		if err := bindInto(spec.Agent, filepath.Join(s.base, agentSource), true); err != nil {
			return engine.Result{}, fmt.Errorf("docker: agent: %w", err)
		}
	}

	if d.acct != nil {
		if s.oom, err = d.acct.limitParent(d.instance, spec.ID, spec.Limits.MemoryBytes); err != nil {
			return engine.Result{}, fmt.Errorf("docker: %w", err)
		}
	}
	cfg, host := d.containerConfig(spec, s.dir, os.Getpid(), s.uid.UID)
	// Named, so that a create whose answer was lost (ctx cancelled in
	// flight) can still be found and removed.
	s.name = containerName(d.instance, spec.ID)
	created, err := d.create(ctx, cfg, host, s.name)
	if err != nil {
		return engine.Result{}, fmt.Errorf("docker: creating container: %w", err)
	}
	s.id = created.ID

	// Attach before start so no output is lost; the loop reads it as it
	// arrives so a flood costs no memory past the caps.
	att, err := d.cli.ContainerAttach(ctx, s.id, container.AttachOptions{
		Stream: true, Stdin: cfg.OpenStdin, Stdout: true, Stderr: true,
	})
	if err != nil {
		return engine.Result{}, fmt.Errorf("docker: attaching: %w", err)
	}
	defer att.Close()
	// Registered before start, so the exit cannot be missed; not tied to
	// ctx, whose end the loop turns into a kill.
	waitCtx, stopWait := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWait()
	waitC, waitErrC := d.cli.ContainerWait(waitCtx, s.id, container.WaitConditionNextExit)
	p := &process{
		d: d, cid: s.id, acctID: spec.ID, oom: s.oom, att: &att, dir: s.dir,
		start: func(ctx context.Context) error {
			if err := d.cli.ContainerStart(ctx, s.id, container.StartOptions{}); err != nil {
				return fmt.Errorf("docker: starting container: %w", err)
			}
			return nil
		},
		copyOut: func(stdout, stderr io.Writer) error {
			_, err := stdcopy.StdCopy(stdout, stderr, att.Reader)
			return err
		},
		wait: func() (int, error) {
			select {
			case w := <-waitC:
				if w.Error != nil && w.Error.Message != "" {
					return 0, fmt.Errorf("docker: waiting for container: %s", w.Error.Message)
				}
				return int(w.StatusCode), nil
			case err := <-waitErrC:
				return 0, fmt.Errorf("docker: waiting for container: %w", err)
			}
		},
		// Removing with force kills every process of the sandbox and
		// deletes it in one call.
		kill: s.remove,
		// The container is removed before usage is read: its cgroup is
		// gone by then, the parent keeps the totals.
		finished: s.remove,
		usage: func() (float64, int64) {
			if d.acct == nil {
				return 0, 0
			}
			return d.acct.usage(d.instance, spec.ID)
		},
	}
	return sandbox.Supervise(ctx, spec, p, sandbox.LoopOptions{Now: d.opts.Now})
}

// process is a container's program, cold or warm, as sandbox.Supervise
// drives it; the two paths differ only in the functions they give it.
type process struct {
	d      *Driver
	cid    string
	acctID string            // the id its parent cgroup is named by
	oom    *sandbox.OOMWatch // the parent's OOM notification (cgroup v1)
	att    *types.HijackedResponse
	dir    string // the working directory on the host

	start    func(ctx context.Context) error
	copyOut  func(stdout, stderr io.Writer) error
	wait     func() (int, error)
	kill     func() error
	finished func() error            // after the exit is known, before usage is read
	usage    func() (float64, int64) // CPU seconds and peak bytes since the hand-over
}

func (p *process) Start(ctx context.Context) error { return p.start(ctx) }

// Stdin is the attach connection; closing it closes only its write side,
// which the container sees as EOF.
func (p *process) Stdin() io.WriteCloser { return stdinConn{p.att} }

func (p *process) CopyOutput(stdout, stderr io.Writer) error { return p.copyOut(stdout, stderr) }
func (p *process) Wait() (int, error)                        { return p.wait() }
func (p *process) Kill() error                               { return p.kill() }
func (p *process) CloseOutput()                              { p.att.Close() }
func (p *process) Workdir() string                           { return p.dir }

// Finish asks the engine whether a SIGKILL was the OOM killer instead of
// guessing (only a SIGKILL can be), then removes the container and reads
// its usage from the parent cgroup.
func (p *process) Finish(ctx context.Context, e sandbox.Exit) (sandbox.Exit, error) {
	if !e.TimedOut && e.Code == 128+9 {
		if p.oom.Fired() || p.d.acct != nil && p.d.acct.oomKilledV2(p.d.instance, p.acctID) {
			e.OOMKilled = true // the kernel's own count, in the parent
		} else {
			oom, err := p.d.oomKilled(ctx, p.cid)
			if err != nil {
				return e, err
			}
			e.OOMKilled = oom
		}
	}
	if err := p.finished(); err != nil {
		return e, err
	}
	e.CPUSeconds, e.PeakMemoryBytes = p.usage()
	return e, nil
}

type stdinConn struct{ att *types.HijackedResponse }

func (c stdinConn) Write(b []byte) (int, error) { return c.att.Conn.Write(b) }
func (c stdinConn) Close() error                { return c.att.CloseWrite() }

// remove force-removes the container (killing what still runs in it). It
// runs on a context of its own: cleanup must happen even when the caller's
// context is what ended the execution.
func (s *execution) remove() error {
	return s.d.removeOnce(s.id, s.name, &s.removed)
}

// removeOnce force-removes the container by its id, or by name before it
// has one, unless *removed says it already was (or there is neither);
// it sets *removed once it is gone.
func (d *Driver) removeOnce(id, name string, removed *bool) error {
	ref := id
	if ref == "" {
		ref = name
	}
	if ref == "" || *removed {
		return nil
	}
	if err := d.forceRemove(ref); err != nil {
		return err
	}
	*removed = true
	return nil
}

// forceRemove removes a container by id or name with its anonymous
// volumes, killing what still runs in it; a container already gone is not
// an error. It runs on a context of its own, since cleanup must happen
// even when the caller's context is what ended the execution.
// create creates a container whatever happens to ctx meanwhile. A create
// cancelled in flight may still complete in the engine after a removal by
// name found nothing (seen when the pool closed during a pre-start), which
// leaves a container behind; a create is short, so it is always waited
// for, up to cleanupTimeout, and its id is then known to the caller's
// cleanup.
func (d *Driver) create(ctx context.Context, cfg *container.Config, host *container.HostConfig, name string) (container.CreateResponse, error) {
	if err := ctx.Err(); err != nil {
		return container.CreateResponse{}, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return d.cli.ContainerCreate(cctx, cfg, host, nil, nil, name)
}

// attachedContainer is a created container whose streams are attached
// and whose exit is awaited before it starts, so that neither output nor
// the exit can be missed: what a warm and a live sandbox hold on to.
type attachedContainer struct {
	cid      string // "" until created
	att      *types.HijackedResponse
	stopWait context.CancelFunc
	done     chan struct{} // closed at the exit, or once stopWait gave up the wait
	exitedAt time.Time     // when done was closed
	exitCode int
	waitErr  error
}

// createAttached creates the container name, attaches to its stdin,
// stdout and stderr, and waits for its exit (not tied to ctx: the holder
// ends the wait with stopWait). On error, c holds what exists for the
// caller's cleanup to remove.
func (d *Driver) createAttached(ctx context.Context, cfg *container.Config, host *container.HostConfig, name string, c *attachedContainer) error {
	created, err := d.create(ctx, cfg, host, name)
	if err != nil {
		return fmt.Errorf("docker: creating container: %w", err)
	}
	c.cid = created.ID
	att, err := d.cli.ContainerAttach(ctx, c.cid, container.AttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return fmt.Errorf("docker: attaching: %w", err)
	}
	c.att = &att
	waitCtx, stopWait := context.WithCancel(context.Background())
	c.stopWait = stopWait
	c.done = make(chan struct{})
	waitC, waitErrC := d.cli.ContainerWait(waitCtx, c.cid, container.WaitConditionNextExit)
	go func() {
		select {
		case r := <-waitC:
			c.exitCode = int(r.StatusCode)
			if r.Error != nil && r.Error.Message != "" {
				c.waitErr = errors.New(r.Error.Message)
			}
		case err := <-waitErrC:
			c.waitErr = err
		}
		c.exitedAt = d.opts.Now()
		close(c.done)
	}()
	return nil
}

func (d *Driver) forceRemove(ref string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	err := d.cli.ContainerRemove(ctx, ref, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !errNotFound(err) {
		return fmt.Errorf("docker: removing container %s: %w", ref, err)
	}
	return nil
}

// cleanup removes everything the execution created on the engine and the
// host, whatever state the execution reached.
func (s *execution) cleanup() error {
	defer s.oom.Close()
	var errs []error
	if err := s.remove(); err != nil {
		errs = append(errs, err)
	}
	if s.base != "" {
		// Its names are the driver's: only code/ is the code's.
		if err := removeCodeDir(s.base); err != nil {
			errs = append(errs, fmt.Errorf("docker: removing the execution's directory: %w", err))
		}
	} else if s.dir != "" {
		if err := sandbox.UnmountWorkdir(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("docker: %w", err))
		} else if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("docker: removing code directory: %w", err))
		}
	}
	// The parent cgroup goes last: it can only be removed once the
	// container's own cgroup inside it is gone.
	if s.d.acct != nil && (s.removed || s.name == "") {
		if err := s.d.acct.remove(s.d.instance, s.spec.ID); err != nil {
			errs = append(errs, fmt.Errorf("docker: %w", err))
		}
	}
	// The uid goes back last: nothing runs as it once the container is
	// removed. If that failed, the next holder checks for itself.
	if len(errs) == 0 {
		s.uid.Release()
	} else {
		s.uid.Abandon()
	}
	return errors.Join(errs...)
}

// containerName makes leftovers easy to recognise in `docker ps -a`.
func containerName(instance, id string) string {
	return "vertal_" + instance + "_" + id
}

// oomKilled asks the engine whether a SIGKILLed container was killed by the
// OOM killer. containerd may deliver the task's OOM event after its exit
// event (seen under load), so a kill not yet marked as an OOM kill is asked
// about again for a short while before it counts as a plain SIGKILL.
func (d *Driver) oomKilled(ctx context.Context, id string) (bool, error) {
	for attempt := 0; ; attempt++ {
		ins, err := d.cli.ContainerInspect(ctx, id)
		if err != nil {
			return false, fmt.Errorf("docker: inspecting container: %w", err)
		}
		if ins.State != nil && ins.State.OOMKilled {
			return true, nil
		}
		if attempt == oomEventRetries {
			return false, nil
		}
		select {
		case <-time.After(oomEventWait):
		case <-ctx.Done():
			return false, fmt.Errorf("docker: %w", ctx.Err())
		}
	}
}
