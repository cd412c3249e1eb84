package doctor

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox/uidpool"
)

// ProbeEnv is what the probes need to know about the host.
type ProbeEnv struct {
	// HostAddrs are the host's own IPv4 addresses (including the Docker
	// bridge gateway); the network probe tries to reach them.
	HostAddrs []string
	// HostNamespaces maps a namespace (pid, net, …) to the host's
	// /proc/self/ns link, which the sandbox's must differ from.
	HostNamespaces map[string]string
	// CanaryName and CanaryValue are an environment variable set in this
	// process: the sandbox must not see it.
	CanaryName, CanaryValue string
	// ProcRoot is the host's /proc, searched for processes that outlive
	// their sandbox. Default /proc.
	ProcRoot string
	// CPUs on the host; the CPU quota cannot be observed with fewer than 2.
	CPUs int
	// Arch is the GOARCH; the seccomp probe knows amd64 syscall numbers.
	Arch string
}

// HostProbeEnv gathers ProbeEnv from this machine. The canary is left for
// the caller to set (it changes the process environment).
func HostProbeEnv() ProbeEnv {
	env := ProbeEnv{ProcRoot: "/proc", CPUs: runtime.NumCPU(), Arch: runtime.GOARCH, HostNamespaces: map[string]string{}}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				env.HostAddrs = append(env.HostAddrs, ipn.IP.String())
			}
		}
	}
	for _, ns := range []string{"pid", "ipc", "uts", "mnt", "net", "cgroup"} {
		if v, err := os.Readlink("/proc/self/ns/" + ns); err == nil {
			env.HostNamespaces[ns] = v
		}
	}
	return env
}

// DefaultProbes are the isolation checks, in the order of the table.
func DefaultProbes(env ProbeEnv) []Probe {
	if env.ProcRoot == "" {
		env.ProcRoot = "/proc"
	}
	if env.Arch == "" {
		env.Arch = runtime.GOARCH
	}
	marker := "vertal-doctor-" + newExecutionID()[4:16]
	probes := []Probe{
		runsProbe("python", "print(6*7)"),
		runsProbe("javascript", "console.log(6*7)"),
		runsProbe("bash", "echo $((6*7))"),
		networkProbe(env.HostAddrs),
		readonlyProbe(),
		tmpProbe(),
		tmpOptionsProbe(),
		ldsoProbe(),
		userProbe(),
		statusProbe(sandbox.ProtCaps, true, capsOK,
			"drop every capability (empty capability sets in config.json; docker --cap-drop ALL)"),
		statusProbe(sandbox.ProtNoNewPrivs, true, nnpOK,
			"set process.noNewPrivileges (docker --security-opt no-new-privileges)"),
		seccompProbe(env.Arch),
		namespacesProbe(env.HostNamespaces),
		maskedProbe(),
		environmentProbe(env.CanaryName, env.CanaryValue),
		memoryProbe(),
		pidsProbe(),
		cpuProbe(env.CPUs),
		fileSizeProbe(),
		outputProbe(),
		timeoutProbe(marker, env.ProcRoot),
		freshStateProbe(),
	}
	return probes
}

func runsProbe(lang, code string) Probe {
	return Probe{
		Name: "runs " + lang, Essential: true, Language: lang, Code: code,
		Evaluate: func(r engine.Result) (bool, string) {
			if r.Status == engine.StatusSucceeded && r.Stdout == "42\n" {
				return true, fmt.Sprintf("printed 42 in %s", r.Duration.Round(1e6))
			}
			return false, describe(r, nil)
		},
		Fix: "the interpreter does not run in the sandbox: check the image (vertal image build) and the language's command",
	}
}

