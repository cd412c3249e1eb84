package securitytest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox/uidpool"
)

// functionalCases prove that ordinary programs behave as the API promises.
func functionalCases(e *env) []Case {
	hello := map[string]string{
		"python":     "print(6*7)",
		"javascript": "console.log(6*7)",
		"bash":       "echo $((6*7))",
	}
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
			Case{Name: "hello/" + l, Lang: l, Code: hello[l], Check: func(t *testing.T, res engine.Result, err error) {
				wantStatus(t, res, err, engine.StatusSucceeded, 0)
				if res.Stdout != "42\n" || res.Stderr != "" || res.Truncated {
					t.Errorf("stdout, stderr, truncated = %q, %q, %v; want \"42\\n\", \"\", false", res.Stdout, res.Stderr, res.Truncated)
				}
				if res.Duration <= 0 || res.Usage.SandboxSeconds <= 0 {
					t.Errorf("duration %v, sandbox seconds %v; want > 0", res.Duration, res.Usage.SandboxSeconds)
				}
				if res.Usage.CPUSeconds <= 0 || res.Usage.PeakMemoryBytes <= 0 {
					t.Errorf("usage %+v: want CPU seconds and peak memory measured", res.Usage)
				}
			}},
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
	marker := strconv.Itoa(100000 + int(time.Now().UnixNano()%800000))
	survivor := fmt.Sprintf("%s.%s", marker, "5")
	var cs []Case

	// Timeout: a grandchild that double-forks, calls setsid and ignores
	// SIGTERM must die with the sandbox.
	cs = append(cs, Case{
		Name: "timeout_kills_double_forked_setsid_child", Lang: "python", Timeout: 3 * time.Second,
		Code: strings.ReplaceAll(`
import os, signal, time
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.execv("/bin/sleep", ["sleep", "@S@"])
os.waitpid(pid, 0)
print("started", flush=True)
while True:
    pass
`, "@S@", survivor),
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusTimedOut, 128+9)
			wantContains(t, res.Stdout, "started")
			if pids := hostProcesses("sleep\x00" + survivor); len(pids) > 0 {
				t.Errorf("sandbox process survived the timeout: pids %v", pids)
			}
		},
	})
	cs = append(cs, Case{
		Name: "exit_kills_double_forked_setsid_child", Lang: "python",
		Code: strings.ReplaceAll(`
import os, signal
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.execv("/bin/sleep", ["sleep", "@S@1"])
os.waitpid(pid, 0)
print("main exits")
`, "@S@", survivor),
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			if pids := hostProcesses("sleep\x00" + survivor + "1"); len(pids) > 0 {
				t.Errorf("daemonized sandbox process outlived its execution: pids %v", pids)
			}
		},
	})

	// Processes: the count is bounded for the whole sandbox.
	cs = append(cs, Case{
		Name: "fork_limit", Lang: "python",
		Code: `
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print("fork failed errno", e.errno)
print("forked", n)
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantContains(t, res.Stdout, "fork failed")
			var n int
			for _, line := range strings.Split(res.Stdout, "\n") {
				fmt.Sscanf(line, "forked %d", &n)
			}
			if n <= 0 || n >= engine.DefaultPids {
				t.Errorf("forked %d processes; want 0 < n < %d", n, engine.DefaultPids)
			}
		},
	})

	// Memory: over the limit the kernel kills, and the driver says so.
	cs = append(cs,
		Case{Name: "memory_hog_is_memory_exceeded", Lang: "python", Code: `
import os
chunks = []
for i in range(128):
    chunks.append(b"x" * (16 << 20))
    print("allocated MiB", (i + 1) * 16, flush=True)
`,
			Check: func(t *testing.T, res engine.Result, err error) {
				noErr(t, err)
				if res.Status != engine.StatusMemoryExceeded {
					t.Errorf("status = %s; want %s", res.Status, engine.StatusMemoryExceeded)
				}
				if strings.Contains(res.Stdout, "allocated MiB 512") {
					t.Errorf("allocated 512 MiB under a %d MiB limit", engine.DefaultMemoryBytes>>20)
				}
			}},
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

	// CPU: two busy processes get one CPU between them. Only an upper
	// bound on CPU time per wall time is asserted, so a busy machine can
	// make this weaker but never fail it falsely.
	cs = append(cs, Case{Name: "cpu_quota", Lang: "python", Code: `
import os, time
end = time.monotonic() + 2.0
pid = os.fork()
while time.monotonic() < end:
    pass
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print("spun")
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			if limit := res.Usage.SandboxSeconds*engine.DefaultCPUs + 0.3; res.Usage.CPUSeconds > limit {
				t.Errorf("used %.2f CPU seconds in %.2f s with a quota of %v CPU", res.Usage.CPUSeconds, res.Usage.SandboxSeconds, engine.DefaultCPUs)
			}
			if res.Usage.CPUSeconds < 0.2 {
				t.Errorf("CPU seconds %.2f: not measured", res.Usage.CPUSeconds)
			}
		}})

	// Files: 1 MiB per file, 16 MiB of /tmp.
	cs = append(cs,
		Case{Name: "file_size_limit", Lang: "python", Code: `
import os
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"x" * (2 << 20))
    print("wrote 2 MiB")
except OSError as e:
    print("write failed errno", e.errno)
print("size", os.path.getsize("/tmp/big"))
`,
			Check: func(t *testing.T, res engine.Result, err error) {
				noErr(t, err)
				var size int64 = -1
				for _, line := range strings.Split(res.Stdout, "\n") {
					fmt.Sscanf(line, "size %d", &size)
				}
				if size < 0 || size > engine.DefaultFileSizeBytes {
					t.Errorf("file size %d; want <= %d", size, engine.DefaultFileSizeBytes)
				}
				wantContains(t, res.Stdout, "write failed errno 27") // EFBIG
			}},
		Case{Name: "file_size_limit_bash", Lang: "bash", Code: "head -c 3000000 /dev/zero > /tmp/f; echo status $?; echo size $(wc -c < /tmp/f)",
			Check: func(t *testing.T, res engine.Result, err error) {
				noErr(t, err)
				wantContains(t, res.Stdout, fmt.Sprintf("size %d", engine.DefaultFileSizeBytes))
			}},
	)
	// Both writable places are bounded in size.
	for _, w := range []struct {
		name, dir string
		size      int64
	}{{"tmp_size_limit", "/tmp", engine.DefaultTmpBytes}, {"workdir_size_limit", engine.CodeDir, engine.DefaultWorkdirBytes}} {
		cs = append(cs, Case{Name: w.name, Lang: "python", Code: strings.ReplaceAll(`
total = 0
try:
    for i in range(40):
        with open("@DIR@/f%d" % i, "wb") as f:
            f.write(b"x" * 1000000)
        total += 1000000
except OSError as e:
    print("write failed errno", e.errno)
print("total", total)
`, "@DIR@", w.dir),
			Check: func(t *testing.T, res engine.Result, err error) {
				noErr(t, err)
				wantContains(t, res.Stdout, "write failed errno 28") // ENOSPC
				var total int64
				for _, line := range strings.Split(res.Stdout, "\n") {
					fmt.Sscanf(line, "total %d", &total)
				}
				if total > w.size || total < w.size/2 {
					t.Errorf("wrote %d bytes to %s; want about %d, never more", total, w.dir, w.size)
				}
			}})
	}

	// Nothing written can be executed: not directly, not through the
	// dynamic loader, not from memory.
	loader := map[string]string{"amd64": "/lib64/ld-linux-x86-64.so.2", "arm64": "/lib/ld-linux-aarch64.so.1"}[runtime.GOARCH]
	// /tmp and the working directory (engine.CodeDir) are the writable
	// places; neither lets anything written there run.
	for _, dir := range []string{"/tmp", engine.CodeDir} {
		name := "tmp"
		if dir != "/tmp" {
			name = "workdir"
		}
		cs = append(cs,
			Case{Name: name + "_noexec", Lang: "bash", Code: strings.NewReplacer("@LD@", loader, "/tmp/", dir+"/").Replace(`
cp /bin/echo /tmp/e && chmod 755 /tmp/e && echo copied
/tmp/e EXECUTED-direct
@LD@ /tmp/e EXECUTED-loader
/usr/bin/env /tmp/e EXECUTED-env
echo done
`),
				Check: func(t *testing.T, res engine.Result, err error) {
					noErr(t, err)
					wantContains(t, res.Stdout, "copied")
					wantContains(t, res.Stdout, "done")
					wantNoMarker(t, res, "EXECUTED")
				}},
			Case{Name: name + "_noexec_mmap", Lang: "python", Code: strings.ReplaceAll(`
import mmap, os, shutil
shutil.copy("/bin/echo", "@DIR@/e")
fd = os.open("@DIR@/e", os.O_RDONLY)
try:
    m = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
    m[0]
    print("MAPPED executable from @DIR@")
except OSError as e:
    print("blocked mmap exec", e.errno)
`, "@DIR@", dir),
				Check: func(t *testing.T, res engine.Result, err error) {
					noErr(t, err)
					wantNoMarker(t, res, "MAPPED")
				}},
		)
	}
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

	// Only /tmp and the working directory are writable, and in the working
	// directory the code file can be neither changed nor replaced.
	cs = append(cs, Case{Name: "readonly_everywhere_but_tmp_and_workdir", Lang: "python", Code: `
import os
for d in ["/", "/dev/shm", "/var/tmp", "/etc", "/usr", "/usr/local/bin", "/bin", "/dev", "/run",
          "/run/lock", "/var/lock", "/var/log", "/home", "/root", "/opt", "/sys", "/sys/fs/cgroup", "/proc",
          "/dev/mqueue", "/dev/pts", "/var/cache", "/var/lib", "/lib", "/srv", "/mnt", "/media"]:
    p = os.path.join(d, "w%d" % os.getpid())
    try:
        with open(p, "w") as f:
            f.write("x")
        print("WRITABLE file", d)
    except OSError as e:
        print("read-only", d, e.errno)
    try:
        os.mkdir(p + "d")
        print("WRITABLE dir", d)
    except OSError as e:
        pass
for f in ["/etc/passwd", "` + engine.CodeDir + "/" + e.langs["python"].File + `", "/usr/bin/python3", "/dev/null"]:
    try:
        os.chmod(f, 0o777)
        print("WRITABLE chmod", f)
    except OSError as e:
        pass
code = "` + engine.CodeDir + "/" + e.langs["python"].File + `"
for name, attempt in [("open", lambda: open(code, "a")), ("remove", lambda: os.remove(code)),
                      ("rename", lambda: os.rename(code, code + ".x")), ("chmod", lambda: os.chmod(code, 0o777))]:
    try:
        attempt()
        print("WRITABLE code file", name)
    except OSError as e:
        pass
with open("/tmp/ok", "w") as f:
    f.write("x")
print("tmp writable")
with open("` + engine.CodeDir + `/ok", "w") as f:
    f.write("x")
os.mkdir("` + engine.CodeDir + `/sub")
print("workdir writable", os.getcwd())
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantContains(t, res.Stdout, "tmp writable")
			wantContains(t, res.Stdout, "workdir writable "+engine.CodeDir)
			wantNoMarker(t, res, "WRITABLE")
		}})

	// Identity and privileges.
	cs = append(cs, Case{Name: "unprivileged_identity", Lang: "python", Code: `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("ids", os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(set(os.getgroups()) - {os.getgid()}))
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
        print(k, v.strip())
# The same facts through the kernel API (some kernels omit status lines).
print("no_new_privs", libc.prctl(39, 0, 0, 0, 0))  # PR_GET_NO_NEW_PRIVS
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
data = (ctypes.c_uint32 * 6)()
libc.capget(hdr, data)
print("capget", list(data))
print("bounding", [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1])  # PR_CAPBSET_READ
print("ambient", [c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1])  # PR_CAP_AMBIENT_IS_SET
for fn, arg in [(os.setuid, 0), (os.setgid, 0), (os.setgroups, [0])]:
    try:
        fn(arg)
        print("ESCALATED", fn.__name__)
    except OSError as e:
        print("refused", fn.__name__, e.errno)
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			// A uid of its own, leased from the host-wide pool, as gid too.
			var uid, euid, gid, egid int
			for _, line := range strings.Split(res.Stdout, "\n") {
				fmt.Sscanf(line, "ids %d %d %d %d []", &uid, &euid, &gid, &egid)
			}
			if uid < uidpool.DefaultFirst || uid >= uidpool.DefaultFirst+uidpool.DefaultCount || euid != uid || gid != uid || egid != uid {
				t.Errorf("ids %d %d %d %d; want one uid of the sandbox pool (%d+%d) as uid, euid, gid and egid, and no groups",
					uid, euid, gid, egid, uidpool.DefaultFirst, uidpool.DefaultCount)
			}
			want := []string{"CapEff 0000000000000000", "Seccomp 2",
				"no_new_privs 1", "capget [0, 0, 0, 0, 0, 0]", "bounding []", "ambient []"}
			for _, w := range want {
				wantContains(t, res.Stdout, w+"\n")
			}
			for _, k := range []string{"CapInh", "CapPrm", "CapBnd", "CapAmb"} {
				if strings.Contains(res.Stdout, k+" ") && !strings.Contains(res.Stdout, k+" 0000000000000000\n") {
					t.Errorf("%s is not empty", k)
				}
			}
			wantNoMarker(t, res, "ESCALATED")
		}})

	cs = append(cs, Case{Name: "seccomp_blocks_dangerous_syscalls", Lang: "python", Code: seccompProgram(),
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantNoMarker(t, res, "ALLOWED")
			wantContains(t, res.Stdout, "checked")
			for _, name := range []string{"io_uring_setup", "bpf", "userfaultfd", "perf_event_open", "keyctl",
				"kexec_load", "reboot", "init_module", "mount", "unshare", "setns", "ptrace", "clock_settime", "clone_newuser"} {
				wantContains(t, res.Stdout, "blocked "+name+" ")
			}
		}})

	cs = append(cs, Case{Name: "no_network", Lang: "python", Code: e.listen.networkProgram(), Timeout: 60 * time.Second,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantContains(t, res.Stdout, "interfaces")
			wantNoMarker(t, res, "CONNECTED", "ANSWER", "RESOLVED", "OPENED")
			if n := e.listen.hits.Load(); n != 0 {
				t.Errorf("host listeners received %d connections or datagrams from the sandbox", n)
			}
			t.Logf("targets: host addresses %v, local resolvers %v", e.listen.hostIPs, e.listen.resolver)
		}})

	masked := sandbox.MaskedPaths()
	cs = append(cs, Case{Name: "masked_proc_and_sys", Lang: "python", Code: `
import os
for p in ` + quoteList(masked) + `:
    if not os.path.lexists(p):
        print("absent", p)
    elif os.path.isdir(p):
        try:
            n = os.listdir(p)
        except OSError as e:
            n = []
        print("dir", p, len(n)) if not n else print("VISIBLE dir", p, n[:5])
    else:
        try:
            with open(p, "rb") as f:
                data = f.read(4096)
        except OSError as e:
            data = b""
        print("empty", p) if not data else print("VISIBLE file", p, len(data))
for p in ["/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname"]:
    try:
        with open(p, "w") as f:
            f.write("x")
        print("WRITABLE", p)
    except OSError as e:
        print("read-only", p, e.errno)
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantNoMarker(t, res, "VISIBLE", "WRITABLE")
			wantContains(t, res.Stdout, "/sys/firmware")
		}})

	cs = append(cs, Case{Name: "no_inherited_fds", Lang: "python", Code: `
import os
leaked = []
for fd in range(3, 4096):
    try:
        os.fstat(fd)
        leaked.append((fd, os.readlink("/proc/self/fd/%d" % fd) if os.path.exists("/proc/self/fd/%d" % fd) else "?"))
    except OSError:
        pass
print("LEAKED", leaked) if leaked else print("no fds beyond 2")
for fd in range(3):
    print("fd", fd, os.readlink("/proc/self/fd/%d" % fd))
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			wantNoMarker(t, res, "LEAKED")
			wantContains(t, res.Stdout, "no fds beyond 2")
		}})

	envCheck := func(t *testing.T, res engine.Result, err error) {
		wantStatus(t, res, err, engine.StatusSucceeded, 0)
		if strings.Contains(res.Stdout+res.Stderr, e.secret) {
			t.Errorf("the test process's secret environment value reached the sandbox")
		}
		if strings.Contains(res.Stdout, "VERTAL_SECURITYTEST_SECRET") {
			t.Errorf("the test process's environment variable name reached the sandbox")
		}
	}
	cs = append(cs,
		Case{Name: "no_host_env/python", Lang: "python", Code: `
import os, json
env = dict(os.environ)
print(json.dumps(env))
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/1/cmdline"]:
    try:
        print(p, open(p, "rb").read().replace(b"\0", b" ").decode())
    except OSError as e:
        print(p, "unreadable", e.errno)
extra = set(env) - {"PATH", "HOME", "LANG", "HOSTNAME", "NODE_OPTIONS"}
print("UNEXPECTED env", sorted(extra)) if extra else print("env clean")
print("home", env.get("HOME"), "lang", env.get("LANG"))
`,
			Check: func(t *testing.T, res engine.Result, err error) {
				envCheck(t, res, err)
				wantNoMarker(t, res, "UNEXPECTED")
				wantContains(t, res.Stdout, "home /tmp lang C.UTF-8\n")
			}},
		Case{Name: "no_host_env/javascript", Lang: "javascript", Code: "console.log(JSON.stringify(process.env))", Check: envCheck},
		Case{Name: "no_host_env/bash", Lang: "bash", Code: "env; set", Check: envCheck},
	)

	cs = append(cs, Case{Name: "own_namespaces", Lang: "python", Code: `
import os, socket
for ns in ["pid", "ipc", "uts", "mnt", "net", "cgroup"]:
    try:
        print("ns", ns, os.readlink("/proc/self/ns/" + ns))
    except OSError as e:
        print("ns", ns, "absent")
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("pid", os.getpid(), "visible processes", len(pids))
print("hostname", socket.gethostname())
`,
		Check: func(t *testing.T, res engine.Result, err error) {
			wantStatus(t, res, err, engine.StatusSucceeded, 0)
			for ns, host := range e.hostNS {
				if strings.Contains(res.Stdout, "ns "+ns+" "+host+"\n") {
					t.Errorf("sandbox shares the host's %s namespace (%s)", ns, host)
				}
			}
			var pid, visible int
			for _, line := range strings.Split(res.Stdout, "\n") {
				fmt.Sscanf(line, "pid %d visible processes %d", &pid, &visible)
			}
			if pid == 0 || pid > 10 || visible > 5 {
				t.Errorf("pid %d with %d visible processes: not an own pid namespace", pid, visible)
			}
			if e.hostname != "" && strings.Contains(res.Stdout, "hostname "+e.hostname+"\n") {
				t.Errorf("sandbox sees the host's hostname %q", e.hostname)
			}
		}})
	return cs
}

