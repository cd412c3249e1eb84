package queue

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres/pgtest"
)

// crashChild, when set to "sqlite:PATH" or "postgres:URL", makes the test
// binary the node that crashes: it starts the queue there, enqueues one
// run and one delivery, and blocks in both jobs until it is killed.
const crashChild = "VERTAL_QUEUE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if target := os.Getenv(crashChild); target != "" {
		if err := runCrashChild(target); err != nil {
			fmt.Fprintln(os.Stderr, "crash child:", err)
			os.Exit(3)
		}
		return
	}
	os.Exit(m.Run())
}

func runCrashChild(target string) error {
	ctx := context.Background()
	block := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	h := Handlers{
		Run:     func(ctx context.Context, _, _ string) error { return block(ctx) },
		Deliver: func(ctx context.Context, _, _ string, _ int, _ time.Time) error { return block(ctx) },
	}
	q, err := openTarget(ctx, target, Options{NodeID: "node-a", PollInterval: 20 * time.Millisecond, RescueAfter: time.Hour})
	if err != nil {
		return err
	}
	if err := q.EnqueueRuns(ctx, []RunArgs{{Tenant: "t", ExecutionID: "e1"}}); err != nil {
		return err
	}
	if err := q.EnqueueDelivery(ctx, DeliverArgs{Tenant: "t", ExecutionID: "e2"}); err != nil {
		return err
	}
	if err := q.Start(ctx, h); err != nil {
		return err
	}
	select {}
}

// openTarget opens a Queue on "sqlite:PATH" or "postgres:URL".
func openTarget(ctx context.Context, target string, o Options) (*Queue, error) {
	kind, where, _ := strings.Cut(target, ":")
	if kind == "sqlite" {
		db, err := sql.Open("sqlite", where+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(1)
		return OpenSQLite(ctx, db, o)
	}
	pool, err := pgxpool.New(ctx, where)
	if err != nil {
		return nil, err
	}
	return OpenPostgres(ctx, pool, o)
}

// countRunning counts River's running jobs at target, on a connection of
// its own.
func countRunning(ctx context.Context, target string) (int, error) {
	kind, where, _ := strings.Cut(target, ":")
	var n int
	if kind == "sqlite" {
		db, err := sql.Open("sqlite", where+"?_pragma=busy_timeout(10000)")
		if err != nil {
			return 0, err
		}
		defer db.Close()
		err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM river_job WHERE state = 'running'`).Scan(&n)
		return n, err
	}
	conn, err := pgx.Connect(ctx, where)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT COUNT(*) FROM river_job WHERE state = 'running'`).Scan(&n)
	return n, err
}

// TestRescueAfterCrash: a node is SIGKILLed while it works a run job and
// a delivery job. Started again under the same id (what a restarted
// server does), or as another node, the queue gets both jobs back once
// RescueAfter has passed, and works each once. (River hands back only
// jobs whose timeout has passed: with none set, they stayed running
// forever and their executions and webhooks were never finished.)
func TestRescueAfterCrash(t *testing.T) {
	targets := []struct{ name, target, node string }{
		{"sqlite", "sqlite:" + filepath.Join(t.TempDir(), "q.db"), "node-a"},
	}
	if os.Getenv(pgtest.EnvVar) != "" {
		targets = append(targets, struct{ name, target, node string }{"postgres", "postgres:" + pgtest.NewDatabase(t), "node-b"})
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), crashChild+"="+tc.target)
			child.Stderr = os.Stderr
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			r := newRecorder()
			q, err := openTarget(ctx, tc.target, Options{NodeID: tc.node, PollInterval: 20 * time.Millisecond, RescueAfter: time.Second})
			if err != nil {
				child.Process.Kill()
				t.Fatal(err)
			}
			running := func() int {
				n, err := countRunning(ctx, tc.target)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			for deadline := time.Now().Add(30 * time.Second); running() < 2; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					child.Process.Kill()
					t.Fatal("the child never had both jobs running")
				}
			}
			_ = child.Process.Kill()
			_ = child.Wait()

			start := time.Now()
			if err := q.Start(ctx, r.handlers()); err != nil {
				t.Fatal(err)
			}
			defer q.Stop(ctx)
			got := map[string]int{}
			for len(got) < 2 {
				select {
				case id := <-r.done:
					got[id]++
					t.Logf("%s worked again %v after the restart", id, time.Since(start).Round(time.Millisecond))
				case <-time.After(2 * time.Minute):
					t.Fatalf("2 minutes after the crash only %v were worked again; %d jobs still running", got, running())
				}
			}
			time.Sleep(300 * time.Millisecond) // room for a wrong second run
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.runs["e1"] != 1 || len(r.attempts["e2"]) != 1 {
				t.Errorf("after the rescue: runs %v, delivery attempts %v; want one each", r.runs, r.attempts)
			}
		})
	}
}

// TestConcurrentStart: nodes that start at the same moment on one fresh
// database all migrate River's tables and open (on PostgreSQL they used to
// deadlock in the migration, and one node failed to start).
func TestConcurrentStart(t *testing.T) {
	targets := []struct{ name, target string }{
		{"sqlite", "sqlite:" + filepath.Join(t.TempDir(), "q.db")},
	}
	if os.Getenv(pgtest.EnvVar) != "" {
		targets = append(targets, struct{ name, target string }{"postgres", "postgres:" + pgtest.NewDatabase(t)})
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			const nodes = 4
			errs := make(chan error, nodes)
			for i := range nodes {
				go func() {
					_, err := openTarget(context.Background(), tc.target, Options{NodeID: fmt.Sprintf("node-%d", i)})
					errs <- err
				}()
			}
			for range nodes {
				if err := <-errs; err != nil {
					t.Errorf("a node starting with the others: %v", err)
				}
			}
		})
	}
}
