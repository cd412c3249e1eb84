package sandbox

import (
	"sync"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// CappedBuffer keeps the first Max bytes written to it and discards the
// rest as it arrives, so a flood of output costs no memory. It is safe for
// concurrent use.
type CappedBuffer struct {
	Max int

	mu        sync.Mutex
	buf       []byte
	truncated bool
	// onKeep, if set, gets every kept piece as it is kept (under mu, so
	// the pieces of one buffer arrive in order).
	onKeep func([]byte)
}

// Write never fails: bytes past Max are counted as truncation and dropped.
func (b *CappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.Max - len(b.buf)
	if room > 0 {
		n := min(room, len(p))
		b.buf = append(b.buf, p[:n]...)
		if b.onKeep != nil && n > 0 {
			b.onKeep(append([]byte(nil), p[:n]...))
		}
		if n < len(p) {
			b.truncated = true
		}
	} else if len(p) > 0 {
		b.truncated = true
	}
	return len(p), nil
}

// String returns what was kept.
func (b *CappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// Truncated reports whether anything was dropped.
func (b *CappedBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.truncated
}

// Classify turns how a sandbox ended into a Status and exit code.
// exitCode is the process's exit status (or 128+signal if killed);
// timedOut and oomKilled are what the driver observed.
func Classify(exitCode int, timedOut, oomKilled bool) engine.Status {
	switch {
	case timedOut:
		return engine.StatusTimedOut
	case oomKilled:
		return engine.StatusMemoryExceeded
	case exitCode == 0:
		return engine.StatusSucceeded
	default:
		return engine.StatusFailed
	}
}