// seccompProgram calls each system call the profile must refuse, with
// arguments that would succeed (or fail differently) without the filter,
// and prints "ALLOWED name" when the kernel accepted it.
func seccompProgram() string {
	type call struct {
		name string
		nr   int
		args string // Python expression list
	}
	// Syscall numbers differ per architecture; these are x86_64 and arm64.
	nr := func(amd64, arm64 int) int {
		if runtime.GOARCH == "arm64" {
			return arm64
		}
		return amd64
	}
	calls := []call{
		{"io_uring_setup", nr(425, 425), "8, buf(120)"},
		{"io_uring_enter", nr(426, 426), "-1, 0, 0, 0, None, 0"},
		{"io_uring_register", nr(427, 427), "-1, 0, None, 0"},
		{"bpf", nr(321, 280), "0, buf(128), 128"},
		{"userfaultfd", nr(323, 282), "0x80001"}, // O_CLOEXEC|UFFD_USER_MODE_ONLY
		{"perf_event_open", nr(298, 241), "buf(128), 0, -1, -1, 0"},
		{"keyctl", nr(250, 219), "0, -3, 1"}, // KEYCTL_GET_KEYRING_ID session, create
		{"add_key", nr(248, 217), "b'user', b'k', b'v', 1, -3"},
		{"request_key", nr(249, 218), "b'user', b'k', None, -3"},
		{"kexec_load", nr(246, 104), "0, 0, None, 0"},
		{"kexec_file_load", nr(320, 294), "-1, -1, 0, b'', 0"},
		{"reboot", nr(169, 142), "0, 0, 0, None"}, // bad magic: harmless even if allowed
		{"init_module", nr(175, 105), "None, 0, b''"},
		{"finit_module", nr(313, 273), "-1, b'', 0"},
		{"delete_module", nr(176, 106), "b'vertal_none', 0"},
		{"mount", nr(165, 40), "b'none', b'/tmp', b'tmpfs', 0, None"},
		{"umount2", nr(166, 39), "b'/tmp', 2"},
		{"unshare", nr(272, 97), "0x10000000"}, // CLONE_NEWUSER
		{"setns", nr(308, 268), "-1, 0"},
		{"ptrace", nr(101, 117), "0, 0, None, None"}, // PTRACE_TRACEME
		{"process_vm_readv", nr(310, 270), "1, None, 0, None, 0, 0"},
		{"clock_settime", nr(227, 112), "0, buf(16)"},
		{"clock_adjtime", nr(305, 266), "0, buf(256)"}, // modes 0: read-only without the filter
		{"adjtimex", nr(159, 171), "buf(256)"},
		{"settimeofday", nr(164, 170), "None, None"},
		{"pivot_root", nr(155, 41), "b'/tmp', b'/tmp'"},
		{"chroot", nr(161, 51), "b'/tmp'"},
		{"open_by_handle_at", nr(304, 265), "-1, buf(64), 0"},
		{"name_to_handle_at", nr(303, 264), "-100, b'/tmp', buf(128), buf(4), 0"},
		{"fsopen", nr(430, 430), "b'tmpfs', 0"},
		{"open_tree", nr(428, 428), "-100, b'/tmp', 1"},
		{"memfd_create", nr(319, 279), "b'x', 0"},
		{"syslog", nr(103, 116), "10, None, 0"},
		{"swapon", nr(167, 224), "b'/tmp/x', 0"},
		{"kcmp", nr(312, 272), "1, 1, 0, 0, 0"},
		{"pidfd_getfd", nr(438, 438), "-1, 0, 0"},
		{"clone_newuser", nr(56, 220), "0x10000011, 0, None, None, 0"}, // CLONE_NEWUSER|SIGCHLD
		{"clone3", nr(435, 435), "buf(88), 88"},
	}
	var b strings.Builder
	b.WriteString(`
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def buf(n):
    return ctypes.create_string_buffer(n)
def try_call(name, nr, *args):
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(nr), *conv)
    err = ctypes.get_errno()
    if r == 0 and name.startswith("clone"):
        os._exit(0)  # the child of a clone that should not have happened
    if r == -1 and err in (1, 38):  # EPERM, ENOSYS
        print("blocked", name, err)
    else:
        print("ALLOWED", name, r, err)
`)
	for _, c := range calls {
		fmt.Fprintf(&b, "try_call(%q, %d, %s)\n", c.name, c.nr, c.args)
	}
	b.WriteString("print('checked')\n")
	return b.String()
}

