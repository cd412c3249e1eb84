package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// serve starts an agent on one end of a pipe with home a fresh directory
// and returns a client on the other end and Serve's result.
func serve(t *testing.T, opts *ServeOptions) (*Client, string, <-chan error) {
	t.Helper()
	if opts == nil {
		opts = &ServeOptions{}
	}
	if opts.Home == "" {
		opts.Home = t.TempDir()
	}
	opts.Logf = t.Logf
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), a, opts); close(done) }()
	c := NewClient(b)
	t.Cleanup(func() {
		c.Close()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return c, opts.Home, done
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// collect reads a process's events to the end.
func collect(t *testing.T, p Process) (stdout, stderr string, exit Event) {
	t.Helper()
	var o, e bytes.Buffer
	got := false
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-p.Events():
			if !ok {
				if !got {
					t.Fatal("events closed without an exit event")
				}
				return o.String(), e.String(), exit
			}
			switch ev.Stream {
			case 1:
				o.Write(ev.Data)
			case 2:
				e.Write(ev.Data)
			case 0:
				exit, got = ev, true
			}
		case <-timeout:
			t.Fatal("process did not finish")
		}
	}
}

func run(t *testing.T, c *Client, argv ...string) (string, string, Event) {
	t.Helper()
	p, err := c.Spawn(ctxT(t), SpawnRequest{Argv: argv})
	if err != nil {
		t.Fatalf("Spawn %v: %v", argv, err)
	}
	return collect(t, p)
}

func TestHomeDirMatchesEngine(t *testing.T) {
	if (&ServeOptions{}).Home != "" {
		t.Fatal("zero options have a home")
	}
	s := &server{home: engine.HomeDir}
	if p, _ := s.path("x"); p != "/home/user/x" {
		t.Fatalf("relative path resolves to %q", p)
	}
}

