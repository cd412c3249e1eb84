package probes

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// readonlyCode tries to write, make directories and change modes outside
// /tmp, /dev/shm and the working directory, and to change or replace the code file;
// it prints WRITABLE for every attempt that worked.
const readonlyCode = `
import os
for d in ["/", "/var/tmp", "/etc", "/usr", "/usr/bin", "/usr/local/bin", "/bin", "/dev", "/run",
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
for f in ["/etc/passwd", "@CODE@", "/usr/bin/python3", "/dev/null"]:
    try:
        os.chmod(f, 0o777)
        print("WRITABLE chmod", f)
    except OSError as e:
        pass
code = "@CODE@"
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
with open("@DIR@/ok", "w") as f:
    f.write("x")
os.mkdir("@DIR@/sub")
print("workdir writable", os.getcwd())
`

func readonlyProbe() Probe {
	py, _ := lang.Get("python")
	return Probe{
		Name: "readonly_everywhere_but_tmp_and_workdir", Protection: sandbox.ProtReadonly, Essential: true, Language: "python",
		Code: strings.NewReplacer("@CODE@", engine.CodeDir+"/"+py.File, "@DIR@", engine.CodeDir).Replace(readonlyCode),
		Evaluate: func(r engine.Result) (bool, string) {
			if err := finished(r, "workdir writable "+engine.CodeDir+"\n"); err != nil {
				return false, err.Error()
			}
			if w := markers(r, "WRITABLE"); len(w) > 0 {
				return false, "writable: " + strings.Join(w, "; ")
			}
			return true, fmt.Sprintf("%d places outside /tmp, /dev/shm and the working directory refused writes (/, /etc, /usr, /var/tmp, /dev, …); the code file, /etc/passwd and /dev/null refused changes",
				countLines(r, "read-only"))
		},
		Fix: "mount the root read-only (OCI root.readonly; docker --read-only) and give no writable mount but /tmp and the working directory",
	}
}

// writableCode copies a binary to each writable place and runs it
// directly and through env, then fills the place with 1 MB files until
// the filesystem says no.
const writableCode = `import json, os, shutil, subprocess
out = {}
for d in @DIRS@:
    e = os.path.join(d, "e")
    shutil.copy("/bin/echo", e)
    os.chmod(e, 0o755)
    o = {}
    for how, argv in [("direct", [e, "x"]), ("env", ["/usr/bin/env", e, "x"])]:
        try:
            r = subprocess.run(argv, capture_output=True)
            o[how] = "ran" if r.returncode == 0 else "refused (exit %d)" % r.returncode
        except OSError as err:
            o[how] = "denied (" + err.strerror + ")"
    n, errno, msg = 0, 0, ""
    try:
        for i in range(@FILL@):
            with open(os.path.join(d, "fill%d" % i), "wb") as f:
                f.write(b"\0" * 1000000)
            n += 1
    except OSError as err:
        errno, msg = err.errno, err.strerror
    o["bytes"], o["errno"], o["error"] = n * 1000000, errno, msg
    out[d] = o
print(json.dumps(out))
`

// writableDirs are the only writable places: /tmp, the working directory
// and /dev/shm (POSIX shared memory).
var writableDirs = []string{"/tmp", engine.CodeDir, "/dev/shm"}

// writableProbe checks the writable places: nothing written there runs,
// and each is bounded in size.
func writableProbe() Probe {
	sizes := map[string]int64{"/tmp": engine.DefaultTmpBytes, engine.CodeDir: engine.DefaultWorkdirBytes,
		"/dev/shm": sandbox.ShmBytes(engine.DefaultLimits(0))}
	dirs := writableDirs
	fill := int64(0)
	for _, n := range sizes {
		fill = max(fill, n/1_000_000+2) // MB files, past the largest size
	}
	return Probe{
		Name: "noexec_and_size_limit", Protection: "/tmp, /dev/shm and working directory: no exec, size-limited", Essential: true, Language: "python",
		Code: strings.NewReplacer("@DIRS@", pyList(dirs), "@FILL@", strconv.FormatInt(fill, 10)).Replace(writableCode),
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]struct {
				Direct, Env, Error string
				Bytes              int64
				Errno              int
			}
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			ok := true
			var details []string
			for _, d := range dirs {
				o, seen := out[d]
				if !seen {
					ok = false
					details = append(details, d+" not tried")
					continue
				}
				fill := fmt.Sprintf("filling stopped at %d MB (%s)", o.Bytes/1_000_000, o.Error)
				if o.Errno == 0 {
					fill = fmt.Sprintf("filling unbounded: wrote %d MB", o.Bytes/1_000_000)
				}
				details = append(details, fmt.Sprintf("%s: exec %s, through env %s; %s", d, o.Direct, o.Env, fill))
				// ENOSPC near the size: never more, and not far less (a
				// smaller limit would be another bug).
				ok = ok && o.Direct != "ran" && o.Env != "ran" && o.Errno == 28 && o.Bytes <= sizes[d] && o.Bytes >= sizes[d]/2
			}
			return ok, strings.Join(details, "; ")
		},
		Fix: "mount /tmp, /dev/shm and the working directory as tmpfs with noexec,nosuid,nodev and a size (internal/engine/sandbox TmpfsOptions and ShmOptions; 16 MiB for /tmp, engine.Limits.WorkdirBytes)",
	}
}