const networkCode = `import json, socket
targets = %s
out = {"reachable": [], "blocked": []}
for host, port in targets:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        out["reachable"].append("tcp %%s:%%d connected" %% (host, port))
    except ConnectionRefusedError:
        out["reachable"].append("tcp %%s:%%d refused (so routable)" %% (host, port))
    except OSError as e:
        out["blocked"].append("tcp %%s:%%d" %% (host, port))
    finally:
        s.close()
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(3)
    u.sendto(b"\0", ("8.8.8.8", 53))
    u.recvfrom(512)
    out["reachable"].append("udp 8.8.8.8:53 answered")
except OSError:
    out["blocked"].append("udp 8.8.8.8:53")
try:
    socket.getaddrinfo("deb.debian.org", 443)
    out["reachable"].append("dns resolved deb.debian.org")
except OSError:
    out["blocked"].append("dns")
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
    out["reachable"].append("raw socket opened")
except OSError:
    out["blocked"].append("raw socket")
out["interfaces"] = sorted(n for _, n in socket.if_nameindex())
print(json.dumps(out))
`

func networkProbe(hostAddrs []string) Probe {
	targets := [][]any{{"1.1.1.1", 443}, {"8.8.8.8", 53}, {"172.17.0.1", 2375}}
	for _, a := range hostAddrs {
		if a != "172.17.0.1" {
			targets = append(targets, []any{a, 22})
		}
	}
	tj, _ := json.Marshal(targets)
	return Probe{
		Name: sandbox.ProtNetwork, Essential: true, Language: "python",
		Code: fmt.Sprintf(networkCode, tj),
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Reachable, Blocked, Interfaces []string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			if len(out.Reachable) > 0 {
				return false, "reached: " + strings.Join(out.Reachable, ", ")
			}
			return true, fmt.Sprintf("%d attempts blocked (tcp to the internet, the host and the Docker bridge, udp, dns, raw); interfaces: %s",
				len(out.Blocked), strings.Join(out.Interfaces, " "))
		},
		Fix: "give every sandbox its own network namespace with loopback only (OCI 'network' namespace; docker NetworkMode none); do not serve untrusted code until this passes",
	}
}

const readonlyCode = `import json, os
out = {}
for d in ["/", "/etc", "/usr/bin", "/usr/local/bin", "/var/tmp", "/var/lib", "/run", "/dev", "/dev/shm", "/dev/mqueue", "/root", "/home"]:
    p = os.path.join(d, ".vertal-doctor")
    try:
        with open(p, "w") as f:
            f.write("x")
        out[d] = "WRITABLE"
        os.unlink(p)
    except OSError as e:
        out[d] = e.strerror
print(json.dumps(out))
`

func readonlyProbe() Probe {
	return Probe{
		Name: sandbox.ProtReadonly, Essential: true, Language: "python", Code: readonlyCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]string
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var writable []string
			for d, v := range out {
				if v == "WRITABLE" {
					writable = append(writable, d)
				}
			}
			slices.Sort(writable)
			if len(writable) > 0 {
				return false, "writable: " + strings.Join(writable, " ")
			}
			return true, fmt.Sprintf("%d places outside /tmp and the working directory refused writes (/, /etc, /usr, /var/tmp, /dev/shm, …)", len(out))
		},
		Fix: "mount the root read-only (OCI root.readonly; docker --read-only) and give no writable mount but /tmp and the working directory",
	}
}

const tmpCode = `import json, os, shutil, subprocess
out = {}
shutil.copy("/bin/true", "/tmp/t")
os.chmod("/tmp/t", 0o755)
try:
    subprocess.run(["/tmp/t"], check=True)
    out["exec"] = "allowed"
except OSError as e:
    out["exec"] = "denied (" + e.strerror + ")"
except subprocess.CalledProcessError as e:
    out["exec"] = "exit %d" % e.returncode
n = 0
try:
    for i in range(64):
        with open("/tmp/fill%d" % i, "wb") as f:
            f.write(b"\0" * 1000000)
        n += 1
    out["fill"] = "unbounded: wrote %d MB" % n
except OSError as e:
    out["fill"] = "stopped at %d MB (%s)" % (n, e.strerror)
out["mb"] = n
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[4] == "/tmp":
        out["options"] = f[5] + "," + line.split(" - ")[1].split()[2]
print(json.dumps(out))
`