func TestPingAndSpawn(t *testing.T) {
	c, home, _ := serve(t, nil)
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	out, errOut, exit := run(t, c, "sh", "-c", "echo hello; echo oops >&2; pwd; echo $FOO; exit 3")
	if want := "hello\n" + home + "\n\n"; out != want {
		t.Errorf("stdout %q, want %q", out, want)
	}
	if errOut != "oops\n" || exit.ExitCode != 3 || exit.Signal != 0 {
		t.Errorf("stderr %q exit %+v", errOut, exit)
	}
	p, err := c.Spawn(ctxT(t), SpawnRequest{Argv: []string{"sh", "-c", "echo $FOO; pwd"}, Env: map[string]string{"FOO": "bar"}, Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := collect(t, p); out != "bar\n/\n" {
		t.Errorf("env/cwd: %q", out)
	}
	if _, err := c.Spawn(ctxT(t), SpawnRequest{Argv: []string{"no-such-command-xyz"}}); !errors.Is(err, ErrNotExist) {
		t.Errorf("missing command: %v", err)
	}
	if _, err := c.Spawn(ctxT(t), SpawnRequest{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty argv: %v", err)
	}
}

func TestStdinRoundTrip(t *testing.T) {
	c, _, _ := serve(t, nil)
	ctx := ctxT(t)
	p, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 100_000) // 1.6 MB: many chunks, past the window
	go func() {
		if err := p.Write(ctx, big); err != nil {
			t.Error(err)
		}
		if err := p.CloseStdin(ctx); err != nil {
			t.Error(err)
		}
	}()
	out, _, exit := collect(t, p)
	if out != string(big) || exit.ExitCode != 0 {
		t.Fatalf("cat returned %d bytes, exit %+v", len(out), exit)
	}
	if err := p.Signal(ctx, syscall.SIGTERM); !errors.Is(err, ErrExited) {
		t.Errorf("signal after exit: %v", err)
	}
	q, _ := c.Spawn(ctx, SpawnRequest{Argv: []string{"true"}})
	if err := q.Write(ctx, []byte("x")); !errors.Is(err, ErrInvalid) {
		t.Errorf("write without stdin: %v", err)
	}
	collect(t, q)
}

func TestKillBySignal(t *testing.T) {
	c, _, _ := serve(t, nil)
	ctx := ctxT(t)
	p, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "echo up; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	ev := <-p.Events()
	if string(ev.Data) != "up\n" {
		t.Fatalf("first event %+v", ev)
	}
	if err := p.Signal(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _, exit := collect(t, p)
	if exit.ExitCode != 128+9 || exit.Signal != 9 {
		t.Fatalf("exit %+v", exit)
	}
}

func TestManyConcurrent(t *testing.T) {
	c, _, _ := serve(t, nil)
	const n = 20
	errs := make(chan error, n)
	for i := range n {
		go func() {
			p, err := c.Spawn(ctxT(t), SpawnRequest{Argv: []string{"sh", "-c", "i=0; while [ $i -lt 200 ]; do echo line$i-" + strconv.Itoa(i) + "; i=$((i+1)); done; exit " + strconv.Itoa(i)}})
			if err != nil {
				errs <- err
				return
			}
			var out bytes.Buffer
			var exit Event
			for ev := range p.Events() {
				out.Write(ev.Data)
				if ev.Stream == 0 {
					exit = ev
				}
			}
			if exit.ExitCode != i || strings.Count(out.String(), "-"+strconv.Itoa(i)+"\n") != 200 {
				errs <- errors.New("process " + strconv.Itoa(i) + ": wrong output or exit")
				return
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A reader that does not read one process's events holds back only that
// process: another still runs to the end.
func TestSlowReaderBlocksOnlyItsProcess(t *testing.T) {
	c, _, _ := serve(t, nil)
	ctx := ctxT(t)
	slow, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"sh", "-c", "yes | head -c 10000000"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let it fill its window
	out, _, exit := run(t, c, "echo", "fast")
	if out != "fast\n" || exit.ExitCode != 0 {
		t.Fatalf("fast process: %q %+v", out, exit)
	}
	o, _, exit := collect(t, slow)
	if len(o) != 10000000 || exit.ExitCode != 0 {
		t.Fatalf("slow process: %d bytes, %+v", len(o), exit)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || len(b) < i+3 || b[i+2] != 'Z'
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for range 600 {
		if !alive(pid) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("process %d still alive", pid)
}

// spawnOrphan leaves a background sleep behind a shell that has exited
// and returns the sleep's pid.
func spawnOrphan(t *testing.T, c *Client) int {
	t.Helper()
	out, _, exit := run(t, c, "sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!")
	if exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || !alive(pid) {
		t.Fatalf("background pid %q: %v", out, err)
	}
	return pid
}

func TestCloseKillsOrphans(t *testing.T) {
	c, _, done := serve(t, nil)
	pid := spawnOrphan(t, c)
	c.Close()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	waitGone(t, pid)
}

func TestExitWaitsNoLongerThanWaitDelay(t *testing.T) {
	c, _, _ := serve(t, &ServeOptions{WaitDelay: 100 * time.Millisecond})
	// The background sleep holds stdout open; the exit still comes.
	out, _, exit := run(t, c, "sh", "-c", "echo $!; sleep 1000 & echo started")
	if !strings.HasSuffix(out, "started\n") || exit.ExitCode != 0 {
		t.Fatalf("%q %+v", out, exit)
	}
}

func TestDeadlineKillsEverything(t *testing.T) {
	c, _, done := serve(t, &ServeOptions{Deadline: time.Now().Add(3 * time.Second)})
	pid := spawnOrphan(t, c)
	p, err := c.Spawn(ctxT(t), SpawnRequest{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Serve did not end at the deadline")
	}
	waitGone(t, pid)
	waitGone(t, p.PID())
	if err := c.Ping(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("ping after the deadline: %v", err)
	}
}

func TestSetDeadlineExtends(t *testing.T) {
	c, _, done := serve(t, &ServeOptions{Deadline: time.Now().Add(2 * time.Second)})
	if err := c.SetDeadline(ctxT(t), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve ended at the old deadline: %v", err)
	case <-time.After(4 * time.Second):
	}
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeadline(ctxT(t), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a deadline moved into the past did not end Serve")
	}
}

func TestFileOps(t *testing.T) {
	c, home, _ := serve(t, nil)
	ctx := ctxT(t)
	data := bytes.Repeat([]byte("x"), 100_000)
	if n, err := c.WriteFile(ctx, "a/b/c.txt", bytes.NewReader(data), 1<<20, 0o600); err != nil || n != int64(len(data)) {
		t.Fatalf("WriteFile: %d %v", n, err)
	}
	fi, err := os.Stat(filepath.Join(home, "a/b/c.txt"))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != int64(len(data)) {
		t.Fatalf("written file: %v %v", fi, err)
	}
	var buf bytes.Buffer
	if n, err := c.ReadFile(ctx, filepath.Join(home, "a/b/c.txt"), 1<<20, &buf); err != nil || n != int64(len(data)) || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("ReadFile: %d %v", n, err)
	}
	info, err := c.Stat(ctx, "a/b/c.txt")
	if err != nil || info.Type != "file" || info.Size != int64(len(data)) || info.Name != "c.txt" {
		t.Fatalf("Stat: %+v %v", info, err)
	}
	os.Symlink("c.txt", filepath.Join(home, "a/b/link"))
	if info, _ := c.Stat(ctx, "a/b/link"); info.Type != "symlink" {
		t.Errorf("Stat of a symlink: %+v", info)
	}
	list, err := c.List(ctx, "a/b")
	if err != nil || len(list) != 2 || list[0].Name != "c.txt" || list[1].Name != "link" {
		t.Fatalf("List: %+v %v", list, err)
	}
	if err := c.Mkdir(ctx, "d/e"); err != nil {
		t.Fatal(err)
	}
	if err := c.Move(ctx, "a/b/c.txt", "d/e/moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, "d/e/moved")); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after Remove: %v", err)
	}

	for _, tc := range []struct {
		name string
		err  error
		f    func() error
	}{
		{"stat missing", ErrNotExist, func() error { _, err := c.Stat(ctx, "nope"); return err }},
		{"list a file", ErrNotDir, func() error {
			os.WriteFile(filepath.Join(home, "f"), []byte("1"), 0o644)
			_, err := c.List(ctx, "f")
			return err
		}},
		{"read a dir", ErrIsDir, func() error { _, err := c.ReadFile(ctx, "a", 10, io.Discard); return err }},
		{"read over cap", ErrTooLarge, func() error { _, err := c.ReadFile(ctx, "f", 0, io.Discard); return err }},
		{"read missing", ErrNotExist, func() error { _, err := c.ReadFile(ctx, "nope", 10, io.Discard); return err }},
		{"mkdir over a file", ErrNotDir, func() error { return c.Mkdir(ctx, "f/x") }},
		{"move missing", ErrNotExist, func() error { return c.Move(ctx, "nope", "x") }},
		{"remove missing", ErrNotExist, func() error { return c.Remove(ctx, "nope") }},
		{"remove home", ErrInvalid, func() error { return c.Remove(ctx, home) }},
		{"write onto a dir", ErrIsDir, func() error { _, err := c.WriteFile(ctx, "a", strings.NewReader("x"), 10, 0); return err }},
		{"write under a file", ErrNotDir, func() error { _, err := c.WriteFile(ctx, "f/x", strings.NewReader("x"), 10, 0); return err }},
		{"move a dir onto a full one", ErrExist, func() error {
			os.MkdirAll(filepath.Join(home, "full/x"), 0o755)
			os.MkdirAll(filepath.Join(home, "empty"), 0o755)
			return c.Move(ctx, "empty", "full")
		}},
	} {
		if err := tc.f(); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
	if os.Getuid() != 0 {
		os.WriteFile(filepath.Join(home, "secret"), []byte("s"), 0o000)
		if _, err := c.ReadFile(ctx, "secret", 10, io.Discard); !errors.Is(err, ErrPermission) {
			t.Errorf("unreadable: %v", err)
		}
	}
}

func TestReadFileRefusesFIFO(t *testing.T) {
	c, home, _ := serve(t, nil)
	fifo := filepath.Join(home, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink("fifo", filepath.Join(home, "to-fifo"))
	for _, p := range []string{"fifo", "to-fifo", "/dev/null"} {
		if _, err := c.ReadFile(ctxT(t), p, 10, io.Discard); !errors.Is(err, ErrInvalid) {
			t.Errorf("ReadFile %s: %v", p, err)
		}
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) { return len(p), nil }

func TestWriteFileOverCapLeavesNothing(t *testing.T) {
	c, home, _ := serve(t, nil)
	ctx := ctxT(t)
	if _, err := c.WriteFile(ctx, "big", endless{}, 100_000, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WriteFile: %v", err)
	}
	os.WriteFile(filepath.Join(home, "old"), []byte("old"), 0o644)
	if _, err := c.WriteFile(ctx, "old", bytes.NewReader(make([]byte, 1000)), 999, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WriteFile: %v", err)
	}
	// The agent enforces the cap too, whatever the client does.
	m := &msg{Op: "write", Path: "raw", Max: 10}
	open, err := c.call(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.call(ctx, &msg{Op: "chunk", Ref: open.ID, Data: make([]byte, 11)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("agent's cap: %v", err)
	}
	c.Ping(ctx)
	ents, _ := os.ReadDir(home)
	if len(ents) != 1 || ents[0].Name() != "old" {
		t.Fatalf("home holds %v", ents)
	}
	if b, _ := os.ReadFile(filepath.Join(home, "old")); string(b) != "old" {
		t.Fatalf("old file became %q", b)
	}
}

func TestSaveRestoreRoundTrip(t *testing.T) {
	c, home, _ := serve(t, nil)
	ctx := ctxT(t)
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.MkdirAll(filepath.Join(home, "dir/sub"), 0o750)
	os.WriteFile(filepath.Join(home, "dir/sub/f"), bytes.Repeat([]byte{1, 2, 3}, 50_000), 0o640)
	os.WriteFile(filepath.Join(home, "x.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(home, "empty"), nil, 0o600)
	os.Symlink("/etc/passwd", filepath.Join(home, "abs-link"))
	os.Symlink("dir/sub", filepath.Join(home, "rel-link"))
	syscall.Mkfifo(filepath.Join(home, "fifo"), 0o644)
	os.Chtimes(filepath.Join(home, "dir/sub/f"), mtime, mtime)
	os.Chtimes(filepath.Join(home, "dir"), mtime, mtime)

	var archive bytes.Buffer
	n, err := c.SaveHome(ctx, 1<<30, &archive)
	if err != nil || n != int64(archive.Len()) {
		t.Fatalf("SaveHome: %d %v", n, err)
	}
	if _, err := c.SaveHome(ctx, 1000, io.Discard); !errors.Is(err, ErrTooLarge) {
		t.Errorf("SaveHome over cap: %v", err)
	}

	c2, home2, _ := serve(t, nil)
	if err := c2.RestoreHome(ctx, bytes.NewReader(archive.Bytes())); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(home2, "fifo")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the FIFO came back: %v", err)
	}
	os.Remove(filepath.Join(home, "fifo"))
	if a, b := describe(t, home), describe(t, home2); a != b {
		t.Fatalf("restored home differs:\n%s\nwant\n%s", b, a)
	}
}

// describe lists a tree: each entry's name, type, mode, content or link
// and (for files and directories) mtime.
func describe(t *testing.T, dir string) string {
	var sb strings.Builder
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		sb.WriteString(rel + " " + fi.Mode().String())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			sb.WriteString(" -> " + l)
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			sb.WriteString(" " + strconv.Itoa(len(b)) + " " + strconv.Quote(string(b[:min(len(b), 20)])) + " " + fi.ModTime().UTC().Format(time.RFC3339))
		case fi.IsDir():
			sb.WriteString(" " + fi.ModTime().UTC().Format(time.RFC3339))
		}
		sb.WriteString("\n")
		return nil
	})
	return sb.String()
}

func TestRestoreRefusesEscapes(t *testing.T) {
	type entry struct {
		name, link string
		typ        byte
	}
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"dotdot", []entry{{name: "../escaped", typ: tar.TypeReg}}},
		{"dotdot inside", []entry{{name: "a/../../escaped", typ: tar.TypeReg}}},
		{"absolute", []entry{{name: "/tmp/escaped", typ: tar.TypeReg}}},
		{"through a symlink", []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "l/escaped", typ: tar.TypeReg}}},
		{"through an absolute symlink", []entry{{name: "l", link: "/", typ: tar.TypeSymlink}, {name: "l/escaped", typ: tar.TypeReg}}},
		{"dir through a symlink", []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "l/escaped/", typ: tar.TypeDir}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			home := filepath.Join(parent, "home")
			os.Mkdir(home, 0o755)
			c, _, _ := serve(t, &ServeOptions{Home: home})
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, e := range tc.entries {
				h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644}
				if e.typ == tar.TypeReg {
					h.Size = 4
				}
				tw.WriteHeader(h)
				if e.typ == tar.TypeReg {
					tw.Write([]byte("evil"))
				}
			}
			tw.Close()
			if err := c.RestoreHome(ctxT(t), &buf); !errors.Is(err, ErrInvalid) {
				t.Errorf("RestoreHome: %v, want ErrInvalid", err)
			}
			for _, p := range []string{filepath.Join(parent, "escaped"), "/tmp/escaped", "/escaped"} {
				if _, err := os.Lstat(p); err == nil {
					os.RemoveAll(p)
					t.Errorf("%s was written", p)
				}
			}
			if err := c.Ping(ctxT(t)); err != nil {
				t.Errorf("agent after the refusal: %v", err)
			}
		})
	}
}

func TestOversizedFrameRefused(t *testing.T) {
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), a, &ServeOptions{Home: t.TempDir()}) }()
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], MaxFrame+1)
	b.Write(h[:])
	select {
	case err := <-done:
		if !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve kept reading")
	}
	if _, err := b.Write([]byte{0}); err == nil {
		t.Error("the connection is still open")
	}
}

