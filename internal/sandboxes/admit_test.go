package sandboxes

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// waitFor polls cond until it holds (no deadline: the test's own bounds it).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if t.Context().Err() != nil {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCommandsShareSlotsFairly: a tenant that floods its sandbox with
// foreground commands holds its plan's one slot and its four queue
// places, past which it gets 503 overloaded at once; a second tenant's
// command still runs in the node's other slot, and a background command
// holds no slot once started.
func TestCommandsShareSlotsFairly(t *testing.T) {
	f := newFixture(t)
	// The smallest documented host: 2 slots, 4 queue places per slot.
	eng := enginetest.New(t, nil, engine.Options{MaxConcurrent: 2, MaxQueue: 8, QueueTimeout: time.Hour})
	f.s.opts.Admit = eng
	a, b := caller("flood", freePlan()), caller("quiet", freePlan()) // free: 1 slot each
	sa := f.create(t, a, CreateRequest{})
	sb := f.create(t, b, CreateRequest{})

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	flood := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = f.s.Run(ctx, a, sa.ID, CommandRequest{Cmd: "sleep 600"}, nil)
		}()
	}
	defer func() { stop(); wg.Wait() }()
	flood()
	waitFor(t, "the flooder's first command holds a slot", func() bool { return eng.Stats().Running == 1 })
	for range 4 {
		flood()
	}
	waitFor(t, "the flooder's share of the queue is full", func() bool { return eng.Stats().Waiting == 4 })

	_, err := f.s.Run(t.Context(), a, sa.ID, CommandRequest{Cmd: "echo over"}, nil)
	var xe *execution.Error
	if !errors.As(err, &xe) || xe.Kind != execution.KindOverloaded || xe.RetryAfter < 1 {
		t.Fatalf("flooder's command past its share: %v, want overloaded with Retry-After", err)
	}
	_, err = f.s.StartCommand(t.Context(), a, sa.ID, CommandRequest{Cmd: "sleep 600"})
	wantKind(t, "flooder's background start past its share", err, execution.KindOverloaded)

	res, err := f.s.Run(t.Context(), b, sb.ID, CommandRequest{Cmd: "echo served"}, nil)
	if err != nil || res.Stdout != "served\n" || res.Status != "succeeded" {
		t.Fatalf("second tenant's command = %+v, %v; want it served while the first floods", res, err)
	}
	cmd, err := f.s.StartCommand(t.Context(), b, sb.ID, CommandRequest{Cmd: "sleep 600"})
	if err != nil || !cmd.Running {
		t.Fatalf("second tenant's background command = %+v, %v", cmd, err)
	}
	if st := eng.Stats(); st.Running != 1 || st.Waiting != 4 {
		t.Errorf("after the second tenant's commands: %+v, want only the flooder's 1 running and 4 waiting (a background command holds no slot)", st)
	}
	// The flooder's quota counted only its create and the one command
	// admitted and running.
	if got := f.used(t, "flood"); got != 2 {
		t.Errorf("flooder's executions counted = %d, want 2, the create and the running command (refused and waiting commands are not counted)", got)
	}

	stop()
	wg.Wait()
	if st := eng.Stats(); st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after the flood ends: %+v, want every slot and place given back", st)
	}
}
