package uidpool

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func newTestPool(t *testing.T, count uint32, running func(uint32) bool) *Pool {
	t.Helper()
	p, err := New(t.TempDir(), 5000, count)
	if err != nil {
		t.Fatal(err)
	}
	p.running = running
	return p
}

func never(uint32) bool { return false }

func TestLeasesAreDistinctUntilReleased(t *testing.T) {
	p := newTestPool(t, 3, never)
	seen := map[uint32]bool{}
	var leases []*Lease
	for range 3 {
		l, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		if seen[l.UID] || l.UID < 5000 || l.UID >= 5003 {
			t.Fatalf("uid %d: leased twice or out of range (have %v)", l.UID, seen)
		}
		seen[l.UID] = true
		leases = append(leases, l)
	}
	if _, err := p.Acquire(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("fourth Acquire: err %v, want ErrExhausted", err)
	}
	leases[1].Release()
	leases[1].Release() // twice is harmless
	l, err := p.Acquire()
	if err != nil || l.UID != leases[1].UID {
		t.Fatalf("after Release: uid %v err %v; want %d", l, err, leases[1].UID)
	}
}

// Release removes the uid's file, so the directory holds only live (or
// abandoned) leases; Abandon leaves it, naming the holder.
func TestFilesOfReleasedAndAbandonedLeases(t *testing.T) {
	for _, tc := range []struct {
		name     string
		end      func(*Lease)
		wantFile bool
	}{
		{"released", (*Lease).Release, false},
		{"abandoned", (*Lease).Abandon, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 4, never)
			l, err := p.Acquire()
			if err != nil {
				t.Fatal(err)
			}
			tc.end(l)
			_, err = os.Stat(filepath.Join(p.dir, strconv.Itoa(int(l.UID))))
			if got := err == nil; got != tc.wantFile {
				t.Errorf("file exists %v, want %v (stat: %v)", got, tc.wantFile, err)
			}
		})
	}
}

// A second pool on the same directory stands for another server on the
// host: it must never get a uid the first one holds.
func TestPoolsShareTheDirectory(t *testing.T) {
	dir := t.TempDir()
	a, err := New(dir, 5000, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(dir, 5000, 2)
	if err != nil {
		t.Fatal(err)
	}
	la, err := a.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	if la.UID == lb.UID {
		t.Fatalf("both pools leased uid %d", la.UID)
	}
	if _, err := b.Acquire(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("err %v, want ErrExhausted", err)
	}
}

// A lease whose holder died (file not empty, lock free) is reused only
// when no process runs as its uid.
func TestDeadHoldersUID(t *testing.T) {
	for _, tc := range []struct {
		name    string
		running bool
		wantErr error
	}{
		{"sandbox_still_running", true, ErrExhausted},
		{"nothing_left", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, 1, func(uint32) bool { return tc.running })
			if err := os.WriteFile(filepath.Join(p.dir, "5000"), []byte("12345\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := p.Acquire()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err == nil && l.UID != 5000 {
				t.Fatalf("uid %d, want 5000", l.UID)
			}
		})
	}
}

func TestNewRejectsBadRanges(t *testing.T) {
	for _, tc := range []struct {
		name         string
		first, count uint32
	}{
		{"system_uids", 1, 10},
		{"past_2^31", 1<<31 - 5, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(t.TempDir(), tc.first, tc.count); err == nil {
				t.Errorf("New(%d, %d) succeeded", tc.first, tc.count)
			}
		})
	}
}

func TestUIDRunning(t *testing.T) {
	if !uidRunning(uint32(os.Geteuid())) {
		t.Errorf("uidRunning(own euid %d) = false", os.Geteuid())
	}
	if uidRunning(DefaultFirst + DefaultCount - 1) {
		t.Errorf("a process runs as the last sandbox uid")
	}
}
