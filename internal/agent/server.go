package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"golang.org/x/sys/unix"
)

// ServeOptions configures Serve; a nil *ServeOptions takes every default.
type ServeOptions struct {
	// Home is the home directory: relative paths resolve against it,
	// commands start in it, SaveHome and RestoreHome work on it.
	// Default engine.HomeDir.
	Home string
	// Deadline is when the agent kills every process and returns; zero
	// is none. SetDeadline moves it.
	Deadline time.Time
	// Subreaper makes the agent the reaper of orphaned descendants
	// (PR_SET_CHILD_SUBREAPER) and has it kill every child it has at the
	// end, not only its process groups. The binary sets it when it is not
	// PID 1; a test that shares its process with other children leaves it
	// off.
	Subreaper bool
	// WaitDelay is how long a process's output may stay open after it
	// exited (a background child holding the pipes) before the agent
	// stops reading and reports the exit. Default 2s.
	WaitDelay time.Duration
	// Logf logs what the agent does not tell the host; nil discards.
	Logf func(format string, args ...any)
}

// server is one agent connection.
type server struct {
	home      string
	waitDelay time.Duration
	subreaper bool
	logf      func(string, ...any)
	conn      io.ReadWriteCloser

	ctx    context.Context // ends at shutdown
	cancel context.CancelFunc
	wmu    sync.Mutex // serialises frame writes
	wg     sync.WaitGroup

	mu         sync.Mutex
	procs      map[uint64]*proc   // by spawn id
	groups     map[int]bool       // every process group started, for the end
	streams    map[uint64]*stream // outgoing streams by id
	uploads    map[uint64]*upload // incoming transfers by ref
	env        map[string]string  // the sandbox's environment (setEnv)
	egressPort int                // the loopback port relayed (egress); 0 if none
	timer      *time.Timer        // the deadline
	expired    chan struct{}      // closed at the deadline
	expireMu   sync.Once
}

// handler serves one op. Inline handlers run on the read loop and must
// not block; the others run in a goroutine of their own.
type handler struct {
	fn     func(s *server, m *msg)
	inline bool
}

// ops is every op the agent serves. To add one, add a line here.
var ops map[string]handler

func init() {
	ops = map[string]handler{
		"ping":     {fn: (*server).ping, inline: true},
		"deadline": {fn: (*server).setDeadline, inline: true},
		"env":      {fn: (*server).setEnv, inline: true},
		"spawn":    {fn: (*server).spawn},
		"signal":   {fn: (*server).signal, inline: true},
		"chunk":    {fn: (*server).chunk, inline: true},
		"ack":      {fn: (*server).ack, inline: true},
		"cancel":   {fn: (*server).cancelRef, inline: true},
		"stat":     {fn: (*server).stat},
		"list":     {fn: (*server).list},
		"readfile": {fn: (*server).readFile},
		"write":    {fn: (*server).writeFile},
		"remove":   {fn: (*server).remove},
		"mkdir":    {fn: (*server).mkdir},
		"move":     {fn: (*server).move},
		"save":     {fn: (*server).saveHome},
		"restore":  {fn: (*server).restoreHome},
		"egress":   {fn: (*server).egress},
	}
}

// Serve speaks the agent's side of the protocol on conn until the peer
// closes it, ctx ends or the deadline passes; then it kills every process
// it started (SIGKILL to each process group), closes conn and returns:
// nil at the end of the stream or the deadline, ctx's error, or the
// protocol error that made it hang up (a frame over MaxFrame, garbage).
func Serve(ctx context.Context, conn io.ReadWriteCloser, opts *ServeOptions) error {
	if opts == nil {
		opts = &ServeOptions{}
	}
	s := &server{
		home:      opts.Home,
		waitDelay: opts.WaitDelay,
		subreaper: opts.Subreaper,
		logf:      opts.Logf,
		conn:      conn,
		procs:     map[uint64]*proc{},
		groups:    map[int]bool{},
		streams:   map[uint64]*stream{},
		uploads:   map[uint64]*upload{},
		expired:   make(chan struct{}),
	}
	if s.home == "" {
		s.home = engine.HomeDir
	}
	if s.waitDelay <= 0 {
		s.waitDelay = 2 * time.Second
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	startReaper()
	if s.subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			s.logf("agent: subreaper: %v", err)
		}
	}
	if !opts.Deadline.IsZero() {
		s.moveDeadline(opts.Deadline)
	}

	readErr := make(chan error, 1)
	go func() { readErr <- s.readLoop() }()
	var err error
	select {
	case err = <-readErr:
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
			err = nil
		}
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.expired:
		s.logf("agent: deadline passed")
	}
	s.shutdown()
	return err
}

func (s *server) readLoop() error {
	for {
		m := new(msg)
		if err := readFrame(s.conn, m); err != nil {
			if s.ctx.Err() != nil {
				return io.EOF
			}
			if !errors.Is(err, io.EOF) {
				s.logf("agent: read: %v", err)
			}
			return err
		}
		h, ok := ops[m.Op]
		if !ok {
			s.reply(errMsg(m.ID, fmt.Errorf("unknown op %q: %w", m.Op, ErrInvalid)))
			continue
		}
		if h.inline {
			h.fn(s, m)
			continue
		}
		if !s.goRun(func() { h.fn(s, m) }) {
			return io.EOF
		}
	}
}

