package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// Kind is a class of failure the API reports. The kinds are declared with
// the execution service, which reports them too; kinds maps each to its
// HTTP status and wire code, and nothing else picks a status for an error.
type Kind = execution.Kind

const (
	KindInternal              = execution.KindInternal // zero value: anything unclassified is a 500
	KindInvalidRequest        = execution.KindInvalidRequest
	KindInvalidJSON           = execution.KindInvalidJSON
	KindInvalidContentType    = execution.KindInvalidContentType
	KindInvalidTimeout        = execution.KindInvalidTimeout
	KindUnsupportedLanguage   = execution.KindUnsupportedLanguage
	KindInvalidIdempotencyKey = execution.KindInvalidIdempotencyKey
	KindUnauthorized          = execution.KindUnauthorized
	KindForbidden             = execution.KindForbidden
	KindNotFound              = execution.KindNotFound
	KindMethodNotAllowed      = execution.KindMethodNotAllowed
	KindIdempotencyConflict   = execution.KindIdempotencyConflict
	KindIdempotencyInProgress = execution.KindIdempotencyInProgress
	KindExecutionFinished     = execution.KindExecutionFinished
	KindPayloadTooLarge       = execution.KindPayloadTooLarge
	KindRateLimited           = execution.KindRateLimited
	KindQuotaExceeded         = execution.KindQuotaExceeded
	KindSandboxError          = execution.KindSandboxError
	KindOverloaded            = execution.KindOverloaded
	KindUnavailable           = execution.KindUnavailable
	KindTooManyKeys           = execution.KindTooManyKeys
	KindSandboxNotRunning     = execution.KindSandboxNotRunning
	KindProcessFinished       = execution.KindProcessFinished
	KindSandboxLimit          = execution.KindSandboxLimit
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
	KindExecutionFinished:     {http.StatusConflict, "execution_finished"},
	KindPayloadTooLarge:       {http.StatusRequestEntityTooLarge, "payload_too_large"},
	KindRateLimited:           {http.StatusTooManyRequests, "rate_limited"},
	KindQuotaExceeded:         {http.StatusTooManyRequests, "quota_exceeded"},
	KindInternal:              {http.StatusInternalServerError, "internal_error"},
	KindSandboxError:          {http.StatusInternalServerError, "sandbox_error"},
	KindOverloaded:            {http.StatusServiceUnavailable, "overloaded"},
	KindUnavailable:           {http.StatusServiceUnavailable, "unavailable"},
	KindTooManyKeys:           {http.StatusConflict, "too_many_keys"},
	KindSandboxNotRunning:     {http.StatusConflict, "sandbox_not_running"},
	KindProcessFinished:       {http.StatusConflict, "process_finished"},
	KindSandboxLimit:          {http.StatusTooManyRequests, "sandbox_limit"},
}

// lastKind is the highest kind, for the test that keeps kinds complete.
const lastKind = KindSandboxLimit

// kindStatus is the HTTP status of k.
func kindStatus(k Kind) int { return kinds[k].status }

// kindCode is the wire code of k, e.g. "quota_exceeded".
func kindCode(k Kind) string { return kinds[k].code }

// Error is a failure on its way to the client (see execution.Error): Msg
// is safe to show; Err is the cause and goes only to the log.
type Error = execution.Error

func errorf(k Kind, format string, args ...any) *Error { return execution.Errorf(k, format, args...) }

// internal hides err from the client behind a generic message.
func internal(err error) *Error { return execution.Internal(err) }

// asError classifies any error returned by a handler.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return internal(err)
}

// writeErrorHeaders adds what e tells the client besides its body.
func writeErrorHeaders(e *Error, h http.Header) {
	if e.Quota != nil {
		setQuotaHeaders(h, *e.Quota)
	}
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Kind == KindUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="vertal"`)
	}
}
