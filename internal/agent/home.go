package agent

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// saveHome streams a tar of the home directory: regular files,
// directories and symlinks (as links), with their modes and times.
func (s *server) saveHome(m *msg) {
	st := s.openStream(m.ID)
	defer s.closeStream(m.ID)
	if m.Max < 0 {
		s.reply(errMsg(m.ID, fmt.Errorf("negative cap: %w", ErrInvalid)))
		return
	}
	sw := &streamWriter{s: s, st: st, id: m.ID, max: m.Max}
	bw := bufio.NewWriterSize(sw, chunkSize)
	err := writeTar(bw, s.home)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	s.reply(&msg{ID: m.ID, Op: "done", N: sw.n})
}

// writeTar archives dir into w. A file that vanishes while it walks is
// left out; one it cannot read fails the archive.
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != dir {
				return nil
			}
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode().IsRegular(), fi.IsDir():
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return nil // sockets, FIFOs, devices
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.Format = tar.FormatPAX
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if !fi.Mode().IsRegular() {
			return tw.WriteHeader(hdr)
		}
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		defer f.Close()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("archive %s: %w", rel, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// restoreHome starts an upload of a tar, unpacked into the home directory
// as it arrives.
func (s *server) restoreHome(m *msg) {
	root, err := os.OpenRoot(s.home)
	if err != nil {
		s.reply(errMsg(m.ID, err))
		return
	}
	pr, pw := io.Pipe()
	result := make(chan error, 1)
	go func() {
		err := readTar(pr, root)
		root.Close()
		if err != nil {
			pr.CloseWithError(err)
		} else {
			io.Copy(io.Discard, pr) // the archive's padding
		}
		result <- err
	}()
	write := func(b []byte) error {
		_, err := pw.Write(b)
		return err
	}
	finish := func() (int64, error) {
		pw.Close()
		return 0, <-result
	}
	cleanup := func() {
		pw.CloseWithError(fmt.Errorf("restore abandoned: %w", ErrClosed))
		<-result
	}
	s.runUpload(m.ID, newUpload(), write, finish, cleanup)
	s.ok(m.ID)
}

// readTar unpacks r into root. os.Root keeps every entry inside it: a
// name with .. or a symlink on the way that leads out is refused.
func readTar(r io.Reader, root *os.Root) error {
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("restore: %v: %w", err, ErrInvalid)
		}
		name := filepath.Clean(filepath.FromSlash(hdr.Name))
		if !filepath.IsLocal(name) {
			return fmt.Errorf("restore %q: outside the home: %w", hdr.Name, ErrInvalid)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return fmt.Errorf("restore %q: %w", hdr.Name, err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, mode); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("restore %q: %w", hdr.Name, err)
			}
			if err := root.Chmod(name, mode); err != nil {
				return fmt.Errorf("restore %q: %w", hdr.Name, err)
			}
			dirs = append(dirs, dirTime{name, hdr.ModTime})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
			if err != nil {
				return fmt.Errorf("restore %q: %w", hdr.Name, err)
			}
			_, err = io.Copy(f, tr)
			if err == nil {
				err = f.Chmod(mode)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
			}
			if err != nil {
				return fmt.Errorf("restore %q: %w", hdr.Name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("restore %q: %w", hdr.Name, err)
			}
		default:
			// SaveHome writes nothing else; skip what another tool added.
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chtimes(dirs[i].name, dirs[i].t, dirs[i].t); err != nil {
			return fmt.Errorf("restore %q: %w", dirs[i].name, err)
		}
	}
	return nil
}
