package agent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// The wire format: each frame is a 4-byte big-endian length and then that
// many bytes of one JSON msg. A request carries a fresh id; its reply, and
// every frame of a stream it starts (a process's output and exit, a
// download's data), carries the same id. A frame that refers to another
// request's stream (stdin or upload chunks, acks, cancels, signals) names
// it in ref.
//
// Flow control: a stream the agent sends (output, ReadFile, SaveHome) may
// have at most window data frames unacknowledged; the client acks each
// frame once its consumer has taken it. Uploads (stdin, WriteFile,
// RestoreHome) go one chunk at a time, each a request with its own reply,
// so the agent never buffers more than a chunk per transfer.
const (
	// MaxFrame is the largest frame either side accepts.
	MaxFrame = 1 << 20
	// chunkSize is the most data one frame carries.
	chunkSize = MaxChunk
	// window is how many data frames of one stream may be in flight.
	window = 16
)

// msg is every frame's body; each op uses the fields it needs.
type msg struct {
	ID  uint64 `json:"id"`
	Op  string `json:"op"`
	Ref uint64 `json:"ref,omitempty"`

	Argv  []string          `json:"argv,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Stdin bool              `json:"stdin,omitempty"`

	Path     string `json:"path,omitempty"`
	To       string `json:"to,omitempty"`
	Max      int64  `json:"max,omitempty"`
	Mode     uint32 `json:"mode,omitempty"`
	Data     []byte `json:"data,omitempty"`
	EOF      bool   `json:"eof,omitempty"`
	Stream   int    `json:"stream,omitempty"`
	Signal   int    `json:"signal,omitempty"`
	Code     int    `json:"code,omitempty"`
	N        int64  `json:"n,omitempty"`
	PID      int    `json:"pid,omitempty"`
	Port     int    `json:"port,omitempty"`
	Deadline int64  `json:"deadline,omitempty"` // unix nanoseconds

	Info  *FileInfo  `json:"info,omitempty"`
	Files []FileInfo `json:"files,omitempty"`

	Err string `json:"err,omitempty"` // an error code of errCodes
	Msg string `json:"msg,omitempty"`
}

var (
	errFrameTooLarge = errors.New("agent: frame over the size cap")
	errBadFrame      = errors.New("agent: malformed frame")
)

// readFrame reads one frame into m. A clean end of the stream before a
// frame is io.EOF.
func readFrame(r io.Reader, m *msg) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > MaxFrame {
		return fmt.Errorf("%w: %d bytes", errFrameTooLarge, n)
	}
	if n == 0 {
		return fmt.Errorf("%w: empty", errBadFrame)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	*m = msg{}
	if err := json.Unmarshal(buf, m); err != nil {
		return fmt.Errorf("%w: %v", errBadFrame, err)
	}
	if m.Op == "" {
		return fmt.Errorf("%w: no op", errBadFrame)
	}
	return nil
}

// encodeFrame is m as one frame, header included.
func encodeFrame(m *msg) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes", errFrameTooLarge, len(body))
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	return buf, nil
}

// errCodes is the one table between the contract's errors and the codes
// on the wire, in the order the agent tests them.
var errCodes = []struct {
	code string
	err  error
}{
	{"not_exist", ErrNotExist},
	{"permission", ErrPermission},
	{"exist", ErrExist},
	{"is_dir", ErrIsDir},
	{"not_dir", ErrNotDir},
	{"too_large", ErrTooLarge},
	{"invalid", ErrInvalid},
	{"no_process", ErrNoProcess},
	{"exited", ErrExited},
	{"read_only", ErrReadOnly},
	{"again", ErrAgain},
}

// errnoCodes maps what the kernel says to a code where errors.Is with
// the fs errors does not already.
var errnoCodes = map[syscall.Errno]string{
	syscall.EISDIR:       "is_dir",
	syscall.ENOTDIR:      "not_dir",
	syscall.ENOSPC:       "too_large",
	syscall.EDQUOT:       "too_large",
	syscall.EFBIG:        "too_large",
	syscall.EINVAL:       "invalid",
	syscall.ENAMETOOLONG: "invalid",
	syscall.ELOOP:        "invalid",
	syscall.EXDEV:        "invalid",
	syscall.EBUSY:        "invalid",
	syscall.ENOTEMPTY:    "invalid",
	syscall.EROFS:        "read_only",
	syscall.EAGAIN:       "again", // fork or clone at the pids limit
}

// codeOf is the wire code of an error the agent met.
func codeOf(err error) string {
	for _, c := range errCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if c, ok := errnoCodes[errno]; ok {
			return c
		}
	}
	// os.Root refuses a path that leaves it with an unexported error.
	if strings.Contains(err.Error(), "escapes from parent") {
		return "invalid"
	}
	if errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) {
		return "exited"
	}
	return "io"
}

// errorOf is the client's error for a reply with an error code.
func errorOf(m *msg) error {
	for _, c := range errCodes {
		if c.code == m.Err {
			return fmt.Errorf("%s: %w", m.Msg, c.err)
		}
	}
	return fmt.Errorf("agent: %s", m.Msg)
}

// errMsg is the error reply to request id.
func errMsg(id uint64, err error) *msg {
	return &msg{ID: id, Op: "err", Err: codeOf(err), Msg: err.Error()}
}

// fileInfo describes fi as the contract does.
func fileInfo(fi fs.FileInfo) FileInfo {
	t := "other"
	switch {
	case fi.Mode().IsRegular():
		t = "file"
	case fi.IsDir():
		t = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		t = "symlink"
	}
	return FileInfo{Name: fi.Name(), Type: t, Size: fi.Size(), Mode: fi.Mode().Perm(), ModTime: fi.ModTime()}
}

// MaxChunk is the most data one frame of a stream carries.
const MaxChunk = 32 << 10