func TestGarbageClosesConnection(t *testing.T) {
	for _, in := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{0, 0, 0, 5, '{', '"', 'i', 'd', '"'},
		{0, 0, 0, 2, '{', '}'},
		{0, 0, 0, 0},
		{0, 0, 0, 4, 'n', 'u', 'l', 'l'},
	} {
		a, b := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- Serve(context.Background(), a, &ServeOptions{Home: t.TempDir()}) }()
		go b.Write(in)
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%q: Serve returned nil", in)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%q: Serve kept reading", in)
		}
		b.Close()
	}
}

func TestUnknownOp(t *testing.T) {
	c, _, _ := serve(t, nil)
	if _, err := c.call(ctxT(t), &msg{Op: "frobnicate"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown op: %v", err)
	}
}

func TestIdleRSS(t *testing.T) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS") {
			t.Logf("test process (agent package linked in, idle server not counted): %s", l)
		}
	}
}

func FuzzFrame(f *testing.F) {
	good, _ := encodeFrame(&msg{ID: 1, Op: "spawn", Argv: []string{"sh"}, Data: []byte("hi")})
	f.Add(good)
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0, 0, 0, 4, 'n', 'u', 'l', 'l'})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m msg
		if err := readFrame(bytes.NewReader(data), &m); err != nil {
			return
		}
		buf, err := encodeFrame(&m)
		if err != nil {
			t.Fatalf("a decoded frame does not encode: %v", err)
		}
		var m2 msg
		if err := readFrame(bytes.NewReader(buf), &m2); err != nil {
			t.Fatalf("a re-encoded frame does not decode: %v", err)
		}
	})
}

