package queue

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// openDB opens a SQLite file as the store does: one writer connection.
func openDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

type recorder struct {
	mu       sync.Mutex
	runs     map[string]int
	busy     map[string]bool // answer ErrBusy once
	attempts map[string][]int
	failFor  int // deliveries fail this many times
	done     chan string
}

func (r *recorder) handlers() Handlers {
	return Handlers{
		Run: func(ctx context.Context, tenant, id string) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.busy[id] {
				r.busy[id] = false
				return ErrBusy
			}
			r.runs[id]++
			r.done <- id
			return nil
		},
		Deliver: func(ctx context.Context, tenant, id string, attempt int, first time.Time) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.attempts[id] = append(r.attempts[id], attempt)
			if id == "never" && attempt >= 3 {
				r.done <- id
				return Permanent(errors.New("gave up"))
			}
			if attempt <= r.failFor {
				return errors.New("receiver answered 500")
			}
			r.done <- id
			return nil
		},
	}
}

func newRecorder() *recorder {
	return &recorder{runs: map[string]int{}, busy: map[string]bool{}, attempts: map[string][]int{}, done: make(chan string, 100)}
}

// TestSQLiteQueue runs River on a real SQLite file: every job runs exactly
// once (a second enqueue of the same execution is dropped), a busy answer
// is tried again, a failed delivery is retried with backoff, and a
// permanent failure stops.
func TestSQLiteQueue(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, filepath.Join(t.TempDir(), "q.db"))
	r := newRecorder()
	r.busy["e3"] = true
	r.failFor = 2
	q, err := OpenSQLite(ctx, db, Options{Workers: 2, PollInterval: 20 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryCap: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var jobs []RunArgs
	for _, id := range []string{"e1", "e2", "e3", "e4", "e5"} {
		jobs = append(jobs, RunArgs{Tenant: "t", ExecutionID: id})
	}
	if err := q.EnqueueRuns(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	if err := q.EnqueueRuns(ctx, jobs[:2]); err != nil { // the start-up sweep's duplicate
		t.Fatal(err)
	}
	for _, id := range []string{"ok", "never"} {
		if err := q.EnqueueDelivery(ctx, DeliverArgs{Tenant: "t", ExecutionID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Start(ctx, r.handlers()); err != nil {
		t.Fatal(err)
	}
	defer q.Stop(ctx)
	want := 7 // 5 runs, 2 deliveries ending
	for got := 0; got < want; got++ {
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d jobs ended; runs %v attempts %v", got, want, r.runs, r.attempts)
		}
	}
	time.Sleep(300 * time.Millisecond) // room for a wrong second run
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range jobs {
		if r.runs[j.ExecutionID] != 1 {
			t.Errorf("%s ran %d times; want once", j.ExecutionID, r.runs[j.ExecutionID])
		}
	}
	if got := r.attempts["ok"]; len(got) != 3 {
		t.Errorf("delivery attempts %v; want 3 (two failures, then success)", got)
	}
	if got := r.attempts["never"]; len(got) != 3 {
		t.Errorf("permanent failure after attempts %v; want it to stop at 3", got)
	}
}

func TestBackoff(t *testing.T) {
	base, cap := 10*time.Second, time.Hour
	for _, tc := range []struct {
		attempt int
		max     time.Duration
	}{{1, 10 * time.Second}, {2, 20 * time.Second}, {4, 80 * time.Second}, {30, time.Hour}} {
		for range 50 {
			d := Backoff(tc.attempt, base, cap)
			if d < tc.max/2 || d > tc.max {
				t.Fatalf("Backoff(%d) = %v; want in [%v, %v]", tc.attempt, d, tc.max/2, tc.max)
			}
		}
	}
}

// TestPriority: a tenant's first queued job goes before every tenant's
// second, and so on up to River's lowest priority.
func TestPriority(t *testing.T) {
	for _, tc := range []struct {
		backlog int64
		want    int
	}{{-1, 1}, {0, 1}, {1, 2}, {2, 3}, {3, 4}, {19, 4}, {1 << 40, 4}} {
		if got := Priority(tc.backlog); got != tc.want {
			t.Errorf("Priority(%d) = %d, want %d", tc.backlog, got, tc.want)
		}
	}
}

// TestQuietStart: opening, starting and stopping a queue on a fresh
// database logs nothing at info (River's migration, poll-mode and
// client lines go to debug), while debug still sees them.
func TestQuietStart(t *testing.T) {
	for _, tc := range []struct {
		level slog.Level
		want  bool // River's lines visible
	}{
		{slog.LevelInfo, false},
		{slog.LevelDebug, true},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t, filepath.Join(t.TempDir(), "q.db"))
			var buf bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			q, err := OpenSQLite(ctx, db, Options{Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Start(ctx, newRecorder().handlers()); err != nil {
				t.Fatal(err)
			}
			q.Stop(ctx)
			got := strings.Contains(buf.String(), "Applied migration")
			if got != tc.want {
				t.Errorf("River's lines visible = %v, want %v; log:\n%s", got, tc.want, buf.String())
			}
			if strings.Contains(buf.String(), "level=INFO") {
				t.Errorf("info lines logged:\n%s", buf.String())
			}
		})
	}
}
