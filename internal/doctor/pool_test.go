package doctor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
)

// fakePool answers every Run with out/err and counts it as a hit when warm.
type fakePool struct {
	warm  bool
	ready int
	out   string
	err   error
	stats pool.Stats
}

func (f *fakePool) Run(_ context.Context, s engine.Spec) (engine.Result, error) {
	if f.warm {
		f.stats.Hits++
	} else {
		f.stats.Misses++
	}
	return engine.Result{Status: engine.StatusSucceeded, Stdout: f.out}, f.err
}
func (f *fakePool) Reap(context.Context) (int, error) { return 0, nil }
func (f *fakePool) Name() string                      { return "fake" }
func (f *fakePool) Stats() []pool.Stats {
	s := f.stats
	s.Language, s.Ready = "python", f.ready
	return []pool.Stats{s}
}

func TestPoolChecks(t *testing.T) {
	python := []engine.Language{{Name: "python"}}
	for _, tc := range []struct {
		name string
		pool *fakePool
		want Status
	}{
		{"ran warm", &fakePool{warm: true, ready: 1, out: "42\n"}, StatusOK},
		{"ran cold", &fakePool{warm: false, out: "42\n"}, StatusWarn},
		{"wrong output", &fakePool{warm: true, ready: 1, out: "41\n"}, StatusFail},
		{"platform error", &fakePool{warm: true, ready: 1, err: errors.New("boom")}, StatusFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := poolChecks(context.Background(), tc.pool, python, 10*time.Millisecond)
			if len(checks) != 2 {
				t.Fatalf("got %d checks, want a language row and a state row: %+v", len(checks), checks)
			}
			if c := checks[0]; c.Status != tc.want || c.Essential {
				t.Errorf("warm python = %s (essential %v), want %s, not essential: %s", c.Status, c.Essential, tc.want, c.Detail)
			}
			if c := checks[1]; c.Name != "pool state" || c.Status != StatusOK {
				t.Errorf("state row = %+v", c)
			}
		})
	}
}