// forger answers every request on conn as code in the sandbox could, by
// writing to the agent's stdout: a download's stream gets data frames
// until the client stops reading, ignoring the max it was asked for.
func forger(t *testing.T, conn net.Conn, chunk int) {
	t.Helper()
	go func() {
		for {
			var m msg
			if err := readFrame(conn, &m); err != nil {
				return
			}
			switch m.Op {
			case "readfile", "save":
				for range 1000 {
					b, _ := encodeFrame(&msg{ID: m.ID, Op: "data", Data: make([]byte, chunk)})
					if _, err := conn.Write(b); err != nil {
						return
					}
				}
				b, _ := encodeFrame(&msg{ID: m.ID, Op: "done"})
				conn.Write(b)
			}
		}
	}()
}

// The host holds a download's cap itself: a forged stream past max is
// ErrTooLarge, and not a byte past max reaches the writer (a paused
// sandbox's archive on the host's disk, a file sent to a client).
func TestDownloadCapHeldByHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		get  func(c *Client, w io.Writer) (int64, error)
	}{
		{"readfile", func(c *Client, w io.Writer) (int64, error) { return c.ReadFile(ctxT(t), "f", 100_000, w) }},
		{"save", func(c *Client, w io.Writer) (int64, error) { return c.SaveHome(ctxT(t), 100_000, w) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			forger(t, b, 30_000)
			c := NewClient(a)
			defer c.Close()
			var got bytes.Buffer
			n, err := tc.get(c, &got)
			if !errors.Is(err, ErrTooLarge) {
				t.Errorf("err %v, want ErrTooLarge", err)
			}
			if n > 100_000 || got.Len() > 100_000 || int64(got.Len()) != n {
				t.Errorf("wrote %d bytes (n %d) past a cap of 100000", got.Len(), n)
			}
		})
	}
}