// hostProcesses returns the pids on this machine whose command line
// contains s (NUL-separated arguments).
func hostProcesses(s string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// freshState runs two executions: nothing the first writes or starts is
// visible to the second.
func freshState(t *testing.T, e *env) {
	name := "fresh-" + randHex(6)
	first := Case{Lang: "python", Code: strings.ReplaceAll(`
import os, subprocess
open("/tmp/@N@", "w").write("state")
subprocess.Popen(["/bin/sleep", "30"], start_new_session=True)
print("written")
`, "@N@", name)}
	res, err := e.run(t, first)
	wantStatus(t, res, err, engine.StatusSucceeded, 0)
	second := Case{Lang: "python", Code: strings.ReplaceAll(`
import os
print("PRESENT file") if os.path.exists("/tmp/@N@") else print("file absent")
procs = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            procs.append(open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")[0].decode())
        except OSError:
            pass
print("PRESENT sleep") if any(c.endswith("sleep") for c in procs) else print("no sleep")
print("tmp", sorted(os.listdir("/tmp")))
`, "@N@", name)}
	res, err = e.run(t, second)
	wantStatus(t, res, err, engine.StatusSucceeded, 0)
	wantNoMarker(t, res, "PRESENT")
	wantContains(t, res.Stdout, "tmp []\n")
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