func tmpProbe() Probe {
	return Probe{
		Name: "/tmp: no exec, size-limited", Essential: true, Language: "python", Code: tmpCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Exec, Fill, Options string
				MB                  int
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			limit := engine.DefaultTmpBytes / 1_000_000
			ok := strings.HasPrefix(out.Exec, "denied") && out.MB <= limit+1
			return ok, fmt.Sprintf("exec from /tmp %s; filling %s", out.Exec, out.Fill)
		},
		Fix: "mount /tmp as tmpfs with rw,noexec,nosuid,nodev,size=16m (internal/sandbox TmpfsOptions)",
	}
}

// tmpOptionsProbe reads the /tmp mount options. Without capabilities
// nosuid and nodev change little (no setuid file or device node can be
// made), but a missing one is reported, not hidden.
func tmpOptionsProbe() Probe {
	return Probe{
		Name: "/tmp mount options noexec,nosuid,nodev", Language: "python", Code: tmpCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct{ Options string }
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			if out.Options == "" {
				return false, "/tmp not found in /proc/self/mountinfo"
			}
			opts := strings.Split(out.Options, ",")
			var missing []string
			for _, o := range []string{"noexec", "nosuid", "nodev"} {
				if !slices.Contains(opts, o) {
					missing = append(missing, o)
				}
			}
			if len(missing) > 0 {
				return false, "mountinfo options " + out.Options + " lack " + strings.Join(missing, ",")
			}
			return true, "mountinfo options " + out.Options
		},
		Fix:       "mount /tmp with noexec,nosuid,nodev (internal/sandbox TmpfsOptions)",
		FixGVisor: "gVisor (2022-12) does not show or keep nosuid/nodev on the /tmp tmpfs; with every capability dropped no setuid file or device node can be created there; see docs/SECURITY.md",
	}
}

const ldsoCode = `import json, os, shutil, subprocess
shutil.copy("/bin/true", "/tmp/t")
os.chmod("/tmp/t", 0o755)
try:
    r = subprocess.run(["/lib64/ld-linux-x86-64.so.2", "/tmp/t"], capture_output=True)
    out = {"ldso": "ran" if r.returncode == 0 else "refused: " + r.stderr.decode(errors="replace").strip()}
except OSError as e:
    out = {"ldso": "refused: " + e.strerror}
print(json.dumps(out))
`

func ldsoProbe() Probe {
	return Probe{
		Name: "/tmp noexec also through the dynamic loader", Language: "python", Code: ldsoCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct{ Ldso string }
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			if out.Ldso == "ran" {
				return false, "ld.so /tmp/program ran a binary written to /tmp"
			}
			return true, "ld.so /tmp/program " + oneLine(out.Ldso, 80)
		},
		Fix:       "the kernel refuses executable mappings from noexec mounts; check that /tmp is mounted noexec",
		FixGVisor: "runsc (2022-12) lets ld.so map a file from a noexec mount: use crun or runc for untrusted native code, or a newer runsc; see docs/SECURITY.md",
	}
}

const userCode = `import json, os
print(json.dumps({"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(), "groups": os.getgroups()}))
`

func userProbe() Probe {
	return Probe{
		Name: sandbox.ProtUser, Essential: true, Language: "python", Code: userCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				UID, EUID, GID, EGID int
				Groups               []int
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			detail := fmt.Sprintf("uid %d euid %d gid %d egid %d groups %v", out.UID, out.EUID, out.GID, out.EGID, out.Groups)
			// A uid of the sandbox pool, the same as gid: per-user kernel
			// limits are then the sandbox's own.
			inPool := out.UID >= uidpool.DefaultFirst && out.UID < uidpool.DefaultFirst+uidpool.DefaultCount
			ok := inPool && out.EUID == out.UID && out.GID == out.UID && out.EGID == out.UID
			for _, g := range out.Groups {
				ok = ok && g == out.GID
			}
			return ok, detail
		},
		Fix: "run user code as a uid:gid of its own from the sandbox pool, with no supplementary groups (process.user; docker --user)",
	}
}

