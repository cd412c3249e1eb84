package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/api/apitest"
	"github.com/kuboprotocol/vertal2kubo/internal/api/sandboxfake"
)

// sandboxCLI serves the real API handlers over a new sandboxes fake for
// the test t. It returns the fake, the environment that points vertal at
// it, and run, which runs vertal sandbox with stdin and args there.
func sandboxCLI(t *testing.T) (fake *sandboxfake.Fake, environ map[string]string, run func(stdin string, args ...string) cliResult) {
	t.Helper()
	fake = sandboxfake.New()
	srv := apitest.New(t, fake)
	environ = map[string]string{"KUBO_API_URL": srv.URL, "KUBO_API_KEY": srv.Key}
	run = func(stdin string, args ...string) cliResult {
		t.Helper()
		return runCLI(t, cmdSandbox, environ, stdin, args...)
	}
	return fake, environ, run
}

// TestSandboxCLI drives vertal sandbox against the real API handlers over
// the sandboxes fake.
func TestSandboxCLI(t *testing.T) {
	fake, environ, run := sandboxCLI(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "data.csv")
	if err := os.WriteFile(local, []byte("a,b\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	got := run("", "create", "--timeout", "10m", "--metadata", "team=ml", "--env", "A=1", "--file", local+":in/data.csv", "--on-timeout", "pause")
	id := strings.TrimSpace(got.Stdout)
	if got.Exit != 0 || !strings.HasPrefix(id, "sbx_") {
		t.Fatalf("create: %+v", got)
	}
	if c := fake.LastCreate; c.TimeoutS != 600 || c.Metadata["team"] != "ml" || c.Env["A"] != "1" || c.OnTimeout != "pause" || c.Files[0].Path != "in/data.csv" || string(c.Files[0].Content) != "a,b\n1,2\n" {
		t.Errorf("create request %+v", c)
	}
	got = run("", "ls", "--metadata", "team=ml")
	if got.Exit != 0 || !strings.Contains(got.Stdout, id+"  running") || !strings.HasPrefix(got.Stdout, "ID ") {
		t.Errorf("ls: %+v", got)
	}

	// exec mirrors the output and the exit code.
	got = run("", "exec", id, "echo hello")
	if got != (cliResult{Stdout: "hello\n"}) {
		t.Errorf("exec: %+v", got)
	}
	got = run("", "exec", "--cwd", "/tmp", id, "--", "exit", "3")
	if got.Exit != 3 || got.Stderr != "boom\n" || fake.LastCommand.Cwd != "/tmp" || strings.Join(fake.LastCommand.Argv, " ") != "exit 3" {
		t.Errorf("exec argv: %+v %+v", got, fake.LastCommand)
	}

	// cp both ways, and through stdin and stdout.
	if got := run("", "cp", local, id+":/home/user/copy.csv"); got.Exit != 0 {
		t.Fatalf("cp in: %+v", got)
	}
	if got := run("", "cp", id+":copy.csv", dir); got.Exit != 0 {
		t.Fatalf("cp out: %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "copy.csv")); err != nil || string(b) != "a,b\n1,2\n" {
		t.Errorf("copied back %q %v", b, err)
	}
	run("piped\n", "cp", "-", id+":p.txt")
	if got := run("", "cp", id+":p.txt", "-"); got.Stdout != "piped\n" {
		t.Errorf("cp to stdout: %+v", got)
	}
	if got := run("", "cp", local, dir); got.Exit != exitUsage {
		t.Errorf("cp between local files: %+v", got)
	}

	if got := runCLI(t, cmdUsage, environ, ""); !strings.Contains(got.Stdout, "\nsandboxes  1 running, 0 paused; today 0.000 seconds alive") {
		t.Errorf("usage: %+v", got)
	}
	// Cells in a code context keep their state; failures and timeouts
	// have their own exit statuses.
	if got := run("", "run-code", id, "x = 41"); got.Exit != 0 || got.Stdout != "" {
		t.Errorf("run-code set: %+v", got)
	}
	if got := run("", "run-code", id, "x"); got.Exit != 0 || got.Stdout != "41\n" {
		t.Errorf("run-code state: %+v", got)
	}
	if got := run("print(hi)", "run-code", id, "-"); got.Exit != 0 || got.Stdout != "hi\n" {
		t.Errorf("run-code from stdin: %+v", got)
	}
	if got := run("", "run-code", id, "raise ValueError"); got.Exit != 1 || !strings.Contains(got.Stderr, "Traceback") {
		t.Errorf("run-code raise: %+v", got)
	}
	if got := run("", "run-code", "--json", "--language", "javascript", id, "x"); got.Exit != 0 || !strings.Contains(got.Stdout, `"text/plain": "x"`) || !strings.Contains(got.Stdout, `"context_id": "ctx_`) {
		t.Errorf("run-code --json in another context: %+v", got)
	}
	if got := run("", "run-code", "--context", "ctx_00000000000000000000000000000999", id, "x"); got.Exit != exitAPIFailed || !strings.Contains(got.Stderr, "not_found") {
		t.Errorf("run-code in an unknown context: %+v", got)
	}
	if got := run("", "run-code", id); got.Exit != exitUsage {
		t.Errorf("run-code without code: %+v", got)
	}
	if got := run("", "pause", id); got.Stdout != id+"\tpaused\n" {
		t.Errorf("pause: %+v", got)
	}
	if got := run("", "resume", id); got.Stdout != id+"\trunning\n" {
		t.Errorf("resume: %+v", got)
	}
	if got := run("", "rm", id); got.Stdout != id+"\tended\n" {
		t.Errorf("rm: %+v", got)
	}
	got = run("", "exec", id, "echo late")
	if got.Exit != exitAPIFailed || !strings.HasPrefix(got.Stderr, "vertal sandbox exec: sandbox_not_running: ") {
		t.Errorf("exec in an ended sandbox: %+v", got)
	}
	got = run("", "rm", "sbx_00000000000000000000000000000999")
	if got.Exit != exitAPIFailed || !strings.Contains(got.Stderr, "not_found") {
		t.Errorf("rm of an unknown sandbox: %+v", got)
	}
	if got := run("", "exec", id); got.Exit != exitUsage {
		t.Errorf("exec without a command: %+v", got)
	}
	if got := run(""); got.Exit != exitUsage || !strings.Contains(got.Stderr, "create|ls|exec|run-code|cp|pause|resume|rm") {
		t.Errorf("no subcommand: %+v", got)
	}
}

// TestSandboxCreateNetwork: vertal sandbox create sends --allow and
// --no-network as run does, and nothing without them (the plan's list).
func TestSandboxCreateNetwork(t *testing.T) {
	fake, _, run := sandboxCLI(t)
	for _, tc := range []struct {
		args []string
		want string // the request's network, printed
	}{
		{nil, "<nil>"},
		{[]string{"--allow", "pypi.org", "--allow", "*.pythonhosted.org"}, "&{[pypi.org *.pythonhosted.org]}"},
		{[]string{"--no-network"}, "&{[]}"},
	} {
		got := run("", append([]string{"create"}, tc.args...)...)
		if got.Exit != 0 {
			t.Fatalf("create %q: %+v", tc.args, got)
		}
		if n := fmt.Sprint(fake.LastCreate.Network); n != tc.want {
			t.Errorf("create %q: network %s, want %s", tc.args, n, tc.want)
		}
	}
	got := run("", "create", "--allow", "pypi.org", "--no-network")
	if got != (cliResult{Stderr: "vertal sandbox create: --allow and --no-network cannot go together\n", Exit: 2}) {
		t.Errorf("--allow with --no-network: %+v", got)
	}
}
