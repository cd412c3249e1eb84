package webhook

import (
	"errors"
	"fmt"
)

// Error kinds. Every error this package returns matches one of them with
// errors.Is, so a caller can map a kind to its answer in one place (400
// invalid_request at submit, a retry or a failed delivery later).
var (
	// ErrInvalidURL: the webhook URL itself is unusable (not absolute, a
	// scheme other than https, credentials, no host, a bad port).
	ErrInvalidURL = errors.New("invalid webhook url")
	// ErrRefused: the URL's host is, or resolves to, an address webhooks
	// may not reach (loopback, private, link-local, the server's own...).
	ErrRefused = errors.New("webhook address refused")
	// ErrUnresolvable: the URL's host does not resolve to any address.
	ErrUnresolvable = errors.New("webhook host does not resolve")
	// ErrDelivery: one delivery attempt failed: a non-2xx answer (a
	// redirect included), a timeout or a connection error.
	ErrDelivery = errors.New("webhook delivery failed")

	// ErrMalformedSignature: the Vertal-Signature header cannot be parsed.
	ErrMalformedSignature = errors.New("malformed Vertal-Signature header")
	// ErrSignatureMismatch: no v1 signature in the header matches the body.
	ErrSignatureMismatch = errors.New("webhook signature does not match")
	// ErrTooOld: the signature is authentic but its timestamp is older than
	// the tolerance (a replay, or a receiver whose clock is behind).
	ErrTooOld = errors.New("webhook timestamp is too old")
	// ErrTooNew: the signature is authentic but its timestamp is further in
	// the future than the tolerance.
	ErrTooNew = errors.New("webhook timestamp is too far in the future")
)

// Error is a refusal or a failed attempt. Its Error() is written for the
// tenant (the API can show it as is, after the field name); Err holds the
// cause for the log only, as it may name a resolver or an internal detail.
type Error struct {
	Kind error  // one of the Err* kinds above
	Msg  string // safe to show the client
	Err  error  // the cause, for the log; may be nil
}

func (e *Error) Error() string { return e.Msg }

// Unwrap lets errors.Is match both the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func newError(kind, cause error, format string, args ...any) *Error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Err: cause}
}