// The OOM killer is to take the code before the agent: what the agent
// starts gets engine.CodeOOMScore, and the agent keeps its own score.
func TestChildrenAreTheOOMKillersFirstChoice(t *testing.T) {
	before, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatalf("this test needs /proc: %v", err)
	}
	if strings.TrimSpace(string(before)) == string(childOOMScore) {
		t.Fatalf("the test process already has oom_score_adj %s; nothing to tell apart", childOOMScore)
	}
	c, _, _ := serve(t, nil)
	out, errOut, exit := run(t, c, "sh", "-c", childScore)
	if exit.ExitCode != 0 || out != string(childOOMScore)+"\n" {
		t.Fatalf("child's oom_score_adj: %q %q %+v, want %s", out, errOut, exit, childOOMScore)
	}
	if after, _ := os.ReadFile("/proc/self/oom_score_adj"); string(after) != string(before) {
		t.Errorf("the agent's own oom_score_adj went %q → %q", before, after)
	}
}

// childScore prints the shell's own oom_score_adj once the agent's write,
// which lands just after the exec, is in (or what it is after 5 s).
const childScore = `i=0; while [ "$(cat /proc/$$/oom_score_adj)" != 1000 ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; cat /proc/$$/oom_score_adj`

// TestSetEnv: the sandbox's environment is the base of later spawns, over
// the agent's own and under a spawn's own entries, and a second call
// replaces the first.
func TestSetEnv(t *testing.T) {
	t.Setenv("VERTAL_AGENT_FIXED", "fixed")
	c, _, _ := serve(t, nil)
	if err := c.SetEnv(ctxT(t), map[string]string{"A": "1", "B": "2", "VERTAL_AGENT_FIXED": "evil"}); err != nil {
		t.Fatal(err)
	}
	p, err := c.Spawn(ctxT(t), SpawnRequest{Argv: []string{"sh", "-c", `echo "$A $B $VERTAL_AGENT_FIXED"`}, Env: map[string]string{"B": "own"}})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, _ := collect(t, p); out != "1 own evil\n" {
		t.Errorf("environment %q, want %q", out, "1 own evil\n")
	}
	if err := c.SetEnv(ctxT(t), map[string]string{"B": "3"}); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, c, "sh", "-c", `echo "[$A] $B $VERTAL_AGENT_FIXED"`); out != "[] 3 fixed\n" {
		t.Errorf("after a second SetEnv %q", out)
	}
	for _, bad := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A": "x\x00y"}} {
		if err := c.SetEnv(ctxT(t), bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetEnv(%q): %v, want ErrInvalid", bad, err)
		}
	}
}

