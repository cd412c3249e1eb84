package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// BareCommands are the host commands of the baseline. Python is Debian's
// /usr/bin/python3 (not a pyenv shim, which adds ~90 ms per start); node
// is the very binary the image contains when it is given.
func BareCommands(imageNode string) map[string][]string {
	node := imageNode
	if node == "" {
		if p, err := exec.LookPath("node"); err == nil {
			node = p
		}
	}
	out := map[string][]string{}
	for _, d := range lang.All {
		path := d.Path
		if d.Interpreter == "node" {
			path = node
		}
		out[d.Name] = d.EvalArgv(path, Programs[d.Name])
	}
	return out
}

// bareEnv is the whole environment of the bare interpreters: as clean as
// the sandbox's, so neither side pays for the other's settings.
var bareEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}

// BareTarget runs the interpreters directly on the host.
func BareTarget(cmds map[string][]string) Target {
	return Target{Name: "bare", Bare: true, Run: func(ctx context.Context, lang string) error {
		argv, ok := cmds[lang]
		if !ok || argv[0] == "" {
			return fmt.Errorf("no bare command for %s", lang)
		}
		return runCommand(ctx, argv, bareEnv)
	}}
}

func runCommand(ctx context.Context, argv, env []string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = "/tmp"
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(argv[0]), err, oneLine(stderr.String(), 200))
	}
	if stdout.String() != Want {
		return fmt.Errorf("%s printed %q", filepath.Base(argv[0]), stdout.String())
	}
	return nil
}

// DriverTarget runs the programs through a driver, one fresh sandbox per
// execution, exactly as the API would (default limits and timeout).
func DriverTarget(d engine.Driver, langs []engine.Language) Target {
	byName := map[string]engine.Language{}
	for _, l := range langs {
		byName[l.Name] = l
	}
	return Target{Name: d.Name(), Run: func(ctx context.Context, lang string) error {
		l, ok := byName[lang]
		if !ok {
			return fmt.Errorf("language %s not configured", lang)
		}
		spec := engine.Spec{ID: NewID(), Language: l, Code: Programs[lang], Timeout: engine.DefaultTimeout,
			Limits: engine.DefaultLimits(engine.DefaultTimeout)}
		res, err := d.Run(ctx, spec)
		if err != nil {
			return err
		}
		if res.Status != engine.StatusSucceeded || res.Stdout != Want {
			return fmt.Errorf("status %s, exit %d, stdout %q, stderr %q", res.Status, res.ExitCode, res.Stdout, oneLine(res.Stderr, 200))
		}
		return nil
	}}
}

// NewID makes an execution ID shaped like the API's.
func NewID() string {
	var b [16]byte
	rand.Read(b[:])
	return "exe_" + hex.EncodeToString(b[:])
}

// DockerCLI describes a raw `docker run` comparison.
type DockerCLI struct {
	Docker  string // path of the docker CLI
	Image   string
	Runtime string // runc or runsc
	// Languages give each language's command; the code file is appended.
	Languages []engine.Language
	// WorkDir holds the code files and the seccomp profile.
	WorkDir string
}

