//go:build linux

package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/relaytest"
)

// TestRunEgress runs the one-shot egress suite (package relaytest) on
// every runtime, with the real agent's relay: after every execution,
// with or without EgressDir and whatever its outcome, nothing of it is
// left (bundle, runtime state, cgroups, mounts, processes).
func TestRunEgress(t *testing.T) {
	e2e(t)
	agenttest.ForEachRuntime(t, allRuntimes, func(t *testing.T, rt, agent string) {
		d := newTestDriver(t, rt)
		relaytest.Suite(t, testLanguages()["python"], agent, d.rt.gvisor, func(t *testing.T, ctx context.Context, spec engine.Spec) (engine.Result, error) {
			spec.ID = enginetest.NewID()
			res, err := d.Run(ctx, enginetest.Complete(spec))
			checkNothingLeft(t, d, spec.ID)
			return res, err
		})
	})
}

// checkNothingLeft fails t if anything of d's execution or sandbox id is
// left (see leftovers).
func checkNothingLeft(t *testing.T, d *Driver, id string) {
	t.Helper()
	if diff := cmp.Diff([]string(nil), leftovers(d, d.instance, d.rt, id)); diff != "" {
		t.Errorf("left behind (-want +got):\n%s", diff)
	}
}

// TestReapAfterCrashEgress SIGKILLs a server whose execution has an
// EgressDir: the bind is left in the bundle, and Reap on a new driver
// removes it with the rest, leaving the host's directory alone.
func TestReapAfterCrashEgress(t *testing.T) {
	e2e(t)
	agenttest.ForEachRuntime(t, allRuntimes, func(t *testing.T, rtName, agent string) {
		host := relaytest.NewHost(t)
		t.Setenv(crashEgressEnv, host.Dir)
		t.Setenv(crashAgentEnv, agent)
		stateDir := testStateDir(t)
		sleepArg := fmt.Sprintf("%d.%d", 60000+time.Now().UnixNano()%9000, os.Getpid()%1000)
		child, inst, id := startCrashChild(t, rtName, stateDir, sleepArg, "")
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		if ms := relaytest.MountsOf(t, host.Dir); len(ms) != 1 || !strings.HasPrefix(ms[0], inst+"/") {
			t.Fatalf("after the crash, binds of the egress directory %v; want the 1 in the bundle, or the test proves nothing", ms)
		}
		d, err := New(context.Background(), Options{Runtime: rtName, StateDir: stateDir, CgroupParent: "vertal-test"})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if n, err := d.Reap(context.Background()); n != 1 || err != nil {
			t.Errorf("Reap = %d, %v; want 1, nil", n, err)
		}
		if diff := cmp.Diff([]string(nil), leftovers(d, inst, runtimes[rtName], id)); diff != "" {
			t.Errorf("left behind after Reap (-want +got):\n%s", diff)
		}
		host.Check(t)
		if _, err := os.Stat(inst); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dead instance's directory after Reap: %v", err)
		}
	})
}
