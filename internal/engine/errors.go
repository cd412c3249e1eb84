package engine

import "errors"

var (
	// ErrBusy means every sandbox slot is taken and the bounded wait is
	// over (or the queue is full). The API answers 503 with Retry-After.
	ErrBusy = errors.New("engine: all sandboxes are busy")
	// ErrUnavailable means the driver cannot run sandboxes on this host
	// (runtime missing, daemon down). Its message says what to install.
	ErrUnavailable = errors.New("engine: sandbox driver unavailable")
	// ErrSetup, from sandbox.Process.Finish, means the sandbox failed before the
	// program started (the runtime's own error). What the runtime wrote
	// on the sandbox's stderr is its message, not the user's: sandbox.Supervise
	// adds it to the error, for the server's log.
	ErrSetup = errors.New("engine: the sandbox could not be set up")
)
