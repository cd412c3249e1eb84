// Package e2etest gates the tests that need a real host (root, an OCI
// runtime, the sandbox image, Docker, a browser, node): they run when
// VERTAL_E2E=1, which scripts/test.sh sets and CI fails on a skip of, and
// skip elsewhere, saying what they need. It also holds the small helpers
// those tests share (a free loopback port, a buffer for a process's
// output, a poll until a condition holds); it imports nothing of ours, so the tests of every package may
// use it.
package e2etest

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Enabled reports whether VERTAL_E2E=1.
func Enabled() bool { return os.Getenv("VERTAL_E2E") == "1" }

// Require skips t unless Enabled; needs says what the test needs.
func Require(t testing.TB, needs string) {
	t.Helper()
	if !Enabled() {
		t.Skipf("set VERTAL_E2E=1 to run this test (it needs %s)", needs)
	}
}

// ImageDir is the sandbox image directory the end-to-end tests use:
// VERTAL_IMAGE_DIR, else the parent of VERTAL_ROOTFS, else def (callers
// pass config.DefaultImageDir; this package imports nothing of ours, so
// the tests of every package may use it).
func ImageDir(def string) string {
	if d := os.Getenv("VERTAL_IMAGE_DIR"); d != "" {
		return d
	}
	if r := os.Getenv("VERTAL_ROOTFS"); r != "" {
		return filepath.Dir(r)
	}
	return def
}

// DatasciDir is the datasci image directory, which scripts/setup.sh test
// builds: VERTAL_DATASCI_DIR, else /var/lib/vertal/images/datasci.
func DatasciDir() string {
	if d := os.Getenv("VERTAL_DATASCI_DIR"); d != "" {
		return d
	}
	return "/var/lib/vertal/images/datasci"
}

// FreeAddr is a loopback address, 127.0.0.1:PORT, that nothing listened
// on a moment ago: the kernel's pick, closed again before it returns, so
// another process could still take it first.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return freeTCP(t).String()
}

// FreePort is the port of a FreeAddr.
func FreePort(t testing.TB) int {
	t.Helper()
	return freeTCP(t).Port
}

func freeTCP(t testing.TB) *net.TCPAddr {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr)
}

// Buffer collects output, a process's or a logger's, while it is written:
// a bytes.Buffer that one goroutine may write while another reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is all that was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// WaitFor calls cond every poll until it holds, and fails t if it still
// does not after within.
func WaitFor(t testing.TB, within, poll time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(poll) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached in %v", within)
		}
	}
}