// statusCode prints the fields of /proc/self/status that describe
// privileges.
const statusCode = `import ctypes, json
out = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k.startswith("Cap") or k in ("NoNewPrivs", "Seccomp", "Seccomp_filters"):
        out[k] = v.strip()
# PR_GET_NO_NEW_PRIVS: asks the kernel directly (gVisor has no NoNewPrivs line).
out["prctl_no_new_privs"] = str(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))
print(json.dumps(out))
`

func statusProbe(name string, essential bool, judge func(map[string]string) (bool, string), fix string) Probe {
	return Probe{
		Name: name, Essential: essential, Language: "python", Code: statusCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]string
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			return judge(out)
		},
		Fix: fix,
	}
}

func capsOK(st map[string]string) (bool, string) {
	var nonzero, seen []string
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		v, ok := st[k]
		if !ok {
			continue
		}
		seen = append(seen, k)
		if n, err := strconv.ParseUint(v, 16, 64); err != nil || n != 0 {
			nonzero = append(nonzero, k+"="+v)
		}
	}
	switch {
	case len(seen) == 0:
		return false, "/proc/self/status shows no capability sets"
	case len(nonzero) > 0:
		return false, "capabilities held: " + strings.Join(nonzero, " ")
	}
	return true, strings.Join(seen, ", ") + " all empty"
}

func nnpOK(st map[string]string) (bool, string) {
	p := st["prctl_no_new_privs"]
	detail := "prctl(PR_GET_NO_NEW_PRIVS) = " + p
	if v, ok := st["NoNewPrivs"]; ok {
		detail += ", /proc/self/status NoNewPrivs: " + v
		return p == "1" && v == "1", detail
	}
	return p == "1", detail
}

// seccompCode calls system calls the profile must deny and reports how
// each failed. Numbers are x86-64. The calls are harmless if allowed.
const seccompCode = `import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if r >= 0:
        return "ALLOWED"
    return os.strerror(ctypes.get_errno())
params = ctypes.create_string_buffer(120)
attr = ctypes.create_string_buffer(128)
out = {
    "io_uring_setup": call(425, 1, params),
    "unshare(CLONE_NEWUSER)": call(272, 0x10000000),
    "keyctl": call(250, 0, -3, 0),
    "bpf": call(321, 0, attr, 128),
    "userfaultfd": call(323, 0),
    "perf_event_open": call(298, attr, 0, -1, -1, 0),
    "ptrace(TRACEME)": call(101, 0, 0, 0, 0),
    "mount": call(165, b"none", b"/tmp", b"tmpfs", 0, 0),
    "setns": call(308, 0, 0),
    "kexec_load": call(246, 0, 0, 0, 0),
    "init_module": call(175, 0, 0, b""),
}
status = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    status[k] = v.strip()
out["_seccomp_mode"] = status.get("Seccomp", "?")
print(json.dumps(out))
`

func seccompProbe(arch string) Probe {
	p := Probe{
		Name: sandbox.ProtSeccomp, Essential: true, Language: "python", Code: seccompCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]string
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			mode := out["_seccomp_mode"]
			delete(out, "_seccomp_mode")
			var allowed []string
			for k, v := range out {
				if v == "ALLOWED" {
					allowed = append(allowed, k)
				}
			}
			slices.Sort(allowed)
			if len(allowed) > 0 {
				return false, "allowed: " + strings.Join(allowed, ", ")
			}
			return true, fmt.Sprintf("%d dangerous syscalls denied (io_uring, bpf, userfaultfd, unshare, mount, ptrace, keyctl, …); seccomp mode %s",
				len(out), mode)
		},
		Fix: "apply Vertal's seccomp profile (internal/sandbox); runsc needs --oci-seccomp to apply it",
	}
	if arch != "amd64" {
		p.Skip = "syscall numbers are only known for amd64"
	}
	return p
}

