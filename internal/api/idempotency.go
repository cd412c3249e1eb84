package api

import (
	"net/http"
	"regexp"
)

var idempotencyKeyPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,255}$`)

// idempotencyKey returns the request's Idempotency-Key, "" when absent.
// A header that is present must be valid, even when empty.
func idempotencyKey(r *http.Request) (string, error) {
	vs, ok := r.Header[http.CanonicalHeaderKey("Idempotency-Key")]
	if !ok {
		return "", nil
	}
	if len(vs) != 1 || !idempotencyKeyPattern.MatchString(vs[0]) {
		return "", errorf(KindInvalidIdempotencyKey, "Idempotency-Key must be 1-255 characters of letters, digits, '.', '_', ':' and '-'")
	}
	return vs[0], nil
}