// goRun runs f in a goroutine Serve waits for; false after shutdown.
func (s *server) goRun(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// reply sends one frame; a failed write ends the connection.
func (s *server) reply(m *msg) {
	buf, err := encodeFrame(m)
	if err != nil {
		buf, _ = encodeFrame(errMsg(m.ID, err))
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	if _, err := s.conn.Write(buf); err != nil {
		s.logf("agent: write: %v", err)
		s.conn.Close()
	}
}

func (s *server) ok(id uint64) { s.reply(&msg{ID: id, Op: "ok"}) }

// fail replies to id with err, or ok when err is nil.
func (s *server) fail(id uint64, err error) {
	if err != nil {
		s.reply(errMsg(id, err))
		return
	}
	s.ok(id)
}

// path resolves p against the home directory.
func (s *server) path(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", ErrInvalid)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.home, p)
	}
	return filepath.Clean(p), nil
}

func (s *server) ping(m *msg) { s.ok(m.ID) }

func (s *server) setDeadline(m *msg) {
	if m.Deadline <= 0 {
		s.reply(errMsg(m.ID, fmt.Errorf("no deadline: %w", ErrInvalid)))
		return
	}
	s.ok(m.ID)
	s.moveDeadline(time.Unix(0, m.Deadline))
}

// setEnv sets the sandbox's environment: the base of every process
// started from then on, over the agent's own environment and under the
// spawn's. The host leaves out the names the sandbox fixes (HOME, PATH,
// ...). Each call replaces the last.
func (s *server) setEnv(m *msg) {
	for k, v := range m.Env {
		if !validEnv(k, v) {
			s.reply(errMsg(m.ID, fmt.Errorf("environment variable %q: %w", k, ErrInvalid)))
			return
		}
	}
	s.mu.Lock()
	s.env = maps.Clone(m.Env)
	s.mu.Unlock()
	s.ok(m.ID)
}

// environ is the base environment of a process: the agent's own with the
// sandbox's (setEnv) over it.
func (s *server) environ() []string {
	s.mu.Lock()
	env := s.env
	s.mu.Unlock()
	out, _ := mergeEnv(os.Environ(), env) // setEnv checked the entries
	return out
}

func (s *server) moveDeadline(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timer = time.AfterFunc(time.Until(t), func() {
		s.expireMu.Do(func() { close(s.expired) })
	})
}

// stream is the sending side of one flow-controlled stream.
type stream struct {
	credits chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
}

// openStream registers an outgoing stream under id.
func (s *server) openStream(id uint64) *stream {
	st := &stream{credits: make(chan struct{}, window)}
	for range window {
		st.credits <- struct{}{}
	}
	st.ctx, st.cancel = context.WithCancel(s.ctx)
	s.mu.Lock()
	s.streams[id] = st
	s.mu.Unlock()
	return st
}

func (s *server) closeStream(id uint64) {
	s.mu.Lock()
	st := s.streams[id]
	delete(s.streams, id)
	s.mu.Unlock()
	if st != nil {
		st.cancel()
	}
}

// send sends one data frame of the stream, waiting for a credit.
func (st *stream) send(s *server, m *msg) error {
	select {
	case <-st.credits:
	case <-st.ctx.Done():
		return fmt.Errorf("stream canceled: %w", ErrClosed)
	}
	s.reply(m)
	return nil
}

func (s *server) ack(m *msg) {
	s.mu.Lock()
	st := s.streams[m.Ref]
	s.mu.Unlock()
	if st == nil {
		return
	}
	for range max(m.N, 1) {
		select {
		case st.credits <- struct{}{}:
		default:
			return
		}
	}
}

// cancelRef abandons a download or an upload.
func (s *server) cancelRef(m *msg) {
	s.mu.Lock()
	st := s.streams[m.Ref]
	up := s.uploads[m.Ref]
	s.mu.Unlock()
	if st != nil {
		st.cancel()
	}
	if up != nil {
		up.abort()
	}
}

// shutdown kills every process and waits, a bounded while, for them and
// for the goroutines serving requests.
func (s *server) shutdown() {
	s.mu.Lock()
	s.cancel()
	if s.timer != nil {
		s.timer.Stop()
	}
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	groups := make([]int, 0, len(s.groups))
	for g := range s.groups {
		groups = append(groups, g)
	}
	ups := make([]*upload, 0, len(s.uploads))
	for _, u := range s.uploads {
		ups = append(ups, u)
	}
	s.mu.Unlock()
	s.conn.Close()
	for _, u := range ups {
		u.abort()
	}
	give := time.Now().Add(5 * time.Second)
	for {
		killAll(groups, s.subreaper)
		alive := 0
		for _, p := range procs {
			select {
			case <-p.exited:
			default:
				alive++
			}
		}
		if alive == 0 || time.Now().After(give) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range procs {
		p.closePipes()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.logf("agent: requests still running at the end")
	}
}
