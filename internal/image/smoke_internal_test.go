package image

import (
	"context"
	"os"
	"testing"
)

// TestSmokeTestsOnDefaultImage runs the image checks' interpreters (from
// package lang) in the built default image: each prints 42.
func TestSmokeTestsOnDefaultImage(t *testing.T) {
	if os.Getenv("VERTAL_E2E") != "1" {
		t.Skip("set VERTAL_E2E=1 (needs root and the default image)")
	}
	root := os.Getenv("VERTAL_ROOTFS")
	if root == "" {
		root = "/var/lib/vertal/images/default/rootfs"
	}
	v, err := detectVersions(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	if v.Python == "" || v.JavaScript == "" || v.Bash == "" {
		t.Errorf("versions %+v: want all three", v)
	}
}
