//go:build linux

package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest"
)

// e2e skips unless VERTAL_E2E=1 (CI always sets it: root, crun, runc,
// runsc and the root filesystem are there).
func e2e(t *testing.T) { e2etest.Require(t, "real OCI runtimes, root and the rootfs") }

func rootfs() string {
	if p := os.Getenv("VERTAL_ROOTFS"); p != "" {
		return p
	}
	return "/var/lib/vertal/images/default/rootfs"
}

// testLanguages are the languages of the default image.
func testLanguages() map[string]engine.Language { return languagesOn(rootfs()) }

// languagesOn are the built-in languages on the image rooted at img.
func languagesOn(img string) map[string]engine.Language {
	return map[string]engine.Language{
		"python":     {Name: "python", Image: img, File: "main.py", Command: []string{"/usr/bin/python3"}},
		"javascript": {Name: "javascript", Image: img, File: "main.js", Command: []string{"/usr/local/bin/node"}},
		"bash":       {Name: "bash", Image: img, File: "main.sh", Command: []string{"/bin/bash"}},
	}
}

// newTestDriver returns a driver on a private state dir that is closed,
// and checked to be empty, when the test ends.
func newTestDriver(t *testing.T, runtime string) *Driver {
	t.Helper()
	d, err := New(context.Background(), Options{Runtime: runtime, StateDir: testStateDir(t), CgroupParent: "vertal-test"})
	if err != nil {
		t.Fatalf("New(%s): %v", runtime, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

var allRuntimes = []string{"crun", "runc", "runsc", "bwrap"}

// testStateDir is a state dir for a test driver. t.TempDir's parent is
// private to root; bwrap runs as the sandbox's uid and must pass it.
func testStateDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestSecuritySuite(t *testing.T) {
	e2e(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			securitytest.Run(t, d, testLanguages())
		})
	}
}

// TestSecuritySuiteDatasci runs the suite on the datasci image
// (e2etest.DatasciDir, which scripts/setup.sh builds): its extra
// packages must open no way out. Its rootfs is the link to the current
// version, as the server uses it.
func TestSecuritySuiteDatasci(t *testing.T) {
	e2e(t)
	dir := e2etest.DatasciDir()
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			securitytest.Run(t, newTestDriver(t, rt), languagesOn(dir+"/rootfs"))
		})
	}
}

// BenchmarkRun measures one print(6*7) execution per runtime, end to end,
// next to the bare interpreter on the host. Besides wall time it reports
// the CPU time per execution (this process and every process it waited
// for), which a busy machine disturbs less.
func BenchmarkRun(b *testing.B) {
	if os.Getenv("VERTAL_E2E") != "1" {
		b.Skip("set VERTAL_E2E=1")
	}
	b.Run("bare", func(b *testing.B) {
		cpu := cpuMeter(b)
		for b.Loop() {
			cmd := exec.Command("/usr/bin/python3", "-c", "print(6*7)")
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			if out, err := cmd.Output(); err != nil || string(out) != "42\n" {
				b.Fatalf("%q %v", out, err)
			}
		}
		cpu()
	})
	for _, rt := range allRuntimes {
		b.Run(rt, func(b *testing.B) {
			d, err := New(context.Background(), Options{Runtime: rt, StateDir: testStateDir(b), CgroupParent: "vertal-test"})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			spec := engine.Spec{Language: testLanguages()["python"], Code: "print(6*7)"}
			cpu := cpuMeter(b)
			for b.Loop() {
				res, err := d.Run(context.Background(), enginetest.Complete(spec))
				if err != nil || res.Stdout != "42\n" {
					b.Fatalf("%q %v", res.Stdout, err)
				}
			}
			cpu()
		})
	}
}

// cpuMeter reports CPU milliseconds per iteration when the returned
// function is called.
func cpuMeter(b *testing.B) func() {
	total := func() time.Duration {
		var self, children syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
		var sum time.Duration
		for _, r := range []syscall.Rusage{self, children} {
			sum += time.Duration(r.Utime.Nano() + r.Stime.Nano())
		}
		return sum
	}
	start := total()
	return func() {
		b.ReportMetric(float64(total()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
}
