package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Kind is a class of failure the API reports. kinds maps each to its HTTP
// status and wire code; nothing else in the package picks a status for an
// error.
type Kind int

const (
	KindInternal Kind = iota // zero value: anything unclassified is a 500
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
	KindPayloadTooLarge
	KindRateLimited
	KindQuotaExceeded
	KindSandboxError
	KindOverloaded
)

type kindInfo struct {
	status int
	code   string
}

// kinds is the one table from error kind to HTTP status and error code.
var kinds = map[Kind]kindInfo{
	KindInvalidRequest:        {http.StatusBadRequest, "invalid_request"},
	KindInvalidJSON:           {http.StatusBadRequest, "invalid_json"},
	KindInvalidContentType:    {http.StatusBadRequest, "invalid_content_type"},
	KindInvalidTimeout:        {http.StatusBadRequest, "invalid_timeout"},
	KindUnsupportedLanguage:   {http.StatusBadRequest, "unsupported_language"},
	KindInvalidIdempotencyKey: {http.StatusBadRequest, "invalid_idempotency_key"},
	KindUnauthorized:          {http.StatusUnauthorized, "unauthorized"},
	KindForbidden:             {http.StatusForbidden, "forbidden"},
	KindNotFound:              {http.StatusNotFound, "not_found"},
	KindMethodNotAllowed:      {http.StatusMethodNotAllowed, "method_not_allowed"},
	KindIdempotencyConflict:   {http.StatusConflict, "idempotency_conflict"},
	KindIdempotencyInProgress: {http.StatusConflict, "idempotency_in_progress"},
	KindPayloadTooLarge:       {http.StatusRequestEntityTooLarge, "payload_too_large"},
	KindRateLimited:           {http.StatusTooManyRequests, "rate_limited"},
	KindQuotaExceeded:         {http.StatusTooManyRequests, "quota_exceeded"},
	KindInternal:              {http.StatusInternalServerError, "internal_error"},
	KindSandboxError:          {http.StatusInternalServerError, "sandbox_error"},
	KindOverloaded:            {http.StatusServiceUnavailable, "overloaded"},
}

// Status is the HTTP status of k.
func (k Kind) Status() int { return kinds[k].status }

// Code is the wire code of k, e.g. "quota_exceeded".
func (k Kind) Code() string { return kinds[k].code }

// Error is a failure on its way to the client. Msg is safe to show; Err is
// the cause and goes only to the log. RetryAfter (seconds, >0) adds a
// Retry-After header; Header adds any other.
type Error struct {
	Kind       Kind
	Msg        string
	Err        error
	RetryAfter int
	Header     http.Header
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Kind.Code(), e.Msg, e.Err)
	}
	return e.Kind.Code() + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// internal hides err from the client behind a generic message.
func internal(err error) *Error {
	return &Error{Kind: KindInternal, Msg: "internal error; quote the request id when reporting it", Err: err}
}

// asError classifies any error returned by a handler.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return internal(err)
}

// errorBody is the one error shape on the wire.
type errorBody struct {
	Error     errorDetail `json:"error"`
	RequestID string      `json:"request_id"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) writeHeaders(h http.Header) {
	for k, vs := range e.Header {
		h[k] = vs
	}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Kind == KindUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="vertal"`)
	}
}
