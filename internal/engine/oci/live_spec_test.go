//go:build linux

package oci

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
)

// TestLiveSpecShape checks, without root, what a live sandbox's spec
// changes from the cold path's: the agent under the deadline (and tini
// under the OCI runtimes), the home instead of /code, HOME and cwd.
func TestLiveSpecShape(t *testing.T) {
	l := enginetest.Complete(engine.Spec{}).Limits
	l.Lifetime = 90 * time.Second
	deadline := time.Unix(1_800_000_000, 0)
	for _, rt := range allRuntimes {
		t.Run(rt, func(t *testing.T) {
			d := unitDriver(rt)
			s, err := d.liveSpec("/img", engine.LiveSpec{ID: "sbx_1", Limits: l, Deadline: deadline}, "/state/agents/x")
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"/usr/bin/timeout", "-s", "KILL", "90", engine.AgentPath, "serve", "--deadline", "1800000000"}
			if rt != "bwrap" {
				want = append([]string{initPath, "--"}, want...)
			}
			if rt == "runc" {
				// runc proxies stdio: the agent's socket is fd 3.
				want = append(want, "--fd", "3")
			}
			if diff := cmp.Diff(want, s.Process.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if s.Process.Cwd != engine.HomeDir || !slices.Contains(s.Process.Env, "HOME="+engine.HomeDir) || !slices.Contains(s.Process.Env, "PWD="+engine.HomeDir) {
				t.Errorf("cwd %q, env %v; want the home", s.Process.Cwd, s.Process.Env)
			}
			mounts := map[string]string{}
			for _, m := range s.Mounts {
				mounts[m.Destination] = m.Source + " " + strings.Join(m.Options, ",")
			}
			if _, ok := mounts[engine.CodeDir]; ok {
				t.Errorf("%s is mounted in a live sandbox", engine.CodeDir)
			}
			if got := mounts[engine.HomeDir]; got != "home rbind,rw,nosuid,nodev,noexec" {
				t.Errorf("home mount %q", got)
			}
			if got := mounts[engine.AgentPath]; got != "/state/agents/x bind,ro,nosuid,nodev" {
				t.Errorf("agent mount %q", got)
			}
			if got, ok := mounts[engine.EgressDir]; ok {
				t.Errorf("egress mount %q without EgressDir", got)
			}
			eg, err := d.liveSpec("/img", engine.LiveSpec{ID: "sbx_1", Limits: l, Deadline: deadline, EgressDir: "/srv/egress/sbx_1"}, "/state/agents/x")
			if err != nil {
				t.Fatal(err)
			}
			// The bundle's read-only bind of EgressDir (hostBind), last.
			wantNet := specs.Mount{Destination: engine.EgressDir, Type: "bind", Source: "net", Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}}
			if diff := cmp.Diff(append(s.Mounts, wantNet), eg.Mounts); diff != "" {
				t.Errorf("mounts with EgressDir (-want +got):\n%s", diff)
			}
			if !s.Root.Readonly || len(s.Process.Capabilities.Effective)+len(s.Process.Capabilities.Bounding) > 0 || s.Linux.Seccomp == nil {
				t.Errorf("the cold path's walls are gone: root %+v, caps %+v", s.Root, s.Process.Capabilities)
			}
		})
	}
}