const tmpOptionsCode = `import json
out = {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[4] == "/tmp":
        out["options"] = f[5] + "," + line.split(" - ")[1].split()[2]
print(json.dumps(out))
`

// tmpOptionsProbe reads the /tmp mount options. Without capabilities
// nosuid and nodev change little (no setuid file or device node can be
// made), but a missing one is reported, not hidden.
func tmpOptionsProbe() Probe {
	return Probe{
		Name: "tmp_mount_options", Protection: "/tmp mount options noexec,nosuid,nodev", Language: "python", Code: tmpOptionsCode,
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
		Fix:       "mount /tmp with noexec,nosuid,nodev (internal/engine/sandbox TmpfsOptions)",
		FixGVisor: "gVisor (2022-12) does not show or keep nosuid/nodev on the /tmp tmpfs; with every capability dropped no setuid file or device node can be created there; see docs/SECURITY.md",
		GVisorGap: true,
	}
}

// loaders are the dynamic loaders' paths per GOARCH.
var loaders = map[string]string{"amd64": "/lib64/ld-linux-x86-64.so.2", "arm64": "/lib/ld-linux-aarch64.so.1"}

// retInstr is one "return" instruction per GOARCH: a file holding it is a
// function that does nothing, if it can be mapped and called.
var retInstr = map[string]string{"amd64": `b"\xc3"`, "arm64": `b"\xc0\x03\x5f\xd6"`}

// ldsoCode runs a binary written to each writable place through the
// dynamic loader, and maps a file holding one return instruction
// executable by hand (what the loader does) and calls it, in a child so a
// fault is seen as one. Under gVisor (2022-12) the mapping succeeds and
// the call faults, because the host kernel refuses the mapping beneath.
const ldsoCode = `import ctypes, json, os, shutil, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
def call_mapped(path):
    with open(path, "wb") as f:
        f.write(@RET@.ljust(4096, b"\0"))
    pid = os.fork()
    if pid == 0:
        fd = os.open(path, os.O_RDONLY)
        addr = libc.mmap(None, 4096, 5, 2, fd, 0)  # PROT_READ|PROT_EXEC, MAP_PRIVATE
        if addr is None or addr == ctypes.c_void_p(-1).value:
            os._exit(min(ctypes.get_errno(), 199))
        ctypes.CFUNCTYPE(None)(addr)()
        os._exit(200)
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        return "mapped, but calling it faulted (signal %d)" % os.WTERMSIG(st)
    code = os.WEXITSTATUS(st)
    return "executed" if code == 200 else "refused: " + os.strerror(code)
out = {}
for d in @DIRS@:
    e = os.path.join(d, "e")
    shutil.copy("/bin/echo", e)
    os.chmod(e, 0o755)
    try:
        r = subprocess.run([@LD@, e, "x"], capture_output=True)
        ldso = "ran" if r.returncode == 0 else "refused (exit %d): %s" % (r.returncode, r.stderr.decode(errors="replace").strip())
    except OSError as err:
        ldso = "refused: " + err.strerror
    out[d] = {"ldso": ldso, "mmap": call_mapped(os.path.join(d, "ret"))}
print(json.dumps(out))
`

func ldsoProbe(arch string) Probe {
	ld, _ := json.Marshal(loaders[arch])
	dirs := writableDirs
	p := Probe{
		Name: "noexec_loader_and_mmap", Protection: "noexec also through ld.so and mmap", Language: "python",
		Code: strings.NewReplacer("@LD@", string(ld), "@RET@", retInstr[arch], "@DIRS@", pyList(dirs)).Replace(ldsoCode),
		Evaluate: func(r engine.Result) (bool, string) {
			var out map[string]struct{ Ldso, Mmap string }
			if err := decodeJSON(r, &out); err != nil {
				return false, err.Error()
			}
			var gaps []string
			for _, d := range dirs {
				o, seen := out[d]
				switch {
				case !seen:
					gaps = append(gaps, d+" not tried")
				case o.Ldso == "ran":
					gaps = append(gaps, "ld.so ran a binary written to "+d)
				case o.Mmap == "executed":
					gaps = append(gaps, "code written to "+d+" ran from an executable mapping")
				}
			}
			if len(gaps) > 0 {
				return false, strings.Join(gaps, "; ")
			}
			t := out["/tmp"]
			return true, "ld.so /tmp/program " + OneLine(t.Ldso, 80) + "; mmap(PROT_EXEC) " + OneLine(t.Mmap, 60) + "; the same in " + engine.CodeDir + " and /dev/shm"
		},
		Fix:       "the kernel refuses executable mappings from noexec mounts; check that /tmp and the working directory are mounted noexec",
		FixGVisor: "runsc (2022-12)'s own tmpfs lets ld.so and mmap(PROT_EXEC) map a file from a noexec mount: the drivers give it a host tmpfs instead (docs/SECURITY.md, per-runtime gaps); check that /tmp and the working directory are host mounts",
	}
	if loaders[arch] == "" || retInstr[arch] == "" {
		p.Skip = "the dynamic loader's path and machine code are only known for amd64 and arm64"
	}
	return p
}
