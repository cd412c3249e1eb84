package securitytest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// functionalCases prove that ordinary programs behave as the API promises.
func functionalCases(e *env) []Case {
	stdin := map[string]string{
		"python":     "import sys\nprint(sys.stdin.read().upper(), end='')",
		"javascript": "process.stdout.write(require('fs').readFileSync(0, 'utf8').toUpperCase())",
		"bash":       "tr a-z A-Z",
	}
	exit := map[string]string{
		"python":     "import sys\nprint('before')\nsys.exit(3)",
		"javascript": "console.log('before'); process.exit(3)",
		"bash":       "echo before; exit 3",
	}
	// A process killed by a signal reports 128+signal. User code is not
	// pid 1, so a signal it sends itself is not ignored.
	signal := map[string]string{
		"python":     "import os, signal, sys\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)",
		"javascript": "console.log('before'); process.kill(process.pid, 'SIGTERM')",
		"bash":       "echo before; kill -TERM $$",
	}
	var cs []Case
	for _, l := range []string{"python", "javascript", "bash"} {
		cs = append(cs,
			Case{Name: "stdin/" + l, Lang: l, Code: stdin[l], Stdin: "hello from stdin\nline two\n", Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				if res.Stdout != "HELLO FROM STDIN\nLINE TWO\n" {
					t.Errorf("stdout = %q", res.Stdout)
				}
			}},
			Case{Name: "exit_code/" + l, Lang: l, Code: exit[l], Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusFailed, 3)
				wantContains(t, res.Stdout, "before")
			}},
			Case{Name: "signal_exit_code/" + l, Lang: l, Code: signal[l], Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusFailed, 128+15)
				wantContains(t, res.Stdout, "before")
			}},
		)
	}
	cs = append(cs,
		Case{Name: "stderr_separate", Lang: "python", Code: "import sys\nprint('out')\nprint('err', file=sys.stderr)",
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				if res.Stdout != "out\n" || res.Stderr != "err\n" {
					t.Errorf("stdout, stderr = %q, %q", res.Stdout, res.Stderr)
				}
			}},
		Case{Name: "segfault_exit_code", Lang: "python", Code: "import ctypes\nprint('before', flush=True)\nctypes.string_at(0)",
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusFailed, 128+11)
			}},
	)
	return cs
}

// attackCases try each way out of, or around, the sandbox.
func attackCases(e *env) []Case {
	var cs []Case

	// Memory: a program under the limit is not killed, and its peak is
	// measured. (Over it: the memory probe.)
	cs = append(cs,
		Case{Name: "memory_under_limit_is_fine", Lang: "python", Code: `
data = b"x" * (96 << 20)
print("ok", len(data) >> 20)
`,
			Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				if res.Usage.PeakMemoryBytes < 96<<20 {
					t.Errorf("peak memory %d; want >= 96 MiB", res.Usage.PeakMemoryBytes)
				}
			}},
	)

	// Files: 1 MiB per file, also for a shell redirect. (Python: the file
	// size probe.)
	cs = append(cs,
		Case{Name: "file_size_limit_bash", Lang: "bash", Code: "head -c 3000000 /dev/zero > /tmp/f; echo status $?; echo size $(wc -c < /tmp/f)",
			Check: func(t *testing.T, res engine.Result, err error) {
				noErr(t, err)
				wantContains(t, res.Stdout, fmt.Sprintf("size %d", engine.DefaultFileSizeBytes))
			}},
	)
	// Nothing written can be executed from memory either. (Written to
	// /tmp or the working directory: the noexec probes.)
	cs = append(cs,
		Case{Name: "memfd_exec", Lang: "python", Code: `
import os
try:
    fd = os.memfd_create("x", 0)
    os.write(fd, open("/bin/echo", "rb").read())
    os.execv("/proc/self/fd/%d" % fd, ["echo", "EXECUTED from memfd"])
except OSError as e:
    print("blocked memfd", e.errno)
`,
			Check: func(t *testing.T, res engine.Result, err error) {
				noErr(t, err)
				wantNoMarker(t, res, "EXECUTED")
				wantContains(t, res.Stdout, "blocked memfd")
			}},
	)

	// The environment probe dumps Python's; the other interpreters must
	// not see the planted variable either.
	envCheck := func(t *testing.T, res engine.Result, err error) {
		wantStatus(t, res, err, engine.StatusSucceeded, 0)
		if probes.LeaksCanary(res, e.probe.CanaryName, e.probe.CanaryValue) {
			t.Errorf("the test process's planted environment variable %s reached the sandbox", e.probe.CanaryName)
		}
	}
	cs = append(cs,
		Case{Name: "no_host_env/javascript", Lang: "javascript", Code: "console.log(JSON.stringify(process.env))", Check: envCheck},
		Case{Name: "no_host_env/bash", Lang: "bash", Code: "env; set", Check: envCheck},
	)
	return cs
}

// outputFlood writes 100 MiB to stdout: the driver keeps the first
// OutputBytes, marks the result truncated, and the server's heap stays flat.
func outputFlood(t *testing.T, e *env) {
	c := Case{Lang: "python", Timeout: 60 * time.Second, Code: `
import sys
chunk = b"x" * 65536
w = sys.stdout.buffer
for _ in range(1600):
    w.write(chunk)
w.flush()
sys.stderr.write("e" * (1 << 20))
`}
	before := heapNow()
	h := sampleHeap()
	res, err := e.run(t, c)
	peak := h.Stop()
	wantStatus(t, res, err, engine.StatusSucceeded, 0)
	if len(res.Stdout) != engine.DefaultOutputBytes || len(res.Stderr) != engine.DefaultOutputBytes || !res.Truncated {
		t.Errorf("stdout %d bytes, stderr %d bytes, truncated %v; want %d, %d, true",
			len(res.Stdout), len(res.Stderr), res.Truncated, engine.DefaultOutputBytes, engine.DefaultOutputBytes)
	}
	if strings.Trim(res.Stdout, "x") != "" {
		t.Errorf("stdout holds something other than the program's output")
	}
	const slack = 16 << 20
	if peak > before+slack {
		t.Errorf("server heap grew from %d to %d bytes during a 100 MiB flood; want < %d MiB growth", before, peak, slack>>20)
	}
}

// forkBombThenHealthy runs a classic fork bomb, then checks the machine
// still runs sandboxes normally.
func forkBombThenHealthy(t *testing.T, e *env) {
	res, err := e.run(t, Case{Lang: "bash", Timeout: 5 * time.Second, Code: `bomb() { bomb | bomb & }; bomb; sleep 10`})
	noErr(t, err)
	if res.Status == engine.StatusSucceeded || res.Status == engine.StatusError {
		t.Errorf("fork bomb: status %s", res.Status)
	}
	res, err = e.run(t, Case{Lang: "python", Code: "print(6*7)"})
	wantStatus(t, res, err, engine.StatusSucceeded, 0)
	if res.Stdout != "42\n" {
		t.Errorf("after the fork bomb: stdout %q", res.Stdout)
	}
}