// DockerRunArgs is the `docker run` command line with the same hardening as
// the docker driver, as far as the CLI can express it (Docker's own masked
// paths apply). The code directory is bind-mounted read-only at /code.
func DockerRunArgs(c DockerCLI, codeDir, seccompFile string, l engine.Language) []string {
	lim := engine.DefaultLimits(engine.DefaultTimeout)
	// -i: the container gets a stdin pipe, as the driver gives it. Without
	// one, runsc is handed the host's /dev/null and chowns it.
	args := []string{"run", "--rm", "-i", "--init",
		"--network", "none", "--ipc", "none", "--cgroupns", "private",
		"--read-only", "--oom-score-adj", "1000",
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--memory", strconv.FormatInt(lim.MemoryBytes, 10), "--memory-swap", strconv.FormatInt(sandbox.MemorySwapBytes(lim), 10),
		"--cpus", strconv.FormatFloat(lim.CPUs, 'f', -1, 64),
		"--log-driver", "none",
		"--user", fmt.Sprintf("%d:%d", sandbox.UID, sandbox.GID), "--workdir", sandbox.WorkDir, "--hostname", sandbox.Hostname,
		"--entrypoint", "",
		"-v", codeDir + ":" + engine.CodeDir + ":ro",
	}
	if seccompFile != "" {
		args = append(args, "--security-opt", "seccomp="+seccompFile)
	}
	for _, r := range sandbox.Rlimits(lim) {
		args = append(args, "--ulimit", fmt.Sprintf("%s=%d:%d", strings.ToLower(strings.TrimPrefix(r.Type, "RLIMIT_")), r.Value, r.Value))
	}
	tmpfs := strings.Join(sandbox.TmpfsOptions(lim), ",")
	if c.Runtime == "runsc" {
		// As the driver does under gVisor: a host tmpfs volume (gVisor's
		// own tmpfs ignores noexec for mappings) and the process limit as
		// RLIMIT_NPROC, with a generous cgroup backstop for the sentry.
		args = append(args, "--runtime", "runsc",
			"--mount", "type=volume,dst=/tmp,volume-driver=local,volume-opt=type=tmpfs,volume-opt=device=tmpfs,\"volume-opt=o="+tmpfs+"\"",
			"--pids-limit", strconv.FormatInt(lim.Pids*16, 10),
			"--ulimit", fmt.Sprintf("nproc=%d:%d", lim.Pids, lim.Pids))
	} else {
		args = append(args, "--tmpfs", "/tmp:"+tmpfs, "--pids-limit", strconv.FormatInt(lim.Pids, 10))
	}
	for _, e := range sandbox.Env() {
		args = append(args, "--env", e)
	}
	args = append(args, c.Image)
	return append(args, l.Argv()...)
}

// DockerCLITarget runs `docker run` for every execution. The code files
// are written once; docker run itself is what is measured.
func DockerCLITarget(c DockerCLI) (Target, error) {
	codeDir := filepath.Join(c.WorkDir, "code-"+c.Runtime)
	if err := os.MkdirAll(codeDir, 0o755); err != nil {
		return Target{}, err
	}
	byName := map[string]engine.Language{}
	for _, l := range c.Languages {
		byName[l.Name] = l
		if err := os.WriteFile(filepath.Join(codeDir, l.File), []byte(Programs[l.Name]+"\n"), 0o644); err != nil {
			return Target{}, err
		}
	}
	profile, err := sandbox.SeccompDockerJSON(c.Runtime)
	if err != nil {
		return Target{}, err
	}
	seccompFile := filepath.Join(c.WorkDir, "seccomp-"+c.Runtime+".json")
	if err := os.WriteFile(seccompFile, profile, 0o644); err != nil {
		return Target{}, err
	}
	return Target{Name: "docker run " + c.Runtime + " (CLI)", Run: func(ctx context.Context, lang string) error {
		l, ok := byName[lang]
		if !ok {
			return fmt.Errorf("language %s not configured", lang)
		}
		argv := append([]string{c.Docker}, DockerRunArgs(c, codeDir, seccompFile, l)...)
		return runCommand(ctx, argv, append(os.Environ()[:0:0], "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"))
	}}, nil
}

// HTTPTarget posts each program to a Vertal Run API (base URL such as
// http://127.0.0.1:8080/api) and checks the answer: the whole path a
// client sees, including authentication, quotas and storage.
func HTTPTarget(base, apiKey string, client *http.Client) Target {
	if client == nil {
		client = &http.Client{Timeout: 60 * time.Second}
	}
	base = strings.TrimRight(base, "/")
	return Target{Name: "api " + base, Run: func(ctx context.Context, lang string) error {
		body, _ := json.Marshal(map[string]string{"language": lang, "code": Programs[lang]})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/executions", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d: %s", resp.StatusCode, oneLine(string(b), 200))
		}
		var out struct {
			Status string `json:"status"`
			Stdout string `json:"stdout"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return fmt.Errorf("decoding the answer: %w", err)
		}
		if out.Status != string(engine.StatusSucceeded) || out.Stdout != Want {
			return fmt.Errorf("status %s, stdout %q", out.Status, out.Stdout)
		}
		return nil
	}}
}
