package agent

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

func (s *server) stat(m *msg) {
	p, err := s.path(m.Path)
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	info := fileInfo(fi)
	s.reply(&msg{ID: m.ID, Op: "ok", Info: &info})
}

func (s *server) list(m *msg) {
	p, err := s.path(m.Path)
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	files := make([]FileInfo, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // gone since the listing
		}
		files = append(files, fileInfo(fi))
	}
	// Files is omitted when empty; the client reads that as an empty list.
	s.reply(&msg{ID: m.ID, Op: "ok", Files: files})
}

func (s *server) remove(m *msg) {
	p, err := s.path(m.Path)
	if err == nil && (p == "/" || p == filepath.Clean(s.home)) {
		err = fmt.Errorf("remove %s: %w", p, ErrInvalid)
	}
	if err == nil {
		_, err = os.Lstat(p)
	}
	if err == nil {
		err = os.RemoveAll(p)
	}
	s.fail(m.ID, err)
}

func (s *server) mkdir(m *msg) {
	p, err := s.path(m.Path)
	if err == nil {
		err = os.MkdirAll(p, 0o755)
	}
	s.fail(m.ID, err)
}

func (s *server) move(m *msg) {
	from, err := s.path(m.Path)
	var to string
	if err == nil {
		to, err = s.path(m.To)
	}
	if err == nil {
		err = os.Rename(from, to)
	}
	s.fail(m.ID, err)
}

// readFile streams a regular file: data frames, then done with the count.
func (s *server) readFile(m *msg) {
	st := s.openStream(m.ID)
	defer s.closeStream(m.ID)
	n, err := s.sendFile(st, m)
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	s.reply(&msg{ID: m.ID, Op: "done", N: n})
}

func (s *server) sendFile(st *stream, m *msg) (int64, error) {
	p, err := s.path(m.Path)
	if err != nil {
		return 0, err
	}
	if m.Max < 0 {
		return 0, fmt.Errorf("negative cap: %w", ErrInvalid)
	}
	// Stat first so a FIFO or a device is never opened; fstat after the
	// open so one swapped in meanwhile is refused too (O_NONBLOCK keeps
	// that open from waiting for a writer).
	fi, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	if err := regular(p, fi, m.Max); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return 0, err
	}
	if err := regular(p, fi, m.Max); err != nil {
		return 0, err
	}
	w := &streamWriter{s: s, st: st, id: m.ID, max: m.Max}
	n, err := io.CopyBuffer(w, io.LimitReader(f, m.Max+1), make([]byte, chunkSize))
	if err != nil {
		return w.n, err
	}
	return n, nil
}

func regular(p string, fi fs.FileInfo, max int64) error {
	switch {
	case fi.IsDir():
		return fmt.Errorf("read %s: %w", p, ErrIsDir)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("read %s: not a regular file: %w", p, ErrInvalid)
	case fi.Size() > max:
		return fmt.Errorf("read %s: %d bytes: %w", p, fi.Size(), ErrTooLarge)
	}
	return nil
}

// streamWriter sends what is written to it as data frames of a stream,
// at most chunkSize each, refusing to send past max.
type streamWriter struct {
	s   *server
	st  *stream
	id  uint64
	max int64
	n   int64
}

func (w *streamWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		if w.n >= w.max {
			return written, fmt.Errorf("over %d bytes: %w", w.max, ErrTooLarge)
		}
		c := min(int64(len(b)), chunkSize, w.max-w.n)
		data := append([]byte(nil), b[:c]...)
		if err := w.st.send(w.s, &msg{ID: w.id, Op: "data", Data: data}); err != nil {
			return written, err
		}
		w.n += c
		written += int(c)
		b = b[c:]
	}
	return written, nil
}

// upload is the receiving side of one chunked transfer: chunks queue
// here for its worker, which replies to each once it has written it.
type upload struct {
	q    chan *msg
	stop chan struct{}
	once sync.Once
}

func newUpload() *upload {
	return &upload{q: make(chan *msg, 4), stop: make(chan struct{})}
}

func (u *upload) abort() { u.once.Do(func() { close(u.stop) }) }

// runUpload registers u under ref and serves its chunks: write takes each
// chunk's data, finish ends a transfer that reached its end (and replies
// its count), cleanup undoes one that failed or was abandoned.
func (s *server) runUpload(ref uint64, u *upload, write func([]byte) error, finish func() (int64, error), cleanup func()) {
	s.mu.Lock()
	s.uploads[ref] = u
	s.mu.Unlock()
	done := func() {
		s.mu.Lock()
		if s.uploads[ref] == u {
			delete(s.uploads, ref)
		}
		s.mu.Unlock()
	}
	ok := s.goRun(func() {
		defer done()
		for {
			select {
			case m := <-u.q:
				if m.EOF {
					n, err := finish()
					if err != nil {
						s.reply(errMsg(m.ID, err))
					} else {
						s.reply(&msg{ID: m.ID, Op: "ok", N: n})
					}
					return
				}
				if err := write(m.Data); err != nil {
					cleanup()
					s.reply(errMsg(m.ID, err))
					return
				}
				s.ok(m.ID)
			case <-u.stop:
				cleanup()
				return
			case <-s.ctx.Done():
				cleanup()
				return
			}
		}
	})
	if !ok {
		done()
		cleanup()
	}
}

// chunk is data (or the end) for an upload, or a process's stdin.
func (s *server) chunk(m *msg) {
	s.mu.Lock()
	u := s.uploads[m.Ref]
	s.mu.Unlock()
	if u == nil {
		s.reply(errMsg(m.ID, fmt.Errorf("no transfer %d: %w", m.Ref, ErrInvalid)))
		return
	}
	select {
	case u.q <- m:
	default:
		s.reply(errMsg(m.ID, fmt.Errorf("transfer %d: one chunk at a time: %w", m.Ref, ErrInvalid)))
	}
}

// writeFile starts an upload into a temporary file beside the path,
// renamed over it at the end.
func (s *server) writeFile(m *msg) {
	p, err := s.path(m.Path)
	if err == nil && m.Max < 0 {
		err = fmt.Errorf("negative cap: %w", ErrInvalid)
	}
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		s.reply(errMsg(m.ID, fmt.Errorf("write %s: %w", p, ErrIsDir)))
		return
	}
	mode := fs.FileMode(m.Mode).Perm()
	if mode == 0 {
		mode = 0o644
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	f, err := os.CreateTemp(dir, ".vertal-upload-*")
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		os.Remove(f.Name())
		s.reply(errMsg(m.ID, err))
		return
	}
	var n int64
	cleanup := func() {
		f.Close()
		os.Remove(f.Name())
	}
	write := func(b []byte) error {
		if n+int64(len(b)) > m.Max {
			return fmt.Errorf("write %s: over %d bytes: %w", p, m.Max, ErrTooLarge)
		}
		k, err := f.Write(b)
		n += int64(k)
		return err
	}
	finish := func() (int64, error) {
		err := f.Close()
		if err == nil {
			err = os.Rename(f.Name(), p)
		}
		if err != nil {
			os.Remove(f.Name())
			return 0, err
		}
		return n, nil
	}
	s.runUpload(m.ID, newUpload(), write, finish, cleanup)
	s.ok(m.ID)
}
