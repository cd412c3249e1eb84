package execution

import "fmt"

// Kind is a class of failure reported to a client, whatever the entry
// point (HTTP, MCP). The HTTP API maps each kind to its status and wire
// code in one table (internal/api/errors.go); nothing here knows HTTP.
type Kind int

const (
	KindInternal Kind = iota // zero value: anything unclassified
	KindInvalidRequest
	KindInvalidJSON
	KindInvalidContentType
	KindInvalidTimeout
	KindUnsupportedLanguage
	KindInvalidIdempotencyKey
	KindUnauthorized
	KindForbidden
	KindNotFound
	KindMethodNotAllowed
	KindIdempotencyConflict
	KindIdempotencyInProgress
	KindExecutionFinished // cancel of an execution that has already finished
	KindPayloadTooLarge
	KindRateLimited
	KindQuotaExceeded
	KindSandboxError
	KindOverloaded
	KindUnavailable // the store could not record the execution; nothing was acknowledged
	KindTooManyKeys // the tenant already has store.MaxActiveKeys active keys
	// Sandboxes that stay (package sandboxes).
	KindSandboxNotRunning // the sandbox is paused or ended and the call needs it running
	KindProcessFinished   // stdin or a signal for a command that has already exited
	KindSandboxLimit      // the tenant holds its plan's number of sandboxes, or a sandbox its processes
)

// Error is a failure on its way to a client. Msg is safe to show; Err is
// the cause and goes only to the log. RetryAfter (seconds, >0) tells the
// client when to try again.
type Error struct {
	Kind       Kind
	Msg        string
	Err        error
	RetryAfter int
	// Quota, when set, is the caller's daily quota as the refusal left it.
	Quota *Quota
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %v", e.Msg, e.Err)
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an Error of kind k with a message for the client.
func Errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// Internal hides err from the client behind a generic message.
func Internal(err error) *Error {
	return &Error{Kind: KindInternal, Msg: "internal error; quote the request id when reporting it", Err: err}
}

// unavailable is the answer when the store failed to record an execution:
// nothing was acknowledged, the quota is given back, and a retry may run.
func unavailable(err error) *Error {
	return &Error{Kind: KindUnavailable, Msg: "the execution could not be stored, so it was not run or not counted; retry shortly",
		Err: err, RetryAfter: 5}
}

// Busy is the answer when every sandbox slot is taken, or the caller's
// share of them and of the queue is: 503 overloaded, retry in a second.
func Busy() *Error {
	return &Error{Kind: KindOverloaded, Msg: "every sandbox is busy; retry shortly", RetryAfter: 1}
}
