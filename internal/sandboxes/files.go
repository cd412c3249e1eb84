package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// maxPath is the longest path accepted (the kernel's PATH_MAX), so that
// an over-long one is refused here rather than sent to the agent and
// echoed back whole in the error.
const maxPath = 4096

// homePath is p as the agent gets it: a relative path is under the home,
// and the result is clean and absolute. Resolving it (symlinks,
// permissions) is the agent's, inside the sandbox, never the host's.
func homePath(p string) (string, error) {
	if p == "" {
		return "", execution.Errorf(execution.KindInvalidRequest, "a path is required")
	}
	if len(p) > maxPath {
		return "", execution.Errorf(execution.KindInvalidRequest, "a path is at most %d bytes, not %d", maxPath, len(p))
	}
	for i := 0; i < len(p); i++ {
		if p[i] == 0 {
			return "", execution.Errorf(execution.KindInvalidRequest, "a path must not hold a NUL byte")
		}
	}
	if !path.IsAbs(p) {
		p = path.Join(engine.HomeDir, p)
		if p != engine.HomeDir && !hasPrefixDir(p, engine.HomeDir) {
			return "", execution.Errorf(execution.KindInvalidRequest, "a relative path must stay inside %s", engine.HomeDir)
		}
	}
	return path.Clean(p), nil
}

func hasPrefixDir(p, dir string) bool {
	return len(p) > len(dir) && p[:len(dir)] == dir && p[len(dir)] == '/'
}

// fileErr maps an agent's refusal to a client error.
func fileErr(err error, p string) error {
	var xe *execution.Error
	switch {
	case errors.As(err, &xe):
		return xe
	case errors.Is(err, agent.ErrNotExist):
		return execution.Errorf(execution.KindNotFound, "no such file or directory: %s", p)
	case errors.Is(err, agent.ErrPermission):
		return execution.Errorf(execution.KindForbidden, "permission denied: %s", p)
	case errors.Is(err, agent.ErrReadOnly):
		return execution.Errorf(execution.KindForbidden, "read-only file system: %s (only %s and /tmp are writable)", p, engine.HomeDir)
	case errors.Is(err, agent.ErrExist):
		return execution.Errorf(execution.KindInvalidRequest, "already exists: %s", p)
	case errors.Is(err, agent.ErrIsDir):
		return execution.Errorf(execution.KindInvalidRequest, "is a directory: %s", p)
	case errors.Is(err, agent.ErrNotDir):
		return execution.Errorf(execution.KindInvalidRequest, "not a directory: %s", p)
	case errors.Is(err, agent.ErrTooLarge):
		return execution.Errorf(execution.KindPayloadTooLarge, "over the plan's size cap: %s", p)
	case errors.Is(err, agent.ErrInvalid):
		return execution.Errorf(execution.KindInvalidRequest, "not a regular file or an invalid path: %s", p)
	case errors.Is(err, agent.ErrClosed):
		return execution.Errorf(execution.KindSandboxNotRunning, "the sandbox stopped")
	case errors.Is(err, agent.ErrUnresponsive):
		return &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox's agent did not answer in time (stopped or hung), so the sandbox was ended", Err: err}
	}
	return &execution.Error{Kind: execution.KindSandboxError, Msg: "the sandbox failed the file operation", Err: err}
}

func fileInfo(dir string, fi agent.FileInfo, full string) FileInfo {
	if full == "" {
		full = path.Join(dir, fi.Name)
	}
	return FileInfo{Name: fi.Name, Path: full, Type: fi.Type, Size: fi.Size, Mode: fmt.Sprintf("%04o", fi.Mode.Perm()), ModTime: fi.ModTime}
}

// files resolves p and c's running sandbox id (resuming a paused one).
func (s *Service) files(ctx context.Context, c execution.Caller, id, p string) (*box, Limits, string, error) {
	full, err := homePath(p)
	if err != nil {
		return nil, Limits{}, "", err
	}
	b, rec, err := s.running(ctx, c, id)
	if err != nil {
		return nil, Limits{}, "", err
	}
	return b, parseLimits(rec), full, nil
}

func (s *Service) stat(ctx context.Context, b *box, full string) (FileInfo, error) {
	fi, err := b.ag.Stat(ctx, full)
	if err != nil {
		return FileInfo{}, fileErr(err, full)
	}
	return fileInfo(path.Dir(full), fi, full), nil
}

