// Package e2etest gates the tests that need a real host (root, an OCI
// runtime, the sandbox image, Docker, a browser, node): they run when
// VERTAL_E2E=1, which scripts/test.sh sets and CI fails on a skip of, and
// skip elsewhere, saying what they need.
package e2etest

import (
	"os"
	"path/filepath"
	"testing"
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
