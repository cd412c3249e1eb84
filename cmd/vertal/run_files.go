package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/client"
)

// readFileFlag reads the file a --file flag names: LOCAL or LOCAL:PATH.
// An argument that names an existing file is LOCAL alone, so a local name
// with a colon still works; otherwise the first colon splits it.
func readFileFlag(v string) (client.File, error) {
	local, path := v, ""
	if _, err := os.Stat(v); err != nil {
		if l, p, ok := strings.Cut(v, ":"); ok {
			local, path = l, p
		}
	}
	if local == "" {
		return client.File{}, errors.New("want LOCAL or LOCAL:PATH")
	}
	if path == "" {
		path = filepath.Base(local)
	}
	fi, err := os.Stat(local)
	if err != nil {
		return client.File{}, err
	}
	if !fi.Mode().IsRegular() {
		return client.File{}, fmt.Errorf("%s is not a regular file", local)
	}
	b, err := os.ReadFile(local)
	if err != nil {
		return client.File{}, err
	}
	return client.File{Path: filepath.ToSlash(path), Content: b}, nil
}

// writeReturnedFiles writes an execution's returned files under dir, one
// line per file on stderr. The paths come from the server, so they are
// treated as hostile: a path that is absolute, has a ".." or empty
// component, or reaches through a symlink is refused, and the writes go
// through an os.Root so that nothing lands outside dir. Each file is
// written to a temporary name and renamed, so a symlink planted at the
// final name is replaced, never followed.
func writeReturnedFiles(e *env, cmd, dir string, ex *client.Execution) error {
	if ex.FilesTruncated {
		fmt.Fprintf(e.Stderr, "vertal %s: returned files truncated at the plan's limit (count or size)\n", cmd)
	}
	if len(ex.Files) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating --out directory: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("opening --out directory: %w", err)
	}
	defer root.Close()
	failed := 0
	for _, f := range ex.Files {
		shown := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := writeBeneath(root, f.Path, f.Content); err != nil {
			fmt.Fprintf(e.Stderr, "vertal %s: not writing returned file %q: %v\n", cmd, f.Path, err)
			failed++
			continue
		}
		fmt.Fprintf(e.Stderr, "vertal %s: wrote %s (%d bytes)\n", cmd, shown, len(f.Content))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d returned files were not written", failed, len(ex.Files))
	}
	return nil
}

// writeBeneath writes content to the '/'-separated relative path under
// root, creating directories, without following any symlink.
func writeBeneath(root *os.Root, path string, content []byte) error {
	parts, err := splitReturnedPath(path)
	if err != nil {
		return err
	}
	dir := root
	for _, name := range parts[:len(parts)-1] {
		fi, err := dir.Lstat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := dir.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case err != nil:
			return err
		case fi.Mode()&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a symlink", name)
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", name)
		}
		sub, err := dir.OpenRoot(name)
		if err != nil {
			return err
		}
		defer sub.Close()
		dir = sub
	}
	name := parts[len(parts)-1]
	if fi, err := dir.Lstat(name); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s exists and is not a regular file", name)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".vertal-" + hex.EncodeToString(rnd[:]) + ".tmp"
	out, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, werr := out.Write(content)
	if cerr := out.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = dir.Rename(tmp, name)
	}
	if werr != nil {
		_ = dir.Remove(tmp)
	}
	return werr
}

// splitReturnedPath checks a returned file's path and splits it.
func splitReturnedPath(path string) ([]string, error) {
	if path == "" || strings.HasPrefix(path, "/") || strings.ContainsAny(path, "\\\x00") {
		return nil, errors.New("not a relative '/'-separated path")
	}
	parts := strings.Split(path, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return nil, errors.New("has an empty, . or .. component")
		}
	}
	return parts, nil
}
