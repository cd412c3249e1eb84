// Package webhooktest reads the shared webhook signature vectors
// (sdk/testdata/webhook_vectors.json), so that every Go verifier is tested
// against the same cases as the Python SDK.
package webhooktest

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// Vector is one case of the file.
type Vector struct {
	Name      string  `json:"name"`
	Secret    string  `json:"secret"`
	Timestamp int64   `json:"timestamp"`
	Body      string  `json:"body"`
	Header    string  `json:"header"`
	Now       int64   `json:"now"`
	Tolerance int64   `json:"tolerance"` // seconds; 0 means the default
	Valid     bool    `json:"valid"`
	Error     *string `json:"error"` // an error code, nil when valid
}

// NowTime and ToleranceDuration give the case's clock and tolerance as Go
// values.
func (v Vector) NowTime() time.Time { return time.Unix(v.Now, 0) }

// ToleranceDuration is the case's tolerance.
func (v Vector) ToleranceDuration() time.Duration { return time.Duration(v.Tolerance) * time.Second }

// WantCode is the error code the case expects, "" when valid.
func (v Vector) WantCode() string {
	if v.Error == nil {
		return ""
	}
	return *v.Error
}

// Load reads the vectors at path (relative to the calling test's package)
// and fails the test if the file is missing, empty or inconsistent.
func Load(t testing.TB, path string) []Vector {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the webhook vectors: %v", err)
	}
	var doc struct {
		Cases []Vector `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	if len(doc.Cases) == 0 {
		t.Fatalf("%s has no cases", path)
	}
	for _, v := range doc.Cases {
		if v.Valid != (v.Error == nil) {
			t.Fatalf("%s: case %q: valid is %v but error is %v", path, v.Name, v.Valid, v.Error)
		}
	}
	return doc.Cases
}

// Code names a verification error as the vectors do: "" for nil.
func Code(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, webhook.ErrMalformedSignature):
		return "malformed_header"
	case errors.Is(err, webhook.ErrSignatureMismatch):
		return "signature_mismatch"
	case errors.Is(err, webhook.ErrTooOld):
		return "timestamp_too_old"
	case errors.Is(err, webhook.ErrTooNew):
		return "timestamp_too_new"
	}
	return "unexpected: " + err.Error()
}