const namespacesCode = `import json, os, socket
out = {"hostname": socket.gethostname(), "pid": os.getpid()}
for ns in ["pid", "ipc", "uts", "mnt", "net", "cgroup"]:
    try:
        out[ns] = os.readlink("/proc/self/ns/" + ns)
    except OSError as e:
        out[ns] = "?" + e.strerror
print(json.dumps(out))
`

func namespacesProbe(host map[string]string) Probe {
	return Probe{
		Name: sandbox.ProtNamespaces, Essential: true, Language: "python", Code: namespacesCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]any
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var shared, own, unknown []string
			for _, ns := range []string{"pid", "ipc", "uts", "mnt", "net", "cgroup"} {
				v, _ := out[ns].(string)
				switch {
				case strings.HasPrefix(v, "?") || host[ns] == "":
					unknown = append(unknown, ns)
				case v == host[ns]:
					shared = append(shared, ns)
				default:
					own = append(own, ns)
				}
			}
			detail := fmt.Sprintf("own: %s; hostname %v", strings.Join(own, " "), out["hostname"])
			if len(unknown) > 0 {
				detail += "; not visible: " + strings.Join(unknown, " ")
			}
			if len(shared) > 0 {
				return false, "shared with the host: " + strings.Join(shared, " ") + "; " + detail
			}
			// gVisor shows its own synthetic namespaces; unreadable ones
			// cannot be shared with the host's, but say so.
			return len(own) > 0, detail
		},
		Fix: "give every sandbox its own pid, ipc, uts, mount, network and cgroup namespaces (linux.namespaces in config.json)",
	}
}

const maskedCode = `import json, os
out = {}
for p in ["/proc/kcore", "/proc/keys", "/proc/sched_debug", "/proc/timer_list", "/proc/latency_stats", "/proc/acpi", "/proc/scsi"]:
    try:
        if os.path.isdir(p):
            out[p] = "READABLE: %d entries" % len(os.listdir(p)) if os.listdir(p) else "empty"
        else:
            with open(p, "rb") as f:
                b = f.read(64)
            out[p] = "READABLE" if b else "empty"
    except OSError as e:
        out[p] = e.strerror
for p in ["/sys/firmware"]:
    try:
        out[p] = "READABLE: %d entries" % len(os.listdir(p)) if os.listdir(p) else "empty"
    except OSError as e:
        out[p] = e.strerror
print(json.dumps(out))
`

func maskedProbe() Probe {
	return Probe{
		Name: sandbox.ProtMasked, Language: "python", Code: maskedCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]string
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var readable []string
			for p, v := range out {
				if strings.HasPrefix(v, "READABLE") {
					readable = append(readable, p)
				}
			}
			slices.Sort(readable)
			if len(readable) > 0 {
				return false, "readable: " + strings.Join(readable, " ")
			}
			return true, fmt.Sprintf("%d host paths masked or absent (/proc/kcore, /proc/keys, /sys/firmware, …)", len(out))
		},
		Fix: "mask them (OCI linux.maskedPaths; internal/sandbox MaskedPaths)",
	}
}

const environmentCode = `import json, os
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
print(json.dumps({"env": dict(os.environ), "fds": fds}))
`

