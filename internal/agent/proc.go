package agent

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// reaper is the one wait4(-1) loop of the process: the agent may be PID 1
// or a subreaper, so every child (its own and orphans reparented to it)
// is reaped here, and the status of a child it started goes to that
// child's waiter. It is process-wide because children are; nothing else
// in the process may wait for a child (no exec.Cmd.Wait).
var reaper struct {
	once    sync.Once
	mu      sync.Mutex // held from fork to registration, so no status is missed
	waiting map[int]func(syscall.WaitStatus)
}

func startReaper() {
	reaper.once.Do(func() {
		reaper.waiting = map[int]func(syscall.WaitStatus){}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			// The ticker covers a SIGCHLD coalesced away; it costs one
			// wait4 a second.
			t := time.NewTicker(time.Second)
			for {
				select {
				case <-ch:
				case <-t.C:
				}
				reapAll()
			}
		}()
	})
}

func reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		reaper.mu.Lock()
		f := reaper.waiting[pid]
		delete(reaper.waiting, pid)
		reaper.mu.Unlock()
		if f != nil {
			f(ws)
		}
	}
}

// proc is one process the agent started, the leader of its own group.
type proc struct {
	id     uint64
	pid    int
	stdout *os.File
	stderr *os.File
	exited chan struct{} // closed when the reaper has its status
	status syscall.WaitStatus
	once   sync.Once
}

// closePipes stops reading the output (a background child still holds it).
func (p *proc) closePipes() {
	p.once.Do(func() {
		p.stdout.Close()
		p.stderr.Close()
	})
}

func (s *server) spawn(m *msg) {
	p, stdin, err := s.start(m)
	if err != nil {
		s.closeStream(m.ID)
		s.reply(errMsg(m.ID, err))
		return
	}
	st := s.streamOf(m.ID)
	if stdin != nil {
		s.runUpload(m.ID, newUpload(), func(b []byte) error {
			_, err := stdin.Write(b)
			return err
		}, func() (int64, error) { return 0, stdin.Close() }, func() { stdin.Close() })
	}
	s.reply(&msg{ID: m.ID, Op: "ok", PID: p.pid})

	var wg sync.WaitGroup
	for i, f := range []*os.File{p.stdout, p.stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.pump(st, m.ID, i+1, f)
		}()
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	<-p.exited
	select {
	case <-drained:
	case <-time.After(s.waitDelay):
		p.closePipes()
		<-drained
	}
	p.closePipes()
	ev := &msg{ID: m.ID, Op: "exit"}
	switch ws := p.status; {
	case ws.Signaled():
		ev.Signal = int(ws.Signal())
		ev.Code = 128 + ev.Signal
	default:
		ev.Code = ws.ExitStatus()
	}
	s.reply(ev)
	s.mu.Lock()
	delete(s.procs, m.ID)
	up := s.uploads[m.ID]
	s.mu.Unlock()
	if up != nil {
		up.abort()
	}
	s.closeStream(m.ID)
}

func (s *server) streamOf(id uint64) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

