// Package agent is the small program that runs inside a sandbox that
// stays, as the sandbox's own uid, and the host's client for it.
//
// Host and agent speak one multiplexed protocol over any byte stream (the
// sandbox's stdio today, a vsock later): length-prefixed frames, each a
// JSON message with a request id, so that many commands and file
// transfers share one connection. The agent spawns processes (each in a
// process group of its own), relays their stdin, output and signals,
// reaps every child (it may be PID 1), does file operations with its own
// (the sandbox user's) permissions inside the sandbox's mount namespace,
// archives and restores the home directory, and ends everything at its
// deadline. The protocol leaves room for code contexts (long-lived
// interpreters), which a later change adds.
//
// THIS FILE IS THE CONTRACT the host side is written against; the
// implementation replaces the bodies.
package agent

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"syscall"
	"time"
)

// Errors a Client returns for what the agent refused; they wrap the
// fs errors where one fits, so errors.Is(err, fs.ErrNotExist) works.
var (
	ErrNotExist    = fs.ErrNotExist
	ErrPermission  = fs.ErrPermission
	ErrExist       = fs.ErrExist
	ErrIsDir       = errors.New("agent: is a directory")
	ErrNotDir      = errors.New("agent: not a directory")
	ErrTooLarge    = errors.New("agent: over the size cap")
	ErrInvalid     = errors.New("agent: invalid request")
	ErrNoProcess   = errors.New("agent: no such process")
	ErrExited      = errors.New("agent: the process has exited")
	ErrClosed      = errors.New("agent: connection closed")
	errNotBuiltYet = errors.New("agent: not implemented")
)

// SpawnRequest starts one command.
type SpawnRequest struct {
	Argv []string          // argv[0] is looked up in PATH
	Cwd  string            // default HomeDir
	Env  map[string]string // added to the agent's environment
	// Stdin keeps the process's stdin a pipe the host writes to
	// (Process.Write, CloseStdin); otherwise it is /dev/null.
	Stdin bool
}

// Stream of an Event: 1 stdout, 2 stderr (as engine.Stream).
type Stream int

// Event is what a process reports: output, then exactly one exit.
type Event struct {
	Stream Stream // 1 or 2 for output; 0 for the exit event
	Data   []byte
	// Exit (when Stream is 0): the exit code, or 128+signal when killed.
	ExitCode int
	Signal   int // the signal that killed it, 0 if none
}

// Process is one spawned command.
type Process interface {
	PID() int
	// Events delivers output chunks in order, then the exit event, then is
	// closed. A reader that falls behind blocks that process's output (and
	// only that process's) until it reads.
	Events() <-chan Event
	Write(ctx context.Context, p []byte) error
	CloseStdin(ctx context.Context) error
	// Signal signals the process's group. ErrExited after its exit.
	Signal(ctx context.Context, sig syscall.Signal) error
}

// FileInfo describes one file as the agent sees it (Lstat: a symlink is
// reported as such and never followed by List).
type FileInfo struct {
	Name    string      `json:"name"`
	Type    string      `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"` // permission bits
	ModTime time.Time   `json:"mtime"`
}

// Client is the host's side of one agent connection. It is safe for
// concurrent use.
type Client struct{}

// NewClient speaks the protocol over conn (the sandbox's Live.Conn).
func NewClient(conn io.ReadWriteCloser) *Client { return &Client{} }

// Ping round-trips once: the agent is up.
func (c *Client) Ping(ctx context.Context) error { return errNotBuiltYet }

// Spawn starts a command.
func (c *Client) Spawn(ctx context.Context, r SpawnRequest) (Process, error) {
	return nil, errNotBuiltYet
}

// Stat describes path (Lstat).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	return FileInfo{}, errNotBuiltYet
}

// List lists a directory, sorted by name.
func (c *Client) List(ctx context.Context, dir string) ([]FileInfo, error) {
	return nil, errNotBuiltYet
}

// ReadFile copies a regular file to w; more than max bytes is ErrTooLarge
// (nothing past max is sent). Opening follows symlinks as the kernel does
// inside the sandbox; a FIFO or device is ErrInvalid, never opened.
func (c *Client) ReadFile(ctx context.Context, path string, max int64, w io.Writer) (int64, error) {
	return 0, errNotBuiltYet
}

// WriteFile creates or replaces path with r's bytes (parents created),
// refusing more than max bytes with ErrTooLarge and removing the partial
// file. mode 0 means 0644.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, max int64, mode fs.FileMode) (int64, error) {
	return 0, errNotBuiltYet
}

// Remove removes path (a directory with everything in it).
func (c *Client) Remove(ctx context.Context, path string) error { return errNotBuiltYet }

// Mkdir makes a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, path string) error { return errNotBuiltYet }

// Move renames from to to (rename(2) semantics within the sandbox).
func (c *Client) Move(ctx context.Context, from, to string) error { return errNotBuiltYet }

// SaveHome writes a tar archive of HomeDir (regular files, directories
// and symlinks, with modes and times; nothing else) to w, refusing more
// than max bytes with ErrTooLarge.
func (c *Client) SaveHome(ctx context.Context, max int64, w io.Writer) (int64, error) {
	return 0, errNotBuiltYet
}

// RestoreHome unpacks a SaveHome archive into HomeDir; entries that would
// land outside it are refused with ErrInvalid.
func (c *Client) RestoreHome(ctx context.Context, r io.Reader) error { return errNotBuiltYet }

// SetDeadline moves the agent's deadline, at which it kills every
// process and exits.
func (c *Client) SetDeadline(ctx context.Context, t time.Time) error { return errNotBuiltYet }

// Close ends the connection; the agent then ends every process and exits.
func (c *Client) Close() error { return nil }
