package sandbox

import (
	"errors"
	"io/fs"
	"testing"
)

// TestProcKB reads a copy of a /proc/meminfo: a value in kB, a count
// without the unit, and what is not there.
func TestProcKB(t *testing.T) {
	if n, err := ProcKB("testdata/meminfo", "MemAvailable:"); err != nil || n != 5123456 {
		t.Errorf("ProcKB(MemAvailable:) = %d, %v; want 5123456", n, err)
	}
	if n, err := ProcKB("testdata/meminfo", "HugePages_Total:"); err != nil || n != 0 {
		t.Errorf("ProcKB(HugePages_Total:) = %d, %v; want 0", n, err)
	}
	if n, err := ProcKB("testdata/meminfo", "VmRSS:"); err == nil {
		t.Errorf("ProcKB(VmRSS:) = %d, nil; want an error", n)
	}
	if _, err := ProcKB("testdata/missing", "MemTotal:"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ProcKB(missing) = %v; want fs.ErrNotExist", err)
	}
}