// start starts m's command, registers it, and returns it with the
// writing end of its stdin (nil for /dev/null).
func (s *server) start(m *msg) (*proc, *os.File, error) {
	if len(m.Argv) == 0 || m.Argv[0] == "" {
		return nil, nil, fmt.Errorf("no command: %w", ErrInvalid)
	}
	cwd := s.home
	if m.Cwd != "" {
		var err error
		if cwd, err = s.path(m.Cwd); err != nil {
			return nil, nil, err
		}
	}
	env, err := mergeEnv(s.environ(), m.Env)
	if err != nil {
		return nil, nil, err
	}
	argv0, err := lookPath(m.Argv[0], env, cwd)
	if err != nil {
		return nil, nil, err
	}

	var closeAfter, closeOnErr []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	fail := func(err error) (*proc, *os.File, error) {
		for _, f := range closeOnErr {
			f.Close()
		}
		return nil, nil, err
	}
	var stdinR, stdinW *os.File
	if m.Stdin {
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			return fail(err)
		}
		closeOnErr = append(closeOnErr, stdinW)
	} else if stdinR, err = os.Open(os.DevNull); err != nil {
		return fail(err)
	}
	closeAfter = append(closeAfter, stdinR)
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	closeAfter, closeOnErr = append(closeAfter, outW), append(closeOnErr, outR)
	errR, errW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	closeAfter, closeOnErr = append(closeAfter, errW), append(closeOnErr, errR)

	p := &proc{id: m.ID, stdout: outR, stderr: errR, exited: make(chan struct{})}
	s.openStream(m.ID)
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{stdinR.Fd(), outW.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	reaper.mu.Lock()
	pid, _, err := syscall.StartProcess(argv0, m.Argv, attr)
	if err == nil {
		reaper.waiting[pid] = func(ws syscall.WaitStatus) {
			p.status = ws
			close(p.exited)
		}
	}
	reaper.mu.Unlock()
	if err != nil {
		return fail(fmt.Errorf("start %s: %w", m.Argv[0], err))
	}
	p.pid = pid
	raiseOOMScore(pid)

	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		syscall.Kill(-pid, syscall.SIGKILL)
		return fail(fmt.Errorf("agent shutting down: %w", ErrClosed))
	}
	s.procs[m.ID] = p
	s.groups[pid] = true
	s.mu.Unlock()
	return p, stdinW, nil
}

// pump streams one of a process's outputs.
func (s *server) pump(st *stream, id uint64, stream int, f *os.File) {
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			data := append([]byte(nil), buf[:n]...)
			if st.send(s, &msg{ID: id, Op: "out", Stream: stream, Data: data}) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *server) signal(m *msg) {
	s.mu.Lock()
	p := s.procs[m.Ref]
	s.mu.Unlock()
	switch {
	case p == nil:
		s.reply(errMsg(m.ID, fmt.Errorf("process %d: %w", m.Ref, ErrNoProcess)))
		return
	case m.Signal <= 0 || m.Signal > 64:
		s.reply(errMsg(m.ID, fmt.Errorf("signal %d: %w", m.Signal, ErrInvalid)))
		return
	}
	select {
	case <-p.exited:
		s.reply(errMsg(m.ID, fmt.Errorf("process %d: %w", p.pid, ErrExited)))
		return
	default:
	}
	err := syscall.Kill(-p.pid, syscall.Signal(m.Signal))
	if err == syscall.ESRCH {
		err = fmt.Errorf("process %d: %w", p.pid, ErrExited)
	}
	s.fail(m.ID, err)
}

// mergeEnv is base with add's entries set.
func mergeEnv(base []string, add map[string]string) ([]string, error) {
	out := make([]string, 0, len(base)+len(add))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := add[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range add {
		if !validEnv(k, v) {
			return nil, fmt.Errorf("environment variable %q: %w", k, ErrInvalid)
		}
		out = append(out, k+"="+v)
	}
	return out, nil
}

// validEnv says whether NAME=value can be an environment entry.
func validEnv(k, v string) bool {
	return k != "" && !strings.ContainsAny(k, "=\x00") && !strings.ContainsRune(v, 0)
}

// lookPath finds name in env's PATH as a shell would.
func lookPath(name string, env []string, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable not found: %w", name, ErrNotExist)
}

// killAll sends SIGKILL to every process group the agent started (whose
// leaders may have exited, leaving background children) and, when it owns
// every child (PID 1 or a subreaper), to every child too.
func killAll(groups []int, all bool) {
	for _, g := range groups {
		syscall.Kill(-g, syscall.SIGKILL)
	}
	switch {
	case os.Getpid() == 1:
		syscall.Kill(-1, syscall.SIGKILL) // all but itself
	case all:
		killChildren()
	}
}

// killChildren kills each child of the agent's (orphans reparented to a
// subreaper included) and its process group.
func killChildren() {
	self, selfGroup := os.Getpid(), syscall.Getpgrp()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold anything, so cut
		// at the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		if ppid != self {
			continue
		}
		syscall.Kill(pid, syscall.SIGKILL)
		if pgrp > 1 && pgrp != selfGroup {
			syscall.Kill(-pgrp, syscall.SIGKILL)
		}
	}
}
