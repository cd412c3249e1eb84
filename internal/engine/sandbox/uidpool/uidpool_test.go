package uidpool

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
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

// reapFirst is a range below the default one, so that no sandbox of a
// server on this host runs as one of its uids while a test looks.
const reapFirst = DefaultFirst - 1000

// TestHelperHolder is not a test: TestReapAfterCrashedHolder runs the test
// binary as a child that takes leases, says which, and waits to be killed.
func TestHelperHolder(t *testing.T) {
	dir := os.Getenv("UIDPOOL_HOLDER_DIR")
	if dir == "" {
		return
	}
	p, err := New(dir, reapFirst, 4)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var uids []string
	for range 3 {
		l, err := p.Acquire()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		uids = append(uids, strconv.Itoa(int(l.UID)))
	}
	fmt.Println("leased", strings.Join(uids, " "))
	select {}
}

// TestReapAfterCrashedHolder: a real process takes three leases and is
// SIGKILLed, leaving their files behind with its pid. Reap releases those
// three, keeps the lease a live holder has, and the three uids can be
// leased again.
func TestReapAfterCrashedHolder(t *testing.T) {
	dir := t.TempDir()
	p, err := New(dir, reapFirst, 4)
	if err != nil {
		t.Fatal(err)
	}
	live, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer live.Release()

	child := exec.Command(os.Args[0], "-test.run=^TestHelperHolder$")
	child.Env = append(os.Environ(), "UIDPOOL_HOLDER_DIR="+dir)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "leased ") {
		_ = child.Process.Kill()
		t.Fatalf("holder said %q, %v", line, err)
	}
	crashed := strings.Fields(strings.TrimPrefix(line, "leased "))
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	for _, u := range crashed {
		b, err := os.ReadFile(filepath.Join(dir, u))
		if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(child.Process.Pid) {
			t.Fatalf("lease file of uid %s after the crash: %q, %v; want the dead holder's pid", u, b, err)
		}
	}

	n, err := p.Reap()
	if err != nil || n != 3 {
		t.Fatalf("Reap = %d, %v; want the crashed holder's 3 leases released", n, err)
	}
	for _, u := range crashed {
		if _, err := os.Stat(filepath.Join(dir, u)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("lease file of uid %s still there after Reap (%v)", u, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(int(live.UID)))); err != nil {
		t.Errorf("Reap removed the live holder's lease: %v", err)
	}
	// A second pool (the restarted server) gets exactly the crashed uids.
	q, err := New(dir, reapFirst, 4)
	if err != nil {
		t.Fatal(err)
	}
	var again []string
	for range 3 {
		l, err := q.Acquire()
		if err != nil {
			t.Fatalf("leasing after Reap: %v (have %v)", err, again)
		}
		again = append(again, strconv.Itoa(int(l.UID)))
	}
	slices.Sort(again)
	slices.Sort(crashed)
	if !slices.Equal(again, crashed) {
		t.Errorf("leased %v after Reap; want the crashed holder's %v", again, crashed)
	}
	if _, err := q.Acquire(); !errors.Is(err, ErrExhausted) {
		t.Errorf("a fifth lease: %v, want ErrExhausted (the live lease is kept)", err)
	}
}

// TestReapKeepsRunningUIDs: a stale lease of a uid that a process still
// runs as is kept; one whose only process is a zombie (an exited sandbox
// nobody reaps) is released. Needs root to run processes as other uids.
func TestReapKeepsRunningUIDs(t *testing.T) {
	e2etest.Require(t, "root, to run processes as sandbox uids")
	dir := t.TempDir()
	p, err := New(dir, reapFirst, 4)
	if err != nil {
		t.Fatal(err)
	}
	runAs := func(uid uint32, args ...string) *exec.Cmd {
		c := exec.Command(args[0], args[1:]...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	busy, gone := uint32(reapFirst), uint32(reapFirst+1)
	sleeper := runAs(busy, "/bin/sleep", "60")
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	// Not waited for until the end: it stays a zombie owned by gone.
	exited := runAs(gone, "/bin/true")
	defer func() { _ = exited.Wait() }()
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", exited.Process.Pid))
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			break
		}
		syscall.Nanosleep(&syscall.Timespec{Nsec: 10e6}, nil)
	}
	for _, uid := range []uint32{busy, gone} {
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(int(uid))), []byte("999999999\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := p.Reap()
	if err != nil || n != 1 {
		t.Fatalf("Reap = %d, %v; want 1 (the zombie's uid)", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(int(busy)))); err != nil {
		t.Errorf("the lease of a uid a process runs as was released: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(int(gone)))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lease of a uid only a zombie has was kept: %v", err)
	}
}

// TestHeld: a uid is held while its lease is, or while a process runs as
// it; Held never creates a lease file.
func TestHeld(t *testing.T) {
	dir := t.TempDir()
	p, err := New(dir, 5000, 4)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[uint32]bool{}
	p.running = func(uid uint32) bool { return runs[uid] }
	l, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	other := p.first + (l.UID-p.first+1)%p.count
	if !p.Held(l.UID) {
		t.Errorf("uid %d with a live lease is not held", l.UID)
	}
	if p.Held(other) {
		t.Errorf("uid %d without a lease is held", other)
	}
	if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(int(other)))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Held created a lease file: %v", err)
	}
	runs[other] = true
	if !p.Held(other) {
		t.Errorf("uid %d that a process runs as is not held", other)
	}
	l.Release()
	if p.Held(l.UID) {
		t.Errorf("uid %d is held after its release", l.UID)
	}
	if p.Held(4999) || p.Contains(4999) || !p.Contains(5003) || p.Contains(5004) {
		t.Errorf("range 5000+4: Contains or Held wrong at its edges")
	}
}
