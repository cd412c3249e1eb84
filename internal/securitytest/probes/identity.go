package probes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
)

// identityCode prints who the program runs as and what it may do, from
// /proc/self/status and from the kernel API (some kernels, and gVisor,
// omit status lines), then tries to become root. The user, capability and
// no_new_privs probes judge different parts of it.
const identityCode = `import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(), "groups": os.getgroups()}
status = {}
for line in open("/proc/self/status"):
    k, _, v = line.partition(":")
    if k.startswith("Cap") or k in ("NoNewPrivs", "Seccomp", "Seccomp_filters"):
        status[k] = v.strip()
out["status"] = status
out["prctl_no_new_privs"] = libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
data = (ctypes.c_uint32 * 6)()
out["capget"] = list(data) if libc.capget(hdr, data) == 0 else "failed"
out["bounding"] = [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1]  # PR_CAPBSET_READ
out["ambient"] = [c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1]  # PR_CAP_AMBIENT_IS_SET
esc = {}
for fn, arg in [(os.setuid, 0), (os.setgid, 0), (os.setgroups, [0])]:
    try:
        fn(arg)
        esc[fn.__name__] = "ESCALATED"
    except OSError as e:
        esc[fn.__name__] = e.strerror
out["escalation"] = esc
print(json.dumps(out))
`

type identity struct {
	UID, EUID, GID, EGID int
	Groups               []int
	Status               map[string]string
	PrctlNoNewPrivs      int `json:"prctl_no_new_privs"`
	Capget               any
	Bounding, Ambient    []int
	Escalation           map[string]string
}

func identityProbe(name, protection string, judge func(identity) (bool, string), fix string) Probe {
	return Probe{
		Name: name, Protection: protection, Essential: true, Language: "python", Code: identityCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var id identity
			if err := decodeJSON(r, &id); err != nil {
				return false, err.Error()
			}
			return judge(id)
		},
		Fix: fix,
	}
}

func userProbe() Probe {
	return identityProbe("unprivileged_identity", sandbox.ProtUser, userOK,
		"run user code as a uid:gid of its own from the sandbox pool, with no supplementary groups (process.user; docker --user)")
}

// userOK wants a uid of the sandbox pool, the same as the gid, so per-user
// kernel limits are the sandbox's own, and no way to become root.
func userOK(id identity) (bool, string) {
	detail := fmt.Sprintf("uid %d euid %d gid %d egid %d groups %v", id.UID, id.EUID, id.GID, id.EGID, id.Groups)
	inPool := id.UID >= uidpool.DefaultFirst && id.UID < uidpool.DefaultFirst+uidpool.DefaultCount
	ok := inPool && id.EUID == id.UID && id.GID == id.UID && id.EGID == id.UID
	for _, g := range id.Groups {
		ok = ok && g == id.GID
	}
	var escalated []string
	for _, fn := range []string{"setuid", "setgid", "setgroups"} {
		if v, seen := id.Escalation[fn]; !seen || v == "ESCALATED" {
			escalated = append(escalated, fn+"(0)")
		}
	}
	if len(escalated) > 0 {
		return false, detail + "; not refused: " + strings.Join(escalated, ", ")
	}
	return ok, detail + "; setuid, setgid and setgroups to root refused"
}

func capsProbe() Probe {
	return identityProbe("no_capabilities", sandbox.ProtCaps, capsOK,
		"drop every capability (empty capability sets in config.json; docker --cap-drop ALL)")
}

func capsOK(id identity) (bool, string) {
	var nonzero, seen []string
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		v, ok := id.Status[k]
		if !ok {
			continue
		}
		seen = append(seen, k)
		if n, err := strconv.ParseUint(v, 16, 64); err != nil || n != 0 {
			nonzero = append(nonzero, k+"="+v)
		}
	}
	if caps, ok := id.Capget.([]any); !ok || slices.ContainsFunc(caps, func(c any) bool { return c != 0.0 }) {
		nonzero = append(nonzero, fmt.Sprintf("capget=%v", id.Capget))
	}
	if len(id.Bounding) > 0 {
		nonzero = append(nonzero, fmt.Sprintf("bounding=%v", id.Bounding))
	}
	if len(id.Ambient) > 0 {
		nonzero = append(nonzero, fmt.Sprintf("ambient=%v", id.Ambient))
	}
	switch {
	case !slices.Contains(seen, "CapEff"):
		return false, "/proc/self/status shows no effective capability set"
	case len(nonzero) > 0:
		return false, "capabilities held: " + strings.Join(nonzero, " ")
	}
	return true, strings.Join(seen, ", ") + " all empty; capget and the bounding and ambient sets agree"
}

