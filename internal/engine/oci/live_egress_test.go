//go:build linux

package oci

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// TestLiveEgress runs the real agent in a live sandbox with an
// EgressDir on each runtime: code reaches the host's socket through the
// agent's relay and nothing else, and the directory is read-only. A
// sandbox without EgressDir has no socket to reach.
func TestLiveEgress(t *testing.T) {
	e2e(t)
	bin := agenttest.Build(t)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			t.Run("with", func(t *testing.T) {
				echo := agenttest.NewEcho(t)
				spec := liveSpecFor(t)
				spec.Agent, spec.EgressDir = bin, echo.Dir
				s := startLive(t, d, spec)
				c := agent.NewClient(s.Conn())
				defer c.Close()
				agenttest.CheckEgress(t, c, echo, d.rt.gvisor)
				// Discard unmounts the directory from the bundle and
				// leaves the host's socket alone.
				if err := s.Discard(context.Background()); err != nil {
					t.Fatalf("Discard: %v", err)
				}
				if diff := cmp.Diff([]string(nil), leftovers(d, d.instance, d.rt, spec.ID)); diff != "" {
					t.Errorf("left behind after Discard (-want +got):\n%s", diff)
				}
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
					spec := liveSpecFor(t)
					spec.Agent, spec.EgressDir = bin, dir
					if l, err := d.Start(context.Background(), spec); err == nil {
						l.Discard(context.Background())
						t.Errorf("Start with EgressDir %q succeeded", dir)
					}
				}
			})
			t.Run("without", func(t *testing.T) {
				spec := liveSpecFor(t)
				spec.Agent = bin
				s := startLive(t, d, spec)
				c := agent.NewClient(s.Conn())
				defer c.Close()
				agenttest.CheckNoEgress(t, c)
			})
		})
	}
}
