package probes

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// All are the probes, in the order of the doctor's table.
func All(env Env) []Probe {
	if env.ProcRoot == "" {
		env.ProcRoot = "/proc"
	}
	if env.Arch == "" {
		env.Arch = runtime.GOARCH
	}
	return []Probe{
		helloProbe("python", "print(6*7)"),
		helloProbe("javascript", "console.log(6*7)"),
		helloProbe("bash", "echo $((6*7))"),
		networkProbe(env),
		readonlyProbe(),
		writableProbe(),
		tmpOptionsProbe(),
		ldsoProbe(env.Arch),
		userProbe(),
		capsProbe(),
		nnpProbe(),
		seccompProbe(env.Arch),
		namespacesProbe(env.HostNamespaces, env.Hostname),
		maskedProbe(),
		environmentProbe(env.CanaryName, env.CanaryValue),
		memoryProbe(),
		pidsProbe(),
		cpuProbe(env.CPUs),
		fileSizeProbe(),
		outputProbe(),
		timeoutProbe("vertal-probe-"+randHex(6), env.ProcRoot),
		exitProbe("vertal-probe-"+randHex(6), env.ProcRoot),
		freshStateProbe(),
	}
}

// helloProbe runs the smallest program: it must print 42 and nothing
// else, and the driver must measure it.
func helloProbe(lang, code string) Probe {
	return Probe{
		Name: "hello/" + lang, Protection: "runs " + lang, Essential: true, Language: lang, Code: code,
		Evaluate: func(r engine.Result) (bool, string) {
			if r.Status != engine.StatusSucceeded || r.ExitCode != 0 || r.Stdout != "42\n" || r.Stderr != "" || r.Truncated {
				return false, fmt.Sprintf("stdout %q, %s", OneLine(r.Stdout, 60), Describe(r, nil))
			}
			if r.Duration <= 0 || r.Usage.SandboxSeconds <= 0 || r.Usage.CPUSeconds <= 0 || r.Usage.PeakMemoryBytes <= 0 {
				return false, fmt.Sprintf("printed 42, but the driver did not measure it: duration %s, usage %+v", r.Duration, r.Usage)
			}
			return true, fmt.Sprintf("printed 42 in %s", r.Duration.Round(time.Millisecond))
		},
		Fix: "the interpreter does not run in the sandbox: check the image (vertal image build) and the language's command",
	}
}

// memoryCode allocates in 16 MiB steps, saying how far it got.
const memoryCode = `chunks = []
for i in range(64):
    chunks.append(b"x" * (16 << 20))
    print("allocated MiB", (i + 1) * 16, flush=True)
`

func memoryProbe() Probe {
	const limit = 128 << 20
	return Probe{
		Name: "memory_hog_is_memory_exceeded", Protection: sandbox.ProtMemory, Essential: true, Language: "python",
		Code: memoryCode, Limits: engine.Limits{MemoryBytes: limit},
		Evaluate: func(r engine.Result) (bool, string) {
			got := 0
			for _, line := range strings.Split(r.Stdout, "\n") {
				fmt.Sscanf(line, "allocated MiB %d", &got)
			}
			how := fmt.Sprintf("1 GiB in 16 MiB steps under a %d MiB limit: ", limit>>20)
			if r.Status != engine.StatusMemoryExceeded || got > limit>>20 {
				return false, how + fmt.Sprintf("allocated %d MiB, %s", got, Describe(r, nil))
			}
			peak := ""
			if r.Usage.PeakMemoryBytes > 0 {
				peak = fmt.Sprintf(", peak %d MiB", r.Usage.PeakMemoryBytes>>20)
			}
			return true, how + fmt.Sprintf("%s after %d MiB (exit %d%s)", r.Status, got, r.ExitCode, peak)
		},
		Fix: "enable the memory controller (cgroup v2: echo +memory > /sys/fs/cgroup/cgroup.subtree_control; v1: mount the memory hierarchy) and make the driver report OOM kills",
	}
}

// pidsCode starts small processes (sleep, not copies of Python) so the
// memory limit is not what stops it.
const pidsCode = `import json, subprocess
n, err, kids = 0, "", []
for i in range(300):
    try:
        kids.append(subprocess.Popen(["/bin/sleep", "30"]))
    except OSError as e:
        err = e.strerror
        break
    n += 1
print(json.dumps({"forked": n, "error": err}), flush=True)
for k in kids:
    k.kill()
`