func nnpProbe() Probe {
	return identityProbe("no_new_privs", sandbox.ProtNoNewPrivs, nnpOK,
		"set process.noNewPrivileges (docker --security-opt no-new-privileges)")
}

func nnpOK(id identity) (bool, string) {
	p := id.PrctlNoNewPrivs
	detail := fmt.Sprintf("prctl(PR_GET_NO_NEW_PRIVS) = %d", p)
	// gVisor has no NoNewPrivs line.
	if v, ok := id.Status["NoNewPrivs"]; ok {
		detail += ", /proc/self/status NoNewPrivs: " + v
		return p == 1 && v == "1", detail
	}
	return p == 1, detail
}

// seccompCall is one system call the profile must refuse, with arguments
// that would succeed (or fail differently) without the filter.
type seccompCall struct {
	name         string
	amd64, arm64 int
	args         string // Python expression list
}

var seccompCalls = []seccompCall{
	{"io_uring_setup", 425, 425, "8, buf(120)"},
	{"io_uring_enter", 426, 426, "-1, 0, 0, 0, None, 0"},
	{"io_uring_register", 427, 427, "-1, 0, None, 0"},
	{"bpf", 321, 280, "0, buf(128), 128"},
	{"userfaultfd", 323, 282, "0x80001"}, // O_CLOEXEC|UFFD_USER_MODE_ONLY
	{"perf_event_open", 298, 241, "buf(128), 0, -1, -1, 0"},
	{"keyctl", 250, 219, "0, -3, 1"}, // KEYCTL_GET_KEYRING_ID session, create
	{"add_key", 248, 217, "b'user', b'k', b'v', 1, -3"},
	{"request_key", 249, 218, "b'user', b'k', None, -3"},
	{"kexec_load", 246, 104, "0, 0, None, 0"},
	{"kexec_file_load", 320, 294, "-1, -1, 0, b'', 0"},
	{"reboot", 169, 142, "0, 0, 0, None"}, // bad magic: harmless even if allowed
	{"init_module", 175, 105, "None, 0, b''"},
	{"finit_module", 313, 273, "-1, b'', 0"},
	{"delete_module", 176, 106, "b'vertal_none', 0"},
	{"mount", 165, 40, "b'none', b'/tmp', b'tmpfs', 0, None"},
	{"umount2", 166, 39, "b'/tmp', 2"},
	{"unshare", 272, 97, "0x10000000"}, // CLONE_NEWUSER
	{"setns", 308, 268, "-1, 0"},
	{"ptrace", 101, 117, "0, 0, None, None"}, // PTRACE_TRACEME
	{"process_vm_readv", 310, 270, "1, None, 0, None, 0, 0"},
	{"clock_settime", 227, 112, "0, buf(16)"},
	{"clock_adjtime", 305, 266, "0, buf(256)"}, // modes 0: read-only without the filter
	{"adjtimex", 159, 171, "buf(256)"},
	{"settimeofday", 164, 170, "None, None"},
	{"pivot_root", 155, 41, "b'/tmp', b'/tmp'"},
	{"chroot", 161, 51, "b'/tmp'"},
	{"open_by_handle_at", 304, 265, "-1, buf(64), 0"},
	{"name_to_handle_at", 303, 264, "-100, b'/tmp', buf(128), buf(4), 0"},
	{"fsopen", 430, 430, "b'tmpfs', 0"},
	{"open_tree", 428, 428, "-100, b'/tmp', 1"},
	{"memfd_create", 319, 279, "b'x', 0"},
	{"syslog", 103, 116, "10, None, 0"},
	{"swapon", 167, 224, "b'/tmp/x', 0"},
	{"kcmp", 312, 272, "1, 1, 0, 0, 0"},
	{"pidfd_getfd", 438, 438, "-1, 0, 0"},
	{"clone_newuser", 56, 220, "0x10000011, 0, None, None, 0"}, // CLONE_NEWUSER|SIGCHLD
	{"clone3", 435, 435, "buf(88), 88"},
}

const seccompPrelude = `
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
`

