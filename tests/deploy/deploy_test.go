// Package deploy tests the self-hosting recipes in deploy/ for real: the
// API image (deploy/Dockerfile) builds from the local base and serves, and
// deploy/compose.yaml validates and brings the API up healthy.
//
// Gated by VERTAL_E2E=1 (root, a running Docker engine, the images
// scripts/setup.sh test makes: vertal/base:bookworm and
// vertal/default:latest, and the compose v2 plugin). Nothing is pulled
// from a registry. The image is built with Docker's layer cache, so a run
// whose inputs did not change rebuilds nothing.
package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// apiImage is the tag the tests build; compose runs it too.
const apiImage = "vertal/api:e2e"

func requireE2E(t *testing.T) { e2etest.Require(t, "root, Docker and scripts/setup.sh test") }

// repoRoot is the repository's root directory, the image's build context.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// run runs a command in the repository root and returns its stdout; a
// failure ends the test with both streams.
func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := tryRun(t, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func tryRun(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

var (
	buildOnce sync.Once
	buildErr  string
)

// buildImage builds deploy/Dockerfile as apiImage once per test binary,
// making the local base first (scripts/base-image.sh: nothing when it is
// there). Docker's layer cache skips every step whose inputs are the same.
func buildImage(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		start := time.Now()
		if out, err := tryRun(t, nil, "scripts/base-image.sh"); err != nil {
			buildErr = fmt.Sprintf("scripts/base-image.sh: %v\n%s", err, out)
			return
		}
		// Through compose, as users build it (BuildKit; local images in
		// FROM need no registry): the compose test's `up --build` then
		// finds every layer in the same cache.
		if out, err := tryRun(t, []string{"COMPOSE_PROFILES=", "VERTAL_API_IMAGE=" + apiImage}, "docker", "compose", "-f", "deploy/compose.yaml", "build", "--quiet"); err != nil {
			buildErr = fmt.Sprintf("docker compose build: %v\n%s", err, out)
			return
		}
		t.Logf("image %s built in %s", apiImage, time.Since(start).Round(time.Second))
	})
	if buildErr != "" {
		t.Fatal(buildErr)
	}
}

// containerLogs is the container's stdout and stderr (vertal's JSON log).
func containerLogs(container string) string {
	out, err := exec.Command("docker", "logs", container).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("docker logs %s: %v\n%s", container, err, out)
	}
	return string(out)
}

func randomName(prefix string) string {
	var b [4]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// waitHealthy waits until Docker reports the container healthy: the
// image's (or the compose file's) HEALTHCHECK passed.
func waitHealthy(t *testing.T, container string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		state := strings.TrimSpace(run(t, nil, "docker", "inspect", "--format", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}", container))
		switch {
		case state == "running healthy":
			return
		case !strings.HasPrefix(state, "running"):
			logs := containerLogs(container)
			t.Fatalf("container %s is %q\n%s", container, state, logs)
		case time.Now().After(deadline):
			logs := containerLogs(container)
			t.Fatalf("container %s not healthy after 2m (%s)\n%s", container, state, logs)
		}
		time.Sleep(time.Second)
	}
}

// languages are one program per language and what it prints.
var languages = []struct{ language, code, stdout string }{
	{"python", "print(6 * 7)", "42\n"},
	{"javascript", "console.log([1, 2, 3].map(x => x * 2).join(','))", "2,4,6\n"},
	{"bash", `echo "$((6 * 7)) $BASH_VERSION" | cut -d' ' -f1`, "42\n"},
}

// execute runs code through the API at base with key and checks the
// result.
func execute(t *testing.T, base, key, language, code, want string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"language": language, "code": code})
	req, _ := http.NewRequest("POST", base+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s: %v", language, err)
	}
	defer resp.Body.Close()
	var res struct {
		Status   string `json:"status"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Fatalf("%s: HTTP %d, decoding: %v", language, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK || res.Status != "succeeded" || res.Stdout != want {
		t.Errorf("%s: HTTP %d, status %q, exit %d, stdout %q, stderr %q; want 200 succeeded stdout %q",
			language, resp.StatusCode, res.Status, res.ExitCode, res.Stdout, res.Stderr, want)
	}
}

func health(t *testing.T, base string) {
	t.Helper()
	resp, err := http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct{ Status, Version string }
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != 200 || h.Status != "ok" || h.Version == "" {
		t.Fatalf("GET /health: HTTP %d %+v (%v)", resp.StatusCode, h, err)
	}
}

// sandboxCgroups lists the host's cgroup directories of the sandboxes
// the container runs now (their bundles in its state directory; the oci
// driver names each sandbox's cgroup <parent>/<id>, parent "vertal").
func sandboxCgroups(t *testing.T, container string) []string {
	t.Helper()
	ids := strings.Fields(run(t, nil, "docker", "exec", container, "sh", "-c", "ls /run/vertal/oci/*/bundles"))
	var dirs []string
	for _, id := range ids {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup/pids/vertal", id), filepath.Join("/sys/fs/cgroup/vertal", id))
	}
	return dirs
}

func existing(dirs []string) []string {
	var found []string
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			found = append(found, d)
		}
	}
	return found
}

func TestImageServesAndStopsClean(t *testing.T) {
	requireE2E(t)
	buildImage(t)

	name := randomName("vertal-e2e-")
	port := e2etest.FreePort(t)
	// The flags deploy/compose.yaml gives the api service.
	run(t, nil, "docker", "run", "-d", "--name", name,
		"--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "SYS_PTRACE",
		"--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "--security-opt", "systempaths=unconfined",
		"-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", "/run/vertal/uids:/run/vertal/uids:rw",
		"--read-only", "--tmpfs", "/run:rw,nosuid,nodev,size=256m", "--tmpfs", "/tmp:rw,nosuid,nodev,size=64m",
		"--health-interval", "1s", "--health-start-period", "30s",
		"-p", "127.0.0.1:"+strconv.Itoa(port)+":8080", apiImage)
	t.Cleanup(func() { tryRun(t, nil, "docker", "rm", "-f", "-v", name) })
	waitHealthy(t, name)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	health(t, base)

	key := strings.TrimSpace(run(t, nil, "docker", "exec", name, "vertal", "create-key", "e2e", "--plan", "pro"))
	for _, l := range languages {
		execute(t, base, key, l.language, l.code, l.stdout)
	}
	// The warm pool keeps sandboxes ready: they exist now, and must be
	// gone after SIGTERM.
	cgroups := sandboxCgroups(t, name)
	if len(existing(cgroups)) == 0 {
		t.Fatalf("no sandbox cgroup found on the host before the stop (looked for %v)", cgroups)
	}

	run(t, nil, "docker", "kill", "--signal", "TERM", name)
	start := time.Now()
	code := strings.TrimSpace(run(t, nil, "docker", "wait", name))
	logs := containerLogs(name)
	if code != "0" {
		t.Errorf("after SIGTERM the container exited %s, want 0\n%s", code, logs)
	}
	if !strings.Contains(logs, `"msg":"stopped"`) {
		t.Errorf("vertal did not log its clean stop\n%s", logs)
	}
	t.Logf("stopped %s after SIGTERM", time.Since(start).Round(100*time.Millisecond))
	if cg := existing(cgroups); len(cg) > 0 {
		t.Errorf("sandbox cgroups left on the host after the container stopped: %v", cg)
	}
}
