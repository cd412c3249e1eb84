//go:build linux

package oci

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// TestOneShotEgressConfig checks, without root, what Spec.EgressDir
// changes in an execution's config.json: the language's command (and
// only it) under the agent's relay, the agent's and the egress
// directory's mounts, and engine.ProxyEnv over the request's own; and
// that without it the config is the template's, byte for byte.
func TestOneShotEgressConfig(t *testing.T) {
	lang := engine.Language{Name: "python", Image: "/img", File: "main.py", Command: []string{"/usr/bin/python3"}}
	const agent = "/state/agents/x"
	for _, rt := range []string{"crun", "runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			d := unitDriver(rt)
			spec := enginetest.Complete(engine.Spec{ID: "exe_1", Language: lang, Timeout: 30 * time.Second,
				Args: []string{"a1"}, Env: map[string]string{"HTTP_PROXY": "http://elsewhere:1", "MINE": "1"}})
			tpl, err := d.template(lang, spec.Limits)
			if err != nil {
				t.Fatal(err)
			}
			plain := spec
			plain.Args, plain.Env = nil, nil
			b, err := d.config(tpl, plain, "", 2_000_000_042)
			if err != nil {
				t.Fatal(err)
			}
			if want := tpl.render("exe_1", 2_000_000_042); string(b) != string(want) {
				t.Errorf("config without egress is not the template's:\n%s\nwant\n%s", b, want)
			}
			cold := decodeConfig(t, mustConfig(t, d, tpl, spec, ""))

			spec.EgressDir, spec.Agent = "/srv/egress/exe_1", "/usr/local/bin/vertal-agent"
			eg := decodeConfig(t, mustConfig(t, d, tpl, spec, agent))
			deadline := []string{timeoutPath, "-s", "KILL", "35"}
			want := slices.Concat([]string{initPath, "--"}, deadline,
				[]string{engine.AgentPath, "relay", "--socket", engine.EgressSocket, "--port", "3128", "--", "/usr/bin/python3", "/code/main.py", "a1"})
			if diff := cmp.Diff(want, eg.Process.Args); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			wantMounts := append(slices.Clone(cold.Mounts),
				specs.Mount{Destination: engine.AgentPath, Type: "bind", Source: agent, Options: []string{"bind", "ro", "nosuid", "nodev"}},
				specs.Mount{Destination: engine.EgressDir, Type: "bind", Source: egressSource, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
			if diff := cmp.Diff(wantMounts, eg.Mounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			wantEnv := append(sandbox.EnvFor(spec.Limits), "MINE=1")
			for k, v := range engine.ProxyEnv() {
				wantEnv = append(wantEnv, k+"="+v)
			}
			if diff := cmp.Diff(sortedEnv(wantEnv), sortedEnv(eg.Process.Env)); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			// The rest is the cold path's.
			cold.Process.Args, cold.Process.Env, cold.Mounts = nil, nil, nil
			eg.Process.Args, eg.Process.Env, eg.Mounts = nil, nil, nil
			if diff := cmp.Diff(cold, eg); diff != "" {
				t.Errorf("the rest of the spec (-cold +egress):\n%s", diff)
			}
		})
	}
}

// TestOneShotEgressBwrap: under bwrap, the egress spec's mounts become
// read-only binds, the egress directory's from the bundle with its flags
// checked before bwrap starts, and the command is the relay's.
func TestOneShotEgressBwrap(t *testing.T) {
	lang := engine.Language{Name: "python", Image: "/var/lib/vertal/images/default/rootfs", File: "main.py", Command: []string{"/usr/bin/python3"}}
	d := unitDriver("bwrap")
	l := enginetest.Complete(engine.Spec{}).Limits
	s, err := d.spec(lang, l, idPlaceholder)
	if err != nil {
		t.Fatal(err)
	}
	d.withEgress(s, lang, l, "/state/agents/x")
	plan, err := bwrapPlanFor(s, bwrapEnv{bundle: bundlePlaceholder, dev: "/run/vertal/oci/0123456789ab/dev", exists: fakeProc})
	if err != nil {
		t.Fatal(err)
	}
	const bundle = "/run/vertal/oci/0123456789ab/bundles/exe_1"
	r := plan.render(bundle, 2_000_000_042, nil, sandbox.UserEnv(sandbox.SpecEnv(engine.Spec{EgressDir: "/srv/e", Agent: "/a"})))
	args := strings.Join(r.args, " ")
	for _, want := range []string{
		"--ro-bind /state/agents/x " + engine.AgentPath,
		"--ro-bind " + bundle + "/net " + engine.EgressDir,
		"--setenv HTTP_PROXY http://127.0.0.1:3128",
	} {
		if !strings.Contains(args+" "+strings.ReplaceAll(string(r.inner), "\x00", " "), want) {
			t.Errorf("bwrap's options lack %q:\n%s", want, args)
		}
	}
	if want := bundle + "/net"; !slices.ContainsFunc(r.checks, func(c mountCheck) bool { return c.path == want && c.flags&unix.ST_NOEXEC != 0 }) {
		t.Errorf("no noexec check of %s: %+v", want, r.checks)
	}
	if !slices.Equal(r.command[:4], []string{timeoutPath, "-s", "KILL", "15"}) || r.command[4] != engine.AgentPath || r.command[5] != "relay" {
		t.Errorf("command %q; want the relay under the deadline", r.command)
	}
}

func mustConfig(t *testing.T, d *Driver, tpl *template, spec engine.Spec, agent string) []byte {
	t.Helper()
	b, err := d.config(tpl, spec, agent, 2_000_000_042)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeConfig(t *testing.T, b []byte) *specs.Spec {
	t.Helper()
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func sortedEnv(env []string) []string {
	env = slices.Clone(env)
	slices.Sort(env)
	return env
}

// TestRunArgsHostUDS: only runsc needs leave to connect to the egress
// socket, and only a sandbox with egress gets it.
func TestRunArgsHostUDS(t *testing.T) {
	for _, rt := range allRuntimes {
		d := unitDriver(rt)
		for _, hostUDS := range []bool{false, true} {
			want := []string{"run", "x"}
			if hostUDS && rt == "runsc" {
				want = append([]string{"--host-uds=open"}, want...)
			}
			if diff := cmp.Diff(want, d.runArgs(hostUDS, "run", "x")); diff != "" {
				t.Errorf("%s, hostUDS %v (-want +got):\n%s", rt, hostUDS, diff)
			}
		}
	}
}

// TestAgentCopy: the driver's copy of the agent is made once per content
// and found again while the source is unchanged; a changed source (a
// rebuilt agent) gets a copy of its own.
func TestAgentCopy(t *testing.T) {
	d := unitDriver("crun")
	d.instance = t.TempDir()
	src := filepath.Join(t.TempDir(), "vertal-agent")
	if err := os.WriteFile(src, []byte("agent v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	first, err := d.agentCopy(src)
	if err != nil {
		t.Fatal(err)
	}
	again, err := d.agentCopy(src)
	if err != nil || again != first {
		t.Errorf("agentCopy again = %q, %v; want %q", again, err, first)
	}
	if err := os.WriteFile(src, []byte("agent v2, rebuilt"), 0o755); err != nil {
		t.Fatal(err)
	}
	second, err := d.agentCopy(src)
	if err != nil || second == first {
		t.Fatalf("agentCopy after a change = %q, %v; want a new copy", second, err)
	}
	for path, want := range map[string]string{first: "agent v1", second: "agent v2, rebuilt"} {
		if b, err := os.ReadFile(path); err != nil || string(b) != want {
			t.Errorf("%s holds %q, %v; want %q", path, b, err, want)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, %v; want mode 0755", path, fi.Mode(), err)
		}
	}
	if _, err := d.agentCopy("relative/agent"); err == nil {
		t.Error("agentCopy of a relative path succeeded")
	}
}
