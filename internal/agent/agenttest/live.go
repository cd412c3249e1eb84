package agenttest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// ForEachRuntime builds the real agent (Build) and runs f, with
// the agent's path, as a subtest of t for each of runtimes.
func ForEachRuntime(t *testing.T, runtimes []string, f func(t *testing.T, rt, agent string)) {
	t.Helper()
	bin := Build(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) { f(t, rt, bin) })
	}
}

// Live is a driver under test, on one runtime, as LiveSuite drives it.
type Live struct {
	// Driver is the driver: LiveSuite starts on it directly the
	// sandboxes it expects refused.
	Driver engine.Starter
	// Gvisor says the driver runs runsc (see CheckEgress).
	Gvisor bool
	// Spec is a new live spec, with a new ID; LiveSuite sets its Agent
	// and EgressDir.
	Spec func(t *testing.T) engine.LiveSpec
	// Start starts a sandbox of spec on Driver, failing t if it cannot,
	// and discards it when the test ends.
	Start func(t *testing.T, spec engine.LiveSpec) engine.Live
	// Check fails t if anything of sandbox id is left on the host.
	Check func(t *testing.T, id string)
}

// LiveSuite runs the real agent (bin) in live sandboxes of d. With an
// EgressDir, code reaches the host's socket through the agent's relay and
// nothing else, and the directory is read-only (CheckEgress);
// Discard unmounts it, leaves nothing of the sandbox and leaves the
// host's socket alone. An EgressDir that is not an absolute path to a
// directory is refused, and leaves nothing. A sandbox without EgressDir
// has no socket to reach.
func LiveSuite(t *testing.T, bin string, d Live) {
	t.Run("with", func(t *testing.T) {
		echo := NewEcho(t)
		spec := d.Spec(t)
		spec.Agent, spec.EgressDir = bin, echo.Dir
		l := d.Start(t, spec)
		c := agent.NewClient(l.Conn())
		defer c.Close()
		CheckEgress(t, c, echo, d.Gvisor)
		if err := l.Discard(context.Background()); err != nil {
			t.Fatalf("Discard: %v", err)
		}
		d.Check(t, spec.ID)
		if _, err := os.Stat(filepath.Join(echo.Dir, filepath.Base(engine.EgressSocket))); err != nil {
			t.Errorf("the host's socket after Discard: %v", err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{"relative/dir", file, filepath.Join(t.TempDir(), "missing")} {
			spec := d.Spec(t)
			spec.Agent, spec.EgressDir = bin, dir
			if l, err := d.Driver.Start(context.Background(), spec); err == nil {
				l.Discard(context.Background())
				t.Errorf("Start with EgressDir %q succeeded", dir)
			}
			d.Check(t, spec.ID)
		}
	})
	t.Run("without", func(t *testing.T) {
		spec := d.Spec(t)
		spec.Agent = bin
		l := d.Start(t, spec)
		c := agent.NewClient(l.Conn())
		defer c.Close()
		CheckNoEgress(t, c)
	})
}
