//go:build linux

package oci

import (
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// TestLiveEgress runs the live egress suite (agenttest.LiveSuite) on
// each runtime, with the real agent: code reaches the host's socket
// through the agent's relay and nothing else, and the directory is
// read-only; Discard unmounts it from the bundle and leaves the host's
// socket alone. A sandbox without EgressDir has no socket to reach.
func TestLiveEgress(t *testing.T) {
	e2e(t)
	agenttest.ForEachRuntime(t, allRuntimes, func(t *testing.T, rt, agent string) {
		d := newTestDriver(t, rt)
		agenttest.LiveSuite(t, agent, agenttest.Live{
			Driver: d,
			Gvisor: d.rt.gvisor,
			Spec:   liveSpecFor,
			Start:  func(t *testing.T, spec engine.LiveSpec) engine.Live { return startLive(t, d, spec) },
			Check:  func(t *testing.T, id string) { checkNothingLeft(t, d, id) },
		})
	})
}