// seccompProbe calls each system call the profile must refuse and wants
// every one refused with EPERM or ENOSYS (another error means the call
// reached the kernel), under filter mode 2.
func seccompProbe(arch string) Probe {
	var b strings.Builder
	b.WriteString(seccompPrelude)
	for _, c := range seccompCalls {
		nr := c.amd64
		if arch == "arm64" {
			nr = c.arm64
		}
		fmt.Fprintf(&b, "try_call(%q, %d, %s)\n", c.name, nr, c.args)
	}
	b.WriteString(`for line in open("/proc/self/status"):
    if line.startswith("Seccomp:"):
        print("mode", line.split()[1])
print("checked")
`)
	p := Probe{
		Name: "seccomp_blocks_dangerous_syscalls", Protection: sandbox.ProtSeccomp, Essential: true, Language: "python", Code: b.String(),
		Evaluate: func(r engine.Result) (bool, string) {
			if err := finished(r, "checked\n"); err != nil {
				return false, err.Error()
			}
			if allowed := markers(r, "ALLOWED"); len(allowed) > 0 {
				return false, "allowed: " + strings.Join(allowed, "; ")
			}
			mode := "?"
			for _, line := range strings.Split(r.Stdout, "\n") {
				if m, ok := strings.CutPrefix(line, "mode "); ok {
					mode = m
				}
			}
			n := countLines(r, "blocked ")
			detail := fmt.Sprintf("%d dangerous syscalls denied (io_uring, bpf, userfaultfd, unshare, mount, ptrace, keyctl, …); seccomp mode %s", n, mode)
			return n == len(seccompCalls) && mode == "2", detail
		},
		Fix: "apply Vertal's seccomp profile (internal/engine/sandbox); runsc needs --oci-seccomp to apply it",
	}
	if arch != "amd64" && arch != "arm64" {
		p.Skip = "syscall numbers are only known for amd64 and arm64"
	}
	return p
}

const namespacesCode = `import json, os, socket
out = {"hostname": socket.gethostname(), "pid": os.getpid(), "visible": len([p for p in os.listdir("/proc") if p.isdigit()]), "ns": {}}
for ns in ["pid", "ipc", "uts", "mnt", "net", "cgroup"]:
    try:
        out["ns"][ns] = os.readlink("/proc/self/ns/" + ns)
    except OSError as e:
        out["ns"][ns] = "?" + e.strerror
print(json.dumps(out))
`