// Stat describes a path inside the sandbox.
func (s *Service) Stat(ctx context.Context, c execution.Caller, id, p string) (FileInfo, error) {
	b, _, full, err := s.files(ctx, c, id, p)
	if err != nil {
		return FileInfo{}, err
	}
	return s.stat(ctx, b, full)
}

// ListDir lists a directory inside the sandbox.
func (s *Service) ListDir(ctx context.Context, c execution.Caller, id, p string) ([]FileInfo, error) {
	b, _, full, err := s.files(ctx, c, id, p)
	if err != nil {
		return nil, err
	}
	list, err := b.ag.List(ctx, full)
	if err != nil {
		return nil, fileErr(err, full)
	}
	out := make([]FileInfo, len(list))
	for i, fi := range list {
		out[i] = fileInfo(full, fi, "")
	}
	return out, nil
}

// WalkLive calls fn for each entry under p, depth levels down, at most
// max of them (more is KindPayloadTooLarge), in a running sandbox only: a
// paused one is KindSandboxNotRunning, never resumed, so that a watcher
// polling it cannot undo a pause. The sandbox is looked up once for the
// whole walk.
func (s *Service) WalkLive(ctx context.Context, c execution.Caller, id, p string, depth, max int, fn func(FileInfo)) error {
	full, err := homePath(p)
	if err != nil {
		return err
	}
	b, err := s.liveOnly(ctx, c, id)
	if err != nil {
		return err
	}
	n := 0
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		list, err := b.ag.List(ctx, dir)
		if err != nil {
			return fileErr(err, dir)
		}
		for _, fi := range list {
			if n++; n > max {
				return execution.Errorf(execution.KindPayloadTooLarge, "more than %d entries under %s", max, full)
			}
			e := fileInfo(dir, fi, "")
			fn(e)
			if e.Type == "dir" && level < depth {
				if err := walk(e.Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(full, 1)
}

// ReadFile copies a file to w, up to the plan's file size.
func (s *Service) ReadFile(ctx context.Context, c execution.Caller, id, p string, w io.Writer) (int64, error) {
	b, lim, full, err := s.files(ctx, c, id, p)
	if err != nil {
		return 0, err
	}
	n, err := b.ag.ReadFile(ctx, full, lim.MaxFileMB<<20, w)
	if err != nil {
		return n, fileErr(err, full)
	}
	return n, nil
}

// WriteFile creates or replaces a file (and its parents), up to the
// plan's file size.
func (s *Service) WriteFile(ctx context.Context, c execution.Caller, id, p string, r io.Reader) (FileInfo, error) {
	b, lim, full, err := s.files(ctx, c, id, p)
	if err != nil {
		return FileInfo{}, err
	}
	if _, err := b.ag.WriteFile(ctx, full, r, lim.MaxFileMB<<20, 0); err != nil {
		return FileInfo{}, fileErr(err, full)
	}
	return s.stat(ctx, b, full)
}

// Remove removes a path (a directory with everything in it).
func (s *Service) Remove(ctx context.Context, c execution.Caller, id, p string) error {
	full, err := homePath(p)
	if err != nil {
		return err
	}
	if full == engine.HomeDir {
		return execution.Errorf(execution.KindInvalidRequest, "the home directory %s itself cannot be removed; remove what is in it, or kill the sandbox", engine.HomeDir)
	}
	b, _, full, err := s.files(ctx, c, id, p)
	if err != nil {
		return err
	}
	if err := b.ag.Remove(ctx, full); err != nil {
		return fileErr(err, full)
	}
	return nil
}

// Mkdir makes a directory and its parents.
func (s *Service) Mkdir(ctx context.Context, c execution.Caller, id, p string) (FileInfo, error) {
	b, _, full, err := s.files(ctx, c, id, p)
	if err != nil {
		return FileInfo{}, err
	}
	if err := b.ag.Mkdir(ctx, full); err != nil {
		return FileInfo{}, fileErr(err, full)
	}
	return s.stat(ctx, b, full)
}

// Move renames from to to inside the sandbox.
func (s *Service) Move(ctx context.Context, c execution.Caller, id, from, to string) (FileInfo, error) {
	dst, err := homePath(to)
	if err != nil {
		return FileInfo{}, err
	}
	b, _, src, err := s.files(ctx, c, id, from)
	if err != nil {
		return FileInfo{}, err
	}
	if err := b.ag.Move(ctx, src, dst); err != nil {
		return FileInfo{}, fileErr(err, src)
	}
	return s.stat(ctx, b, dst)
}