// egressServer listens on a unix socket in a fresh directory: each
// connection gets "hi\n" at once, then, once the peer half-closed,
// "got " and all it sent, and the end of the stream. quiet: each
// connection is only read to its end, then closed.
func egressServer(t *testing.T, quiet bool) (path string, conns <-chan struct{}) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "proxy.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan struct{}, 1024)
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			go func() {
				defer c.Close()
				if quiet {
					io.Copy(io.Discard, c)
					return
				}
				io.WriteString(c, "hi\n")
				b, err := io.ReadAll(c) // until the relayed half-close
				if err != nil {
					return
				}
				c.Write(append([]byte("got "), b...))
			}()
		}
	}()
	return path, accepted
}

func TestEgressRelay(t *testing.T) {
	sock, _ := egressServer(t, false)
	c, _, done := serve(t, nil)
	port := e2etest.FreePort(t)
	if err := c.Egress(ctxT(t), sock, port); err != nil {
		t.Fatalf("Egress: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for i := range 3 { // each connection gets a socket connection of its own
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		// Host to sandbox before the sandbox sent anything.
		hi := make([]byte, 3)
		if _, err := io.ReadFull(conn, hi); err != nil || string(hi) != "hi\n" {
			t.Fatalf("greeting %q, %v", hi, err)
		}
		payload := bytes.Repeat([]byte(strconv.Itoa(i)), 300<<10)
		if _, err := conn.Write(payload); err != nil {
			t.Fatal(err)
		}
		// The half-close reaches the host, which answers after it; the
		// host's close reaches the sandbox as the end of the stream.
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(conn)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if want := append([]byte("got "), payload...); !bytes.Equal(got, want) {
			t.Errorf("connection %d: answer of %d bytes, want %d", i, len(got), len(want))
		}
		conn.Close()
	}

	// One relay per agent; the arguments are checked.
	if err := c.Egress(ctxT(t), sock, e2etest.FreePort(t)); !errors.Is(err, ErrExist) {
		t.Errorf("a second Egress: %v, want ErrExist", err)
	}
	for _, bad := range []struct {
		path string
		port int
	}{{"", port}, {sock, 0}, {sock, 70000}} {
		if err := c.Egress(ctxT(t), bad.path, bad.port); !errors.Is(err, ErrInvalid) {
			t.Errorf("Egress(%q, %d): %v, want ErrInvalid", bad.path, bad.port, err)
		}
	}
	if _, err := c.call(ctxT(t), &msg{Op: "egress", Path: "proxy.sock", Port: port}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a relative socket path: %v, want ErrInvalid", err)
	}

	// The relay ends with the agent.
	c.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	if conn, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		conn.Close()
		t.Errorf("127.0.0.1:%d still accepts after the agent ended", port)
	}
}

func TestEgressRefusesATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, _, _ := serve(t, nil)
	err = c.Egress(ctxT(t), "/nonexistent/proxy.sock", ln.Addr().(*net.TCPAddr).Port)
	if !errors.Is(err, ErrExist) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Egress on a taken port: %v, want ErrExist (address already in use)", err)
	}
	// The failure left no relay behind: another port works.
	if err := c.Egress(ctxT(t), "/nonexistent/proxy.sock", e2etest.FreePort(t)); err != nil {
		t.Errorf("Egress after a refused one: %v", err)
	}
}

// TestEgressWithoutTheSocket: a connection the host's socket cannot take
// (not there yet) is closed; the relay keeps serving.
func TestEgressWithoutTheSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "proxy.sock")
	c, _, _ := serve(t, nil)
	port := e2etest.FreePort(t)
	if err := c.Egress(ctxT(t), sock, port); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if b, err := io.ReadAll(conn); len(b) != 0 || err != nil {
		t.Errorf("without the socket: read %q, %v; want the end of the stream", b, err)
	}
	conn.Close()
	// The socket appears: the next connection goes through.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if u, err := ln.Accept(); err == nil {
			io.WriteString(u, "late\n")
			u.Close()
		}
	}()
	conn, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if b, err := io.ReadAll(conn); string(b) != "late\n" || err != nil {
		t.Errorf("once the socket is there: %q, %v", b, err)
	}
}

// TestEgressIsBounded: over maxRelays connections at once, a new one is
// closed; one ending makes room again.
func TestEgressIsBounded(t *testing.T) {
	sock, accepted := egressServer(t, true)
	c, _, _ := serve(t, nil)
	port := e2etest.FreePort(t)
	if err := c.Egress(ctxT(t), sock, port); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var conns []net.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	timeout := time.After(60 * time.Second)
	for range maxRelays {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		select {
		case <-accepted:
		case <-timeout:
			t.Fatalf("%d connections relayed; want %d", len(conns)-1, maxRelays)
		}
	}
	over, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := over.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("connection %d: %v, want it closed (io.EOF)", maxRelays+1, err)
	}
	select {
	case <-accepted:
		t.Errorf("connection %d reached the host's socket", maxRelays+1)
	default:
	}
	// One ends (its half-close reaches the host, which closes): a new one
	// is relayed again.
	conns[0].Close()
	conns = conns[1:]
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		select {
		case <-accepted:
			return
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no room after a relayed connection ended")
		}
		conn.Close()
		conns = conns[:len(conns)-1]
	}
}
