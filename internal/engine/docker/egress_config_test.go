package docker

import (
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/mount"
	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// configDriver is a Driver on runtime rt, instance inst, that is not
// connected to Docker: enough to build configs.
func configDriver(t *testing.T, rt, inst string) *Driver {
	t.Helper()
	pol, err := newPolicy(rt)
	if err != nil {
		t.Fatal(err)
	}
	return &Driver{opts: Options{Runtime: rt, Image: "vertal/default:latest", StateDir: "/run/v"}, policy: pol, gvisor: rt == "runsc", instance: inst, acct: &accounting{}}
}

// TestContainerConfigEgress: Spec.EgressDir puts the language's command
// (and only it) under the agent's relay, adds engine.ProxyEnv over the
// request's own, and mounts the state directory's binds of the agent
// and the egress directory (read-only for gVisor, plain under runc,
// which keeps the source's flags); nothing else changes.
func TestContainerConfigEgress(t *testing.T) {
	const inst = "0123456789ab"
	python := engine.Language{Name: "python", File: "main.py", Command: []string{"python3"}}
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			d := configDriver(t, rt, inst)
			spec := enginetest.Complete(engine.Spec{ID: "exe_1", Language: python, Timeout: 30 * time.Second,
				Args: []string{"a1"}, Env: map[string]string{"HTTP_PROXY": "http://elsewhere:1", "MINE": "1"}})
			cfg, host := d.containerConfig(spec, "/run/v/"+inst+"/exe_1", 42, 2_000_000_042)
			spec.EgressDir, spec.Agent = "/srv/egress/exe_1", "/usr/local/bin/vertal-agent"
			ecfg, ehost := d.containerConfig(spec, "/run/v/"+inst+"/exe_1/code", 42, 2_000_000_042)

			want := []string{"timeout", "-s", "KILL", "35", engine.AgentPath, "relay", "--socket", engine.EgressSocket, "--port", "3128", "--", "python3", "/code/main.py", "a1"}
			if diff := cmp.Diff(want, []string(ecfg.Cmd)); diff != "" {
				t.Errorf("Cmd (-want +got):\n%s", diff)
			}
			wantEnv := append(sandbox.EnvFor(spec.Limits), "MINE=1")
			for k, v := range engine.ProxyEnv() {
				wantEnv = append(wantEnv, k+"="+v)
			}
			slices.Sort(wantEnv)
			gotEnv := slices.Sorted(slices.Values(ecfg.Env))
			if diff := cmp.Diff(wantEnv, gotEnv); diff != "" {
				t.Errorf("Env (-want +got):\n%s", diff)
			}
			wantMounts := slices.Clone(host.Mounts)
			wantMounts[0].Source = "/run/v/" + inst + "/exe_1/code"
			wantMounts = append(wantMounts,
				mount.Mount{Type: mount.TypeBind, Source: "/run/v/" + inst + "/exe_1/agent", Target: engine.AgentPath, ReadOnly: rt == "runsc"},
				mount.Mount{Type: mount.TypeBind, Source: "/run/v/" + inst + "/exe_1/net", Target: engine.EgressDir, ReadOnly: rt == "runsc"})
			if diff := cmp.Diff(wantMounts, ehost.Mounts); diff != "" {
				t.Errorf("Mounts (-want +got):\n%s", diff)
			}
			cfg.Cmd, cfg.Env, ecfg.Cmd, ecfg.Env = nil, nil, nil, nil
			host.Mounts, ehost.Mounts = nil, nil
			if diff := cmp.Diff(cfg, ecfg); diff != "" {
				t.Errorf("the rest of the config (-without +with):\n%s", diff)
			}
			if diff := cmp.Diff(host, ehost); diff != "" {
				t.Errorf("the rest of the host config (-without +with):\n%s", diff)
			}
		})
	}
}
