// Package enginetest builds, for tests, the complete Specs that the
// scheduler, the pool, the drivers and the loop take as given: in the
// server only execution.prepare makes them, so a test that drives the
// engine without it makes them here, in one place.
package enginetest

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Complete returns s as execution.prepare would have made it: a fresh
// execution id if it has none, engine.DefaultTimeout if it has no
// timeout, and the engine's default for every limit it leaves zero
// (engine.Limits.WithDefaults).
func Complete(s engine.Spec) engine.Spec {
	if s.ID == "" {
		s.ID = NewID()
	}
	if s.Timeout <= 0 {
		s.Timeout = engine.DefaultTimeout
	}
	s.Limits = s.Limits.WithDefaults(s.Timeout)
	return s
}

// NewID returns a fresh execution id shaped like the API's.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "exe_" + hex.EncodeToString(b[:])
}
