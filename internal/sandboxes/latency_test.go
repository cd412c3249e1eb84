package sandboxes

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// readCounter counts the service's reads of sandbox records.
type readCounter struct {
	Store
	reads atomic.Int64
}

func (r *readCounter) Sandbox(ctx context.Context, tenant, id string) (store.Sandbox, error) {
	r.reads.Add(1)
	return r.Store.Sandbox(ctx, tenant, id)
}

// A command in a sandbox this node holds reads its record once, under the
// sandbox's lock; an id the node has never seen is read before the lock
// too, so a stranger's guesses leave no entry behind.
func TestCommandReadsRecordOnce(t *testing.T) {
	f := newFixture(t)
	c := caller("acme", freePlan())
	sb := f.create(t, c, CreateRequest{})
	rc := &readCounter{Store: f.st}
	f.s.store = rc
	ctx := t.Context()
	if _, err := f.s.Run(ctx, c, sb.ID, CommandRequest{Cmd: "echo hi"}, nil); err != nil {
		t.Fatal(err)
	}
	if n := rc.reads.Load(); n != 1 {
		t.Errorf("a command read the sandbox's record %d times, want 1", n)
	}

	rc.reads.Store(0)
	_, err := f.s.Run(ctx, caller("mallory", freePlan()), sb.ID, CommandRequest{Cmd: "echo hi"}, nil)
	wantKind(t, "another tenant's command", err, execution.KindNotFound)
	if n := rc.reads.Load(); n != 1 {
		t.Errorf("another tenant's command read the record %d times, want 1", n)
	}

	unseen := "sbx_" + "0123456789abcdef0123456789abcdef"
	rc.reads.Store(0)
	_, err = f.s.Run(ctx, c, unseen, CommandRequest{Cmd: "echo hi"}, nil)
	wantKind(t, "a command in an unknown sandbox", err, execution.KindNotFound)
	if n := rc.reads.Load(); n != 1 {
		t.Errorf("an unknown id was read %d times, want 1 (before any lock)", n)
	}
	if f.s.knownEntry(unseen) != nil {
		t.Error("an unknown id left an entry behind")
	}
}