func environmentProbe(canaryName, canaryValue string) Probe {
	return Probe{
		Name: sandbox.ProtEnv, Essential: true, Language: "python", Code: environmentCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Env map[string]string
				FDs []int
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var names []string
			leaked := false
			for k, v := range out.Env {
				names = append(names, k)
				if (canaryName != "" && k == canaryName) || (canaryValue != "" && strings.Contains(v, canaryValue)) {
					leaked = true
				}
			}
			slices.Sort(names)
			// 0-2 are stdio; the listing itself holds the lowest free fd.
			extra := len(out.FDs) > 4 || (len(out.FDs) == 4 && out.FDs[3] != 3)
			detail := fmt.Sprintf("environment: %s; open fds: %v", strings.Join(names, " "), out.FDs)
			switch {
			case leaked:
				return false, "the server's environment reached the sandbox (" + canaryName + "); " + detail
			case extra:
				return false, "file descriptors leaked in; " + detail
			}
			return true, detail
		},
		Fix: "start sandboxes with the fixed environment of internal/sandbox (never the server's) and close every descriptor but stdio",
	}
}

func memoryProbe() Probe {
	const limit = 128 << 20
	return Probe{
		Name: sandbox.ProtMemory, Essential: true, Language: "python",
		Code:   "b = b'\\1' * (512 << 20)\nprint(len(b))\n",
		Limits: engine.Limits{MemoryBytes: limit},
		Evaluate: func(r engine.Result) (bool, string) {
			if r.Status == engine.StatusMemoryExceeded {
				peak := ""
				if r.Usage.PeakMemoryBytes > 0 {
					peak = fmt.Sprintf(", peak %d MiB", r.Usage.PeakMemoryBytes>>20)
				}
				return true, fmt.Sprintf("512 MiB under a 128 MiB limit: %s (exit %d%s)", r.Status, r.ExitCode, peak)
			}
			return false, "512 MiB under a 128 MiB limit: " + describe(r, nil)
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
		Name: sandbox.ProtPids, Essential: true, Language: "python", Code: pidsCode,
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
			ok := out.Forked < engine.DefaultPids
			return ok, fmt.Sprintf("fork refused after %d processes (limit %d): %s", out.Forked, engine.DefaultPids, out.Error)
		},
		Fix:       "enable the pids controller (cgroup v2: echo +pids > /sys/fs/cgroup/cgroup.subtree_control; v1: mount the pids hierarchy)",
		FixGVisor: "runsc (2022-12) counts its own threads against a pids limit and panics near it; see docs/SECURITY.md for how processes are bounded under gVisor",
	}
}

const cpuCode = `import json, os, time
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
t = os.times()
print(json.dumps({"cpu": t.children_user + t.children_system, "wall": 1.5}))
`

func cpuProbe(cpus int) Probe {
	p := Probe{
		Name: sandbox.ProtCPU, Language: "python", Code: cpuCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct{ CPU, Wall float64 }
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			// Two busy processes get about 2 CPUs unlimited, 1 under the
			// quota; a busy host can make an unlimited sandbox look
			// limited, never the other way round. The host's cgroup
			// accounting is preferred: gVisor's guest clock is virtual.
			used := out.CPU / out.Wall
			how := "CPU time seen inside"
			if r.Usage.CPUSeconds > 0 && r.Duration > 0 {
				used = r.Usage.CPUSeconds / r.Duration.Seconds()
				how = fmt.Sprintf("cgroup: %.2f CPU-s in %s", r.Usage.CPUSeconds, r.Duration.Round(1e7))
			}
			return used <= 1.3, fmt.Sprintf("two busy processes used %.2f CPUs (%s; quota %.0f)", used, how, engine.DefaultCPUs)
		},
		Fix: "enable the cpu controller and set a CFS quota of 1 CPU (linux.resources.cpu; docker --cpus 1)",
	}
	if cpus > 0 && cpus < 2 {
		p.Skip = "the host has one CPU: a 1-CPU quota cannot be observed"
	}
	return p
}