func pidsProbe() Probe {
	return Probe{
		Name: "fork_limit", Protection: sandbox.ProtPids, Essential: true, Language: "python", Code: pidsCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Forked int
				Error  string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			if out.Error == "" {
				return false, fmt.Sprintf("%d processes started, none refused", out.Forked)
			}
			ok := out.Forked > 0 && out.Forked < engine.DefaultPids
			return ok, fmt.Sprintf("fork refused after %d processes (limit %d): %s", out.Forked, engine.DefaultPids, out.Error)
		},
		Fix:       "enable the pids controller (cgroup v2: echo +pids > /sys/fs/cgroup/cgroup.subtree_control; v1: mount the pids hierarchy)",
		FixGVisor: "runsc (2022-12) counts its own threads against a pids limit and panics near it; see docs/SECURITY.md for how processes are bounded under gVisor",
	}
}

// cpuCode keeps two processes busy for 1.5 s each.
const cpuCode = `import os, time
def spin(sec):
    end = time.monotonic() + sec
    while time.monotonic() < end:
        pass
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        spin(1.5)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
print("spun")
`

func cpuProbe(cpus int) Probe {
	p := Probe{
		Name: "cpu_quota", Protection: sandbox.ProtCPU, Language: "python", Code: cpuCode,
		Evaluate: func(r engine.Result) (bool, string) {
			if err := finished(r, "spun"); err != nil {
				return false, err.Error()
			}
			// Two busy processes get about 2 CPUs unlimited, 1 under the
			// quota; a busy host can make an unlimited sandbox look
			// limited, never the other way round. The host's cgroup
			// accounting is what counts: gVisor's guest clock is virtual.
			secs := r.Usage.SandboxSeconds
			if secs <= 0 {
				secs = r.Duration.Seconds()
			}
			cpu := r.Usage.CPUSeconds
			if cpu < 0.2 {
				return false, fmt.Sprintf("%.2f CPU-s: the driver did not measure the CPU time", cpu)
			}
			detail := fmt.Sprintf("two busy processes used %.2f CPUs (%.2f CPU-s in %.2f s; quota %.0f)", cpu/secs, cpu, secs, engine.DefaultCPUs)
			return cpu <= secs*engine.DefaultCPUs+0.3, detail
		},
		Fix: "enable the cpu controller and set a CFS quota of 1 CPU (linux.resources.cpu; docker --cpus 1)",
	}
	if cpus > 0 && cpus < 2 {
		p.Skip = "the host has one CPU: a 1-CPU quota cannot be observed"
	}
	return p
}

const fileSizeCode = `import json, os
errno, msg = 0, ""
try:
    with open("/tmp/big", "wb") as f:
        for i in range(4):
            f.write(b"\0" * (512 << 10))
            f.flush()
except OSError as e:
    errno, msg = e.errno, e.strerror
print(json.dumps({"size": os.path.getsize("/tmp/big"), "errno": errno, "error": msg}))
`

func fileSizeProbe() Probe {
	return Probe{
		Name: "file_size_limit", Protection: sandbox.ProtFileSize, Language: "python", Code: fileSizeCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Size  int64
				Errno int
				Error string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			if out.Errno != 27 || out.Size > engine.DefaultFileSizeBytes { // EFBIG
				return false, fmt.Sprintf("wrote a %d-byte file (%s)", out.Size, out.Error)
			}
			return true, fmt.Sprintf("a 2 MiB write stopped at %d bytes (%s)", out.Size, out.Error)
		},
		Fix: "set RLIMIT_FSIZE to 1 MiB (process.rlimits; docker --ulimit fsize=1048576)",
	}
}

func outputProbe() Probe {
	return Probe{
		Name: "output_capped", Protection: "output capped per stream", Essential: true, Language: "python",
		Code: "import sys\nsys.stdout.write('x' * 1000000)\nsys.stderr.write('y' * 1000000)\n",
		Evaluate: func(r engine.Result) (bool, string) {
			detail := fmt.Sprintf("1 MB per stream: kept %d + %d bytes, truncated %v", len(r.Stdout), len(r.Stderr), r.Truncated)
			ok := r.Status == engine.StatusSucceeded && r.Truncated &&
				len(r.Stdout) == engine.DefaultOutputBytes && len(r.Stderr) == engine.DefaultOutputBytes
			if ok && (strings.Trim(r.Stdout, "x") != "" || strings.Trim(r.Stderr, "y") != "") {
				return false, detail + ", but the streams hold something other than the program's output"
			}
			return ok, detail
		},
		Fix: "the driver must keep at most Limits.OutputBytes per stream (sandbox.CappedBuffer)",
	}
}

