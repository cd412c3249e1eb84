package engine

import (
	"context"
	"errors"
)

// Prestarter is the optional capability of a driver that can create warm
// sandboxes. Prestart returns once the sandbox's interpreter is up and
// waiting, or fails (ErrUnsupported when the language cannot be
// pre-started at all).
type Prestarter interface {
	Prestart(ctx context.Context, lang Language, limits Limits) (Warm, error)
}

// Warm is one pre-started sandbox. It serves at most one Exec.
type Warm interface {
	// Exec hands spec's code and stdin to the sandbox and waits for the
	// code to finish, as Driver.Run would; spec.Timeout counts from the
	// hand-over and Result.Duration and Usage measure the code only. It
	// returns an error wrapping ErrNotStarted when the sandbox could not
	// take the code (it died), in which case no user code ran. Exec
	// leaves destroying the sandbox to Discard.
	Exec(ctx context.Context, spec Spec) (Result, error)
	// Done is closed when the sandbox's processes have ended: after Exec,
	// after Discard, or when it crashed while waiting.
	Done() <-chan struct{}
	// MemoryBytes is the memory the waiting sandbox holds (its cgroup's
	// usage), for the pool's budget; 0 if unknown.
	MemoryBytes() int64
	// Discard destroys the sandbox and everything it left on the host.
	// It is safe to call more than once, and after Exec.
	Discard(ctx context.Context) error
}

var (
	// ErrUnsupported means a language cannot be pre-started by this
	// driver (no launcher fits its interpreter or image); it runs cold.
	ErrUnsupported = errors.New("engine: language cannot be pre-started")
	// ErrNotStarted means a warm sandbox could not take an execution; the
	// code did not run, so the pool runs it on the cold path instead.
	ErrNotStarted = errors.New("engine: warm sandbox could not take the execution")
)
