package client

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Error codes the API documents. Compare with [Error.Code], or use
// [errors.Is] with the sentinel errors below.
const (
	CodeInvalidRequest        = "invalid_request"
	CodeInvalidJSON           = "invalid_json"
	CodeInvalidTimeout        = "invalid_timeout"
	CodeUnsupportedLanguage   = "unsupported_language"
	CodeInvalidIdempotencyKey = "invalid_idempotency_key"
	CodeUnauthorized          = "unauthorized"
	CodeForbidden             = "forbidden"
	CodeNotFound              = "not_found"
	CodeIdempotencyConflict   = "idempotency_conflict"
	// CodeIdempotencyInProgress: a request with the same key is still
	// running. Run retries it; the retry gets the first result.
	CodeIdempotencyInProgress = "idempotency_in_progress"
	CodePayloadTooLarge       = "payload_too_large"
	CodeRateLimited           = "rate_limited"
	CodeQuotaExceeded         = "quota_exceeded"
	CodeOverloaded            = "overloaded"
)

// Sentinels matched by an *Error of the same code through errors.Is, so
// callers can write errors.Is(err, client.ErrQuotaExceeded).
var (
	ErrUnauthorized        = errors.New("vertal: " + CodeUnauthorized)
	ErrNotFound            = errors.New("vertal: " + CodeNotFound)
	ErrQuotaExceeded       = errors.New("vertal: " + CodeQuotaExceeded)
	ErrRateLimited         = errors.New("vertal: " + CodeRateLimited)
	ErrOverloaded          = errors.New("vertal: " + CodeOverloaded)
	ErrIdempotencyConflict = errors.New("vertal: " + CodeIdempotencyConflict)

	// ErrNoAPIKey is returned by FromEnv when KUBO_API_KEY is not set.
	ErrNoAPIKey = errors.New("vertal: no API key (set KUBO_API_KEY)")
)

var sentinelByCode = map[string]error{
	CodeUnauthorized:        ErrUnauthorized,
	CodeNotFound:            ErrNotFound,
	CodeQuotaExceeded:       ErrQuotaExceeded,
	CodeRateLimited:         ErrRateLimited,
	CodeOverloaded:          ErrOverloaded,
	CodeIdempotencyConflict: ErrIdempotencyConflict,
}

// Error is a failure reported by the API: any non-2xx response, or an
// error event of a stream. Transport
// failures (DNS, refused connections, cancelled contexts) are returned as
// the underlying error instead.
type Error struct {
	// StatusCode is the HTTP status, e.g. 429; 0 for an error event of a
	// stream, which fails after its 200 was sent.
	StatusCode int
	// Code is the API's error code, e.g. "quota_exceeded". When the body was
	// not the API's error shape (a proxy's HTML page, say) it is
	// "http_<status>".
	Code string
	// Message is the API's human-readable explanation.
	Message string
	// RequestID identifies the request in the server's logs ("req_...").
	RequestID string
	// RetryAfter is the server's Retry-After hint; zero when absent.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "vertal: %s", e.Code)
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	var details []string
	if e.StatusCode != 0 {
		details = append(details, fmt.Sprintf("HTTP %d", e.StatusCode))
	}
	if e.RequestID != "" {
		details = append(details, "request "+e.RequestID)
	}
	if len(details) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(details, ", "))
	}
	return b.String()
}

// Is reports whether target is the sentinel for e's code.
func (e *Error) Is(target error) bool {
	s, ok := sentinelByCode[e.Code]
	return ok && s == target
}
