package docker

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/mount"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// TestLiveEgress runs the live egress suite (agenttest.LiveSuite) on
// each runtime, with the real agent: code reaches the host's socket
// through the agent's relay, and the directory is read-only; Discard
// unmounts it from the sandbox's state directory and leaves the host's
// socket alone. A sandbox without EgressDir has no socket to reach.
func TestLiveEgress(t *testing.T) {
	requireE2E(t)
	agenttest.ForEachRuntime(t, runtimes, func(t *testing.T, rt, agent string) {
		d := newTestDriver(t, rt)
		agenttest.LiveSuite(t, agent, agenttest.Live{
			Driver: d,
			Gvisor: d.gvisor,
			Spec:   func(*testing.T) engine.LiveSpec { return liveSpec(agent) },
			Start: func(t *testing.T, spec engine.LiveSpec) engine.Live {
				l, _ := startLive(t, d, spec)
				return l
			},
			Check: func(t *testing.T, id string) { assertNothingLeft(t, d, id) },
		})
	})
}

// TestLiveConfigEgress: EgressDir adds one mount, the sandbox's state
// directory's bind of it (bindEgress) at engine.EgressDir, read-only for
// gVisor and a plain bind under runc, which keeps the source's flags.
func TestLiveConfigEgress(t *testing.T) {
	const inst = "0123456789ab"
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			d := configDriver(t, rt, inst)
			spec := engine.LiveSpec{ID: "sbx_1", Limits: engine.DefaultLimits(time.Minute), HomeBytes: 8 << 20, Agent: "/srv/agent", Deadline: time.Unix(1_900_000_000, 0)}
			_, without := d.liveConfig(spec, 42, 2_000_000_042, "")
			spec.EgressDir = "/srv/egress/sbx_1"
			_, with := d.liveConfig(spec, 42, 2_000_000_042, "")
			var added []mount.Mount
			for _, m := range with.Mounts {
				if !slices.ContainsFunc(without.Mounts, func(o mount.Mount) bool { return cmp.Equal(o, m) }) {
					added = append(added, m)
				}
			}
			want := []mount.Mount{{Type: mount.TypeBind, Source: "/run/v/" + inst + "/sbx_1/net", Target: "/.vertal/net", ReadOnly: rt == "runsc"}}
			if diff := cmp.Diff(want, added); diff != "" {
				t.Errorf("mounts EgressDir adds (-want +got):\n%s", diff)
			}
			if len(with.Mounts) != len(without.Mounts)+1 {
				t.Errorf("%d mounts with EgressDir, %d without; want one more", len(with.Mounts), len(without.Mounts))
			}
		})
	}
}

// TestUnmountEgressFollowsNoLink: Reap unmounts code and net in every
// execution's directory, and a cold one is the code's working directory,
// where the code may have left links by those names to a host mount.
func TestUnmountEgressFollowsNoLink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	target := t.TempDir()
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(target, unix.MNT_DETACH)
	dir := t.TempDir()
	if err := os.Symlink(target, filepath.Join(dir, egressSource)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "code")); err != nil {
		t.Fatal(err)
	}
	if err := unmountEgress(dir); err != nil {
		t.Errorf("unmountEgress: %v", err)
	}
	// As Reap does: the links go, not what they point to.
	if err := removeCodeDir(dir); err != nil {
		t.Errorf("removeCodeDir: %v", err)
	}
	var before, after unix.Stat_t
	if err := unix.Stat(filepath.Dir(target), &before); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(target, &after); err != nil {
		t.Fatal(err)
	}
	if before.Dev == after.Dev {
		t.Error("the mount the link points to is gone")
	}
}
