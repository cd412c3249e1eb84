package main

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestBenchSandboxesE2E runs `vertal bench --sandboxes` for real, small:
// its private server, the latency rows without errors, an idle sandbox's
// memory read on the host, and a fill that meets the tenant's cap while
// a second tenant is still served.
func TestBenchSandboxesE2E(t *testing.T) {
	needE2E(t)
	cmd := exec.Command(vertalBinary(t), "bench", "--table=false", "--sandboxes", "--api-runtimes", "bwrap",
		"--image-dir", imageDir(), "--sandbox-n", "4", "--rounds", "2", "--warmup", "1", "--sandbox-fill", "3",
		"--state-dir", t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("vertal bench: %v\n%s\n%s", err, out, stderr.String())
	}
	got := string(out)
	for _, row := range []string{"bare /bin/sh -c 'echo 1' (host)", "echo 1 as a command in a live sandbox (API)", "create a sandbox (API, pool warm)", "delete it (API)", "create a sandbox (API, pool off)", "create a sandbox with network (API, pool warm)",
		"python3 -c 'print(1 + 1)' as a command (API)", "1 + 1 as a cell in a Python context (API)",
		"1 + 1 as a cell in a JavaScript context (API)", "bare python3 -c pass (host)", "start a Python context, until ready (API)"} {
		re := regexp.MustCompile(regexp.QuoteMeta(row) + `\s*\| 4\s*\| [0-9.]+ ms\s*\| [0-9.]+ ms\s*\| [0-9.]+\s*\| 0\s*\|`)
		if !re.MatchString(got) {
			t.Errorf("no error-free row of 4 for %q:\n%s", row, got)
		}
	}
	for _, want := range []string{
		"with the pool off, ",
		"- idle sandbox: ",
		"- a cell in a code context: p50 ",
		"- a new Python context is ready in p50 ",
		"- idle sandbox with a Python context started: 5 processes",
		// CI builds the datasci image next to the default one.
		"- idle sandbox (datasci image) with a Python context that imported pandas: 5 processes, PSS ",
		"- capacity: 3 of 3 idle sandboxes held at once",
		"- per sandbox, with 3 held: PSS ",
		"- the next create of the same tenant got: 429 sandbox_limit",
		"- a second tenant's create with those held got: 201 created",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s\n%s", want, got, stderr.String())
		}
	}
}