const fileSizeCode = `import json, os
n, err = 0, ""
try:
    with open("/tmp/big", "wb") as f:
        for i in range(4):
            f.write(b"\0" * (512 << 10))
            f.flush()
except OSError as e:
    err = e.strerror
print(json.dumps({"size": os.path.getsize("/tmp/big"), "error": err}))
`

func fileSizeProbe() Probe {
	return Probe{
		Name: sandbox.ProtFileSize, Language: "python", Code: fileSizeCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Size  int64
				Error string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			if out.Error == "" || out.Size > engine.DefaultFileSizeBytes {
				return false, fmt.Sprintf("wrote a %d-byte file", out.Size)
			}
			return true, fmt.Sprintf("a 2 MiB write stopped at %d bytes (%s)", out.Size, out.Error)
		},
		Fix: "set RLIMIT_FSIZE to 1 MiB (process.rlimits; docker --ulimit fsize=1048576)",
	}
}

func outputProbe() Probe {
	return Probe{
		Name: "output capped per stream", Essential: true, Language: "python",
		Code: "import sys\nsys.stdout.write('x' * 1000000)\nsys.stderr.write('y' * 1000000)\n",
		Evaluate: func(r engine.Result) (bool, string) {
			ok := r.Truncated && len(r.Stdout) == engine.DefaultOutputBytes && len(r.Stderr) == engine.DefaultOutputBytes
			return ok, fmt.Sprintf("1 MB per stream: kept %d + %d bytes, truncated %v", len(r.Stdout), len(r.Stderr), r.Truncated)
		},
		Fix: "the driver must keep at most Limits.OutputBytes per stream (engine.CappedBuffer)",
	}
}

// timeoutProbe leaves a process that ignores SIGTERM in its own session,
// then checks the host's process table for it once Run has returned.
func timeoutProbe(marker, procRoot string) Probe {
	code := fmt.Sprintf("trap '' TERM HUP\nsetsid bash -c \"trap '' TERM HUP; exec -a %s sleep 1000\" &\nexec -a %s-main sleep 1000\n", marker, marker)
	return Probe{
		Name: sandbox.ProtTimeout, Essential: true, Language: "bash", Code: code, Timeout: 2e9,
		Evaluate: func(r engine.Result) (bool, string) {
			if r.Status != engine.StatusTimedOut {
				return false, "a 2 s timeout gave " + describe(r, nil)
			}
			return true, fmt.Sprintf("timed out after %s (exit %d)", r.Duration.Round(1e7), r.ExitCode)
		},
		After: func(id string, _ engine.Result) (bool, string) {
			left := findProcesses(procRoot, marker, id)
			if len(left) > 0 {
				return false, "still running on the host after Run returned: " + strings.Join(left, ", ")
			}
			return true, "no process of it left on the host (a setsid child ignoring SIGTERM included)"
		},
		Fix: "the driver must kill every process of the sandbox (its cgroup) on timeout and before returning",
	}
}

// findProcesses lists host processes whose command line mentions any of
// needles (pid: command).
func findProcesses(procRoot string, needles ...string) []string {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		for _, n := range needles {
			if n != "" && strings.Contains(cmd, n) {
				found = append(found, e.Name()+": "+oneLine(cmd, 80))
				break
			}
		}
	}
	return found
}

func freshStateProbe() Probe {
	return Probe{
		Name: "fresh sandbox per execution", Essential: true, Language: "python",
		Before: []string{"open('/tmp/vertal-doctor-state', 'w').write('x')\n"},
		Code:   "import os\nprint('LEFT' if os.path.exists('/tmp/vertal-doctor-state') else 'clean')\n",
		Evaluate: func(r engine.Result) (bool, string) {
			switch strings.TrimSpace(r.Stdout) {
			case "clean":
				return true, "a file written to /tmp by one execution is gone in the next"
			case "LEFT":
				return false, "the next execution saw the previous one's /tmp file"
			}
			return false, describe(r, nil)
		},
		Fix: "every execution needs a new sandbox with a new tmpfs /tmp",
	}
}