// leftoverCode leaves a grandchild that called setsid and ignores SIGTERM
// and SIGHUP, named by its marker, then does what @END@ says: spins (until
// the timeout) or ends.
const leftoverCode = `import os, signal
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.execv("/bin/sleep", ["@M@", "1000"])
os.waitpid(pid, 0)
print("started", flush=True)
while @END@ == "spin":
    pass
`

// noLeftovers checks the host's process table for the grandchild, and
// anything naming the execution, once Run has returned.
func noLeftovers(procRoot, marker string) func(string, engine.Result) (bool, string) {
	return func(id string, _ engine.Result) (bool, string) {
		if left := FindProcesses(procRoot, marker, id); len(left) > 0 {
			return false, "still running on the host after Run returned: " + strings.Join(left, ", ")
		}
		return true, "no process of it left on the host (a double-forked setsid child ignoring SIGTERM included)"
	}
}

func timeoutProbe(marker, procRoot string) Probe {
	const timeout = 3 * time.Second
	return Probe{
		Name: "timeout_kills_double_forked_setsid_child", Protection: sandbox.ProtTimeout, Essential: true, Language: "python",
		Code: strings.NewReplacer("@M@", marker, "@END@", `"spin"`).Replace(leftoverCode), Timeout: timeout,
		Evaluate: func(r engine.Result) (bool, string) {
			if r.Status != engine.StatusTimedOut || r.ExitCode != 128+9 || !strings.Contains(r.Stdout, "started") {
				return false, fmt.Sprintf("a %s timeout gave %s", timeout, Describe(r, nil))
			}
			return true, fmt.Sprintf("timed out after %s (exit %d)", r.Duration.Round(10*time.Millisecond), r.ExitCode)
		},
		After: noLeftovers(procRoot, marker),
		Fix:   "the driver must kill every process of the sandbox (its cgroup) on timeout and before returning",
	}
}

// exitProbe is the timeout probe's program ending on its own: a daemon
// it left must not outlive it.
func exitProbe(marker, procRoot string) Probe {
	return Probe{
		Name: "exit_kills_double_forked_setsid_child", Protection: "exit kills every process", Essential: true, Language: "python",
		Code: strings.NewReplacer("@M@", marker, "@END@", `"end"`).Replace(leftoverCode),
		Evaluate: func(r engine.Result) (bool, string) {
			if r.Status != engine.StatusSucceeded || r.ExitCode != 0 || !strings.Contains(r.Stdout, "started") {
				return false, Describe(r, nil)
			}
			return true, fmt.Sprintf("the program ended in %s", r.Duration.Round(10*time.Millisecond))
		},
		After: noLeftovers(procRoot, marker),
		Fix:   "the driver must kill every process of the sandbox (its cgroup) when its program ends",
	}
}

// freshStateProbe leaves a file in /tmp and a process in its own session,
// and looks for both from the next execution.
func freshStateProbe() Probe {
	name := "vertal-fresh-" + randHex(6)
	return Probe{
		Name: "fresh_state", Protection: "fresh sandbox per execution", Essential: true, Language: "python",
		Before: []string{strings.ReplaceAll(`import subprocess
open("/tmp/@N@", "w").write("state")
subprocess.Popen(["/bin/sleep", "30"], start_new_session=True)
print("written")
`, "@N@", name)},
		Code: strings.ReplaceAll(`import json, os
procs = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            procs.append(open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")[0].decode())
        except OSError:
            pass
print(json.dumps({"file": os.path.exists("/tmp/@N@"), "sleep": any(c.endswith("sleep") for c in procs), "tmp": sorted(os.listdir("/tmp"))}))
`, "@N@", name),
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				File, Sleep bool
				Tmp         []string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			switch {
			case out.File:
				return false, "the next execution saw the previous one's /tmp file"
			case out.Sleep:
				return false, "the next execution saw the previous one's process"
			case len(out.Tmp) > 0:
				return false, "the next execution's /tmp is not empty: " + strings.Join(out.Tmp, " ")
			}
			return true, "a file and a process left by one execution are gone in the next, whose /tmp is empty"
		},
		Fix: "every execution needs a new sandbox with a new tmpfs /tmp",
	}
}
