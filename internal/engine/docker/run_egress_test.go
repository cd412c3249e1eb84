package docker

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/relaytest"
)

// TestRunEgress runs the one-shot egress suite (package relaytest) on
// each runtime, with the real agent's relay: after every execution, with
// or without EgressDir and whatever its outcome, nothing of it is left
// (container, state directory, mounts, cgroup), and the agent's bind is
// gone too.
func TestRunEgress(t *testing.T) {
	requireE2E(t)
	agenttest.ForEachRuntime(t, runtimes, func(t *testing.T, rt, agent string) {
		d := newTestDriver(t, rt)
		relaytest.Suite(t, languages["python"], agent, d.gvisor, func(t *testing.T, ctx context.Context, spec engine.Spec) (engine.Result, error) {
			spec.ID = newID(t)
			res, err := d.Run(ctx, enginetest.Complete(spec))
			assertNothingLeft(t, d, spec.ID)
			if ms, _ := sandbox.MountsUnder(d.codeDir(spec.ID)); len(ms) > 0 {
				t.Errorf("mounts left in the execution's directory: %v", ms)
			}
			if ms := relaytest.MountsOf(t, agent); len(ms) > 0 {
				t.Errorf("binds of the agent left on the host: %v", ms)
			}
			return res, err
		})
	})
}

// TestReapAfterSIGKILLEgress kills a server whose execution has an
// EgressDir: the binds of the directory and the agent are left in the
// execution's state directory, and the next server's Reap removes them
// with the rest, leaving the host's directory alone.
func TestReapAfterSIGKILLEgress(t *testing.T) {
	requireE2E(t)
	agenttest.ForEachRuntime(t, runtimes, func(t *testing.T, rt, agent string) {
		host := relaytest.NewHost(t)
		stateDir, id := t.TempDir(), newID(t)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), reapEgressEnv+"="+host.Dir, reapAgentEnv+"="+agent,
			reapHelperEnv+"="+strings.Join([]string{rt, stateDir, id, "sleep 600"}, ","))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		ctx := context.Background()
		cli := newTestDriver(t, rt).cli
		waitFor(t, func() bool {
			list, err := cli.ContainerList(ctx, byLabel(labelExecution, id))
			return err == nil && len(list) == 1 && list[0].State == "running"
		})
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		for _, p := range []string{host.Dir, agent} {
			if ms := relaytest.MountsOf(t, p); len(ms) != 1 || !strings.HasPrefix(ms[0], stateDir+"/") {
				t.Fatalf("after SIGKILL, binds of %s: %v; want the 1 in the state directory, or the test proves nothing", p, ms)
			}
		}
		d := newTestDriverIn(t, rt, stateDir)
		if n, err := d.Reap(ctx); n < 1 || err != nil {
			t.Fatalf("Reap() = %d, %v; want at least the 1 leftover, nil", n, err)
		}
		insts, _ := filepath.Glob(filepath.Join(stateDir, "*"+lockSuffix))
		for _, l := range insts {
			if inst := strings.TrimSuffix(filepath.Base(l), lockSuffix); inst != d.instance {
				t.Errorf("after Reap, the dead instance's lock %s remains", l)
			}
		}
		host.Check(t)
		if ms := relaytest.MountsOf(t, agent); len(ms) > 0 {
			t.Errorf("after Reap, binds of the agent remain: %v", ms)
		}
		if list, _ := cli.ContainerList(ctx, byLabel(labelExecution, id)); len(list) != 0 {
			t.Errorf("after Reap, %d containers of the execution remain", len(list))
		}
	})
}

// reapEgressEnv and reapAgentEnv, when set, give the reap helper's
// execution an EgressDir and the agent.
const (
	reapEgressEnv = "VERTAL_DOCKER_REAP_EGRESS"
	reapAgentEnv  = "VERTAL_DOCKER_REAP_AGENT"
)
