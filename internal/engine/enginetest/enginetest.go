// Package enginetest builds, for tests, the complete Specs that the
// scheduler, the pool, the drivers and the loop take as given: in the
// server only execution.prepare makes them, so a test that drives the
// engine without it makes them here, in one place. It builds engines
// with complete queue options the same way, and keeps of a Result what
// two runs of one program must agree on (Outcome).
package enginetest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Options returns the queue options a server with slots sandbox slots and
// config's defaults runs with: 4 places per slot and a 30 s queue timeout
// (config.DefaultQueuePerSlot and config.DefaultQueue, written out here:
// config sits above the engine and may not be imported from under it;
// TestQueueDefaultsMatch in config checks that they agree).
func Options(slots int) engine.Options {
	return engine.Options{MaxConcurrent: slots, MaxQueue: 4 * slots, QueueTimeout: 30 * time.Second}
}

// New returns engine.New(d, opts), failing t if opts are refused.
func New(t testing.TB, d engine.Driver, opts engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.New(d, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

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

// WaitDone waits up to within for the live sandbox l to end; if it does
// not, t fails, named by what.
func WaitDone(t testing.TB, l engine.Live, what string, within time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(within):
		t.Fatalf("%s: the sandbox did not end within %v", what, within)
	}
}

// Outcome is what two runs of one program must agree on, as the warm
// pools' tests compare a warm run with a cold one: not the duration,
// usage or files of their Results.
type Outcome struct {
	Status    engine.Status
	Stdout    string
	Stderr    string
	ExitCode  int
	Truncated bool
}

// OutcomeOf is r's Outcome.
func OutcomeOf(r engine.Result) Outcome {
	return Outcome{r.Status, r.Stdout, r.Stderr, r.ExitCode, r.Truncated}
}

// NewID returns a fresh execution id shaped like the API's.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "exe_" + hex.EncodeToString(b[:])
}
