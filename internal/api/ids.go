package api

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
)

// randomHex returns prefix followed by 2n hex digits from n random bytes.
// crypto/rand.Read never fails (it aborts the process instead).
func randomHex(prefix string, n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func newRequestID() string { return randomHex("req_", 16) }

// NewKeyID returns a public key id, "key_" + 12 hex.
func NewKeyID() string { return randomHex("key_", 6) }

var keyIDPattern = regexp.MustCompile(`^key_[0-9a-f]{12}$`)

// ValidKeyID reports whether id looks like a key id.
func ValidKeyID(id string) bool { return keyIDPattern.MatchString(id) }
