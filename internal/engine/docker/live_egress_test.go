package docker

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/mount"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/agent/agenttest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// startAgent starts a live sandbox of spec running the real agent and
// returns a client on it; when the test ends it discards the sandbox and
// checks that nothing of it is left.
func startAgent(t *testing.T, d *Driver, spec engine.LiveSpec) (*liveContainer, *agent.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start(%s): %v", spec.ID, err)
	}
	l := live.(*liveContainer)
	c := agent.NewClient(live.Conn())
	t.Cleanup(func() {
		c.Close()
		if err := l.Discard(context.Background()); err != nil {
			t.Errorf("Discard: %v", err)
		}
		assertNothingLeft(t, d, spec.ID)
	})
	return l, c
}

// TestLiveEgress runs the real agent in a live sandbox with an EgressDir
// on each runtime: code reaches the host's socket through the agent's
// relay, and the directory is read-only. A sandbox without EgressDir has
// no socket to reach.
func TestLiveEgress(t *testing.T) {
	requireE2E(t)
	bin := agenttest.Build(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			d := newTestDriver(t, rt)
			t.Run("with", func(t *testing.T) {
				echo := agenttest.NewEcho(t)
				spec := liveSpec(bin)
				spec.EgressDir = echo.Dir
				l, c := startAgent(t, d, spec)
				agenttest.CheckEgress(t, c, echo, d.gvisor)
				// Discard unmounts the directory from the sandbox's state
				// directory and leaves the host's socket alone.
				if err := l.Discard(context.Background()); err != nil {
					t.Fatalf("Discard: %v", err)
				}
				assertNothingLeft(t, d, spec.ID)
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
					spec := liveSpec(bin)
					spec.EgressDir = dir
					if l, err := d.Start(context.Background(), spec); err == nil {
						l.Discard(context.Background())
						t.Errorf("Start with EgressDir %q succeeded", dir)
					}
					assertNothingLeft(t, d, spec.ID)
				}
			})
			t.Run("without", func(t *testing.T) {
				_, c := startAgent(t, d, liveSpec(bin))
				agenttest.CheckNoEgress(t, c)
			})
		})
	}
}

// TestLiveConfigEgress: EgressDir adds one mount, the sandbox's state
// directory's bind of it (bindEgress) at engine.EgressDir, read-only for
// gVisor and a plain bind under runc, which keeps the source's flags.
func TestLiveConfigEgress(t *testing.T) {
	const inst = "0123456789ab"
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			pol, err := newPolicy(rt)
			if err != nil {
				t.Fatal(err)
			}
			d := &Driver{opts: Options{Runtime: rt, Image: "vertal/default:latest", StateDir: "/run/v"}, policy: pol, gvisor: rt == "runsc", instance: inst, acct: &accounting{}}
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
