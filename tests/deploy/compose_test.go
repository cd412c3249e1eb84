package deploy

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// compose runs `docker compose` (the v2 plugin) on deploy/compose.yaml
// and the given extra files, with env added to the environment.
func compose(t *testing.T, env []string, args ...string) string {
	t.Helper()
	return run(t, env, "docker", append([]string{"compose"}, args...)...)
}

func TestComposeConfigValidates(t *testing.T) {
	requireE2E(t)
	if v := strings.TrimSpace(run(t, nil, "docker", "compose", "version", "--short")); !strings.HasPrefix(v, "2.") {
		t.Fatalf("docker compose version %q, want v2 (scripts/setup.sh test installs it)", v)
	}
	env := []string{"COMPOSE_PROFILES=tunnel", "TUNNEL_TOKEN=test-token", "VERTAL_EDGE_SECRET=s3cret"}
	out := compose(t, env, "-f", "deploy/compose.yaml", "--env-file", "deploy/.env.example", "config", "--format", "json")
	var cfg struct {
		Services map[string]struct {
			Image       string            `json:"image"`
			Privileged  bool              `json:"privileged"`
			Cgroup      string            `json:"cgroup"`
			ReadOnly    bool              `json:"read_only"`
			Restart     string            `json:"restart"`
			Profiles    []string          `json:"profiles"`
			Command     []string          `json:"command"`
			Environment map[string]string `json:"environment"`
			Ports       []any             `json:"ports"`
			Healthcheck *struct {
				Test []string `json:"test"`
			} `json:"healthcheck"`
			Volumes []struct {
				Target string `json:"target"`
			} `json:"volumes"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("compose config: %v\n%s", err, out)
	}
	api, tunnel := cfg.Services["api"], cfg.Services["tunnel"]
	if len(api.Ports) != 0 {
		t.Errorf("api publishes ports by default: %v", api.Ports)
	}
	if !api.ReadOnly || api.Restart != "unless-stopped" || api.Healthcheck == nil || !slices.ContainsFunc(api.Volumes, func(v struct {
		Target string `json:"target"`
	}) bool {
		return v.Target == "/var/lib/vertal"
	}) {
		t.Errorf("api: read_only %v, restart %q, healthcheck %v, volumes %v", api.ReadOnly, api.Restart, api.Healthcheck, api.Volumes)
	}
	// What sandboxes need on a cgroup v2 host (see compose.yaml).
	if api.Cgroup != "host" {
		t.Errorf("api: cgroup %q, want the host's cgroup namespace", api.Cgroup)
	}
	if api.Environment["VERTAL_EDGE_SECRET"] != "s3cret" {
		t.Errorf("api: edge secret from the environment not passed: %v", api.Environment)
	}
	if !slices.Equal(tunnel.Profiles, []string{"tunnel"}) || !slices.Equal(tunnel.Command, []string{"tunnel", "--no-autoupdate", "run"}) ||
		tunnel.Environment["TUNNEL_TOKEN"] != "test-token" {
		t.Errorf("tunnel: profiles %v, command %v, environment %v", tunnel.Profiles, tunnel.Command, tunnel.Environment)
	}

	// Without the profile only the API is there; the override publishes
	// it on loopback alone.
	services := strings.Fields(compose(t, []string{"COMPOSE_PROFILES="}, "-f", "deploy/compose.yaml", "config", "--services"))
	if !slices.Equal(services, []string{"api"}) {
		t.Errorf("services without the tunnel profile: %v, want [api]", services)
	}
	local := compose(t, []string{"COMPOSE_PROFILES=", "VERTAL_LOCAL_PORT=18080"}, "-f", "deploy/compose.yaml", "-f", "deploy/compose.local.yaml", "config", "--format", "json")
	if !strings.Contains(local, `"host_ip": "127.0.0.1"`) || !strings.Contains(local, `"published": "18080"`) {
		t.Errorf("the local override does not publish 127.0.0.1:18080:\n%s", local)
	}
}

func TestComposeUpRunsAndDownLeavesNothing(t *testing.T) {
	requireE2E(t)
	buildImage(t)
	project := randomName("vertal-e2e-")
	port := e2etest.FreePort(t)
	env := []string{"COMPOSE_PROFILES=", "VERTAL_API_IMAGE=" + apiImage, "VERTAL_LOCAL_PORT=" + strconv.Itoa(port)}
	files := []string{"-p", project, "-f", "deploy/compose.yaml", "-f", "deploy/compose.local.yaml"}
	down := func() string {
		return compose(t, env, append(files, "down", "-v", "--remove-orphans", "-t", "60")...)
	}
	t.Cleanup(func() {
		tryRun(t, env, "docker", append(append([]string{"compose"}, files...), "down", "-v", "-t", "5")...)
	})

	// As the docs say (--build: a cache hit after buildImage), and --wait
	// until the healthcheck passes.
	compose(t, env, append(files, "up", "-d", "--build", "--wait", "--wait-timeout", "120")...)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	health(t, base)
	key := strings.TrimSpace(compose(t, env, append(files, "exec", "-T", "api", "vertal", "create-key", "e2e", "--plan", "pro")...))
	execute(t, base, key, "python", "print(6 * 7)", "42\n")

	down()
	label := "label=com.docker.compose.project=" + project
	for _, kind := range [][]string{{"ps", "-aq"}, {"volume", "ls", "-q"}, {"network", "ls", "-q"}} {
		if out := strings.TrimSpace(run(t, nil, "docker", append(kind, "--filter", label)...)); out != "" {
			t.Errorf("docker %s after down: %s", strings.Join(kind, " "), out)
		}
	}
}