func namespacesProbe(host map[string]string, hostname string) Probe {
	return Probe{
		Name: "own_namespaces", Protection: sandbox.ProtNamespaces, Essential: true, Language: "python", Code: namespacesCode,
		Evaluate: func(r engine.Result) (bool, string) {
			var out struct {
				Hostname     string
				PID, Visible int
				NS           map[string]string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var shared, own, unknown []string
			for _, ns := range namespaces {
				v := out.NS[ns]
				switch {
				case v == "" || strings.HasPrefix(v, "?") || host[ns] == "":
					unknown = append(unknown, ns)
				case v == host[ns]:
					shared = append(shared, ns)
				default:
					own = append(own, ns)
				}
			}
			pid, visible, name := out.PID, out.Visible, out.Hostname
			detail := fmt.Sprintf("own: %s; hostname %s; pid %d, %d processes visible", strings.Join(own, " "), name, pid, visible)
			if len(unknown) > 0 {
				detail += "; not visible: " + strings.Join(unknown, " ")
			}
			switch {
			case len(shared) > 0:
				return false, "shared with the host: " + strings.Join(shared, " ") + "; " + detail
			case pid == 0 || pid > 10 || visible > 5:
				return false, "not an own pid namespace: " + detail
			case hostname != "" && name == hostname:
				return false, "the host's hostname: " + detail
			}
			// gVisor shows its own synthetic namespaces; unreadable ones
			// cannot be shared with the host's, but say so.
			return len(own) > 0, detail
		},
		Fix: "give every sandbox its own pid, ipc, uts, mount, network and cgroup namespaces (linux.namespaces in config.json)",
	}
}

// maskedCode reads every path the sandbox masks (VISIBLE when it shows
// content) and writes the kernel settings /proc offers (WRITABLE).
const maskedCode = `
import os
for p in @PATHS@:
    if not os.path.lexists(p):
        print("absent", p)
    elif os.path.isdir(p):
        try:
            n = os.listdir(p)
        except OSError as e:
            n = []
        print("masked dir", p) if not n else print("VISIBLE dir", p, n[:5])
    else:
        try:
            with open(p, "rb") as f:
                data = f.read(4096)
        except OSError as e:
            data = b""
        print("masked file", p) if not data else print("VISIBLE file", p, len(data))
for p in ["/proc/sysrq-trigger", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname"]:
    try:
        with open(p, "w") as f:
            f.write("x")
        print("WRITABLE", p)
    except OSError as e:
        print("read-only", p, e.errno)
print("checked")
`

func maskedProbe() Probe {
	paths := sandbox.MaskedPaths()
	return Probe{
		Name: "masked_proc_and_sys", Protection: sandbox.ProtMasked, Language: "python",
		Code: strings.ReplaceAll(maskedCode, "@PATHS@", pyList(paths)),
		Evaluate: func(r engine.Result) (bool, string) {
			if err := finished(r, "checked\n"); err != nil {
				return false, err.Error()
			}
			if seen := markers(r, "VISIBLE", "WRITABLE"); len(seen) > 0 {
				return false, strings.Join(seen, "; ")
			}
			return true, fmt.Sprintf("%d host paths masked or absent (/proc/kcore, /proc/keys, /sys/firmware, …); %d kernel settings read-only",
				countLines(r, "masked ")+countLines(r, "absent "), countLines(r, "read-only "))
		},
		Fix: "mask them (OCI linux.maskedPaths; internal/engine/sandbox MaskedPaths)",
	}
}

// environmentCode dumps the environment (its own and pid 1's) and every
// file descriptor beyond stdio.
const environmentCode = `import json, os
proc = {}
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/1/cmdline"]:
    try:
        proc[p] = open(p, "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError as e:
        proc[p] = "unreadable: " + e.strerror
leaked = []
for fd in range(3, 4096):
    try:
        os.fstat(fd)
        leaked.append("%d -> %s" % (fd, os.readlink("/proc/self/fd/%d" % fd) if os.path.exists("/proc/self/fd/%d" % fd) else "?"))
    except OSError:
        pass
print(json.dumps({"env": dict(os.environ), "proc": proc, "fds": leaked}))
`

// envAllowed are the variables a sandbox gets (HOSTNAME from some runtimes).
var envAllowed = []string{"PATH", "HOME", "LANG", "PWD", "HOSTNAME", "NODE_OPTIONS"}

func environmentProbe(canaryName, canaryValue string) Probe {
	return Probe{
		Name: "no_host_env/python", Protection: sandbox.ProtEnv, Essential: true, Language: "python", Code: environmentCode,
		Evaluate: func(r engine.Result) (bool, string) {
			if LeaksCanary(r, canaryName, canaryValue) {
				return false, "the server's environment reached the sandbox (" + canaryName + ")"
			}
			var out struct {
				Env map[string]string
				FDs []string
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var names, unexpected []string
			for k := range out.Env {
				names = append(names, k)
				if !slices.Contains(envAllowed, k) {
					unexpected = append(unexpected, k)
				}
			}
			slices.Sort(names)
			slices.Sort(unexpected)
			detail := fmt.Sprintf("environment: %s; no descriptor beyond stdio", strings.Join(names, " "))
			switch {
			case len(unexpected) > 0:
				return false, "unexpected variables: " + strings.Join(unexpected, " ")
			case out.Env["HOME"] != "/tmp" || out.Env["LANG"] != "C.UTF-8" || out.Env["PWD"] != sandbox.WorkDir:
				return false, fmt.Sprintf("HOME %q, LANG %q, PWD %q; want /tmp, C.UTF-8, %s", out.Env["HOME"], out.Env["LANG"], out.Env["PWD"], sandbox.WorkDir)
			case len(out.FDs) > 0:
				return false, "file descriptors leaked in: " + strings.Join(out.FDs, ", ")
			}
			return true, detail
		},
		Fix: "start sandboxes with the fixed environment of internal/engine/sandbox (never the server's) and close every descriptor but stdio",
	}
}

// LeaksCanary says whether the planted variable's name or value shows in
// what the program printed.
func LeaksCanary(r engine.Result, name, value string) bool {
	out := r.Stdout + r.Stderr
	return (name != "" && strings.Contains(out, name)) || (value != "" && strings.Contains(out, value))
}
