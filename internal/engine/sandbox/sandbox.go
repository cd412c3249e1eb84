// Package sandbox is the toolkit every driver builds one sandbox with: the
// hardening policy it applies to every execution (who the code runs as,
// what it sees of the host, which system calls it may make, and how its
// scratch space and resources are bounded), the one execution loop that
// drives the sandbox's program (Process, Supervise, CappedBuffer,
// Classify), the working directory the host fills and collects from
// (MountWorkdir, PlaceFiles, CollectFiles), and the cgroup it is bounded
// and measured by. The drivers (internal/engine/oci and
// internal/engine/docker) only translate it for their runtime.
//
// The policy is plain data so that the oci driver (an OCI runtime-spec
// config.json) and the docker driver (Engine API host config) enforce the
// same thing; a change here changes both. Nothing in the policy is taken
// from the server's own environment.
package sandbox

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// UID and GID are the conventional "nobody", which owns nothing in the
// image and nothing on the host: the image names it, and a container that
// is created but never started (the docker driver's image probe) runs as
// it. User code never does: every sandbox runs as a host uid (and gid) of
// its own, leased from package uidpool for the sandbox's lifetime, because
// the kernel counts per-user limits (inotify instances, message queues,
// processes) per host uid, across sandboxes.
const (
	UID = 65534
	GID = 65534
)

// Hostname is the sandbox's host name; the real one is not revealed.
const Hostname = "sandbox"

// WorkDir is the working directory of user code (engine.CodeDir): its
// own tmpfs, with the code file and the request's files. /tmp is the
// other writable place, and HOME.
const WorkDir = engine.CodeDir

// Env is the complete environment of user code. It is fixed, never derived
// from the server's environment, so secrets (API keys, database URLs) in the
// server's environment cannot reach the sandbox. PWD names the working
// directory for every runtime: bwrap sets it so (after its options, so it
// cannot be unset there), and the others now match without an extra
// env(1) exec per execution under bwrap.
func Env() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/tmp",
		"LANG=C.UTF-8",
		"PWD=" + WorkDir,
	}
}

// EnvFor is the environment of user code under limits l: Env, plus the
// V8 heap sizing Node.js would derive from the memory limit if it could see
// it. What a sandbox sees of its memory differs by driver and runtime (the
// host's RAM through /proc/meminfo under crun, runc and oci+runsc; the
// cgroup limit under docker+runc and docker+runsc), and Node sizes every
// isolate's heap, each worker thread's too, from what it sees: 4 GiB heaps
// under a 512 MiB limit on one driver, 256 MiB on another, so the same
// program ended differently. The numbers are V8's own defaults for a
// machine of l.MemoryBytes (old space half of it, semi-space 1/512 of it,
// 1 to 16 MiB), so every driver now behaves as Node does on docker+runc.
func EnvFor(l engine.Limits) []string {
	mib := l.MemoryBytes >> 20
	semi := min(max(mib/512, 1), 16)
	return append(Env(), fmt.Sprintf("NODE_OPTIONS=--max-old-space-size=%d --max-semi-space-size=%d", max(mib/2, 16), semi))
}

// LiveEnvFor is the environment of a live sandbox's agent, and so the
// base of its commands': EnvFor with HOME and PWD at engine.HomeDir. The
// sandbox's own entries are set later through the agent, which keeps
// these names.
func LiveEnvFor(l engine.Limits) []string {
	env := EnvFor(l)
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "HOME", "PWD":
			env[i] = name + "=" + engine.HomeDir
		}
	}
	return env
}

// DeadlineArgv is argv run under coreutils timeout(1), so that the
// sandbox kills itself at lifetime (rounded up to whole seconds) whatever
// happens to the server: timeout sends SIGKILL to the program's process
// group and dies with it, the sandbox's init (tini) then exits with its
// only child, and the kernel kills everything left in the pid namespace
// (setsid and double-forked processes too). Exit statuses and signals
// pass through timeout unchanged. timeout is the image's own (every
// Debian-based image has coreutils); the program can kill it, and so
// itself, but cannot outlive it. A zero lifetime leaves argv alone.
func DeadlineArgv(timeout string, lifetime time.Duration, argv []string) []string {
	if lifetime <= 0 {
		return argv
	}
	secs := int64((lifetime + time.Second - 1) / time.Second)
	return append([]string{timeout, "-s", "KILL", strconv.FormatInt(secs, 10)}, argv...)
}

// Pids is the process limit to enforce for l: l.Pids for the program,
// plus the deadline's timeout process (DeadlineArgv) when there is one,
// so the program may still have exactly l.Pids processes and threads.
func Pids(l engine.Limits) int64 {
	if l.Lifetime > 0 {
		return l.Pids + 1
	}
	return l.Pids
}

// UserEnv is a request's environment as NAME=value entries, sorted by
// name, to follow EnvFor; the names were validated by the caller, and a
// name that EnvFor sets is left out so the sandbox's own settings stand.
func UserEnv(env map[string]string) []string {
	if len(env) == 0 {
		return nil
	}
	fixed := map[string]bool{}
	for _, kv := range EnvFor(engine.Limits{}) {
		name, _, _ := strings.Cut(kv, "=")
		fixed[name] = true
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		if !fixed[k] {
			out = append(out, k+"="+v)
		}
	}
	slices.Sort(out)
	return out
}

// SpecEnv is what spec adds to the fixed environment (EnvFor), for
// UserEnv: its Env and, with an EgressDir, engine.ProxyEnv over it, as a
// live sandbox's commands get it (the proxy is the platform's: a request
// does not point the sandbox elsewhere). Without an EgressDir it is
// spec.Env itself.
func SpecEnv(spec engine.Spec) map[string]string {
	if spec.EgressDir == "" {
		return spec.Env
	}
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, engine.ProxyEnv())
	return env
}

// MaskedPaths are hidden from user code (bind-mounted over with an empty
// file or directory): they leak host kernel state or addresses.
func MaskedPaths() []string {
	return []string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/interrupts",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/sched_debug",
		"/proc/scsi",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/sys/devices/virtual/powercap",
		"/sys/firmware",
	}
}

// ReadonlyPaths are visible but read-only: writing them would change host
// kernel settings if anything else failed.
func ReadonlyPaths() []string {
	return []string{
		"/proc/bus",
		"/proc/fs",
		"/proc/irq",
		"/proc/sys",
		"/proc/sysrq-trigger",
	}
}

// TmpfsOptions are the mount options of /tmp, the only writable place:
// bounded in size, and nothing written there can be executed (noexec) or
// gain privileges (nosuid, nodev).
func TmpfsOptions(l engine.Limits) []string {
	return []string{"rw", "noexec", "nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(l.TmpBytes, 10)}
}

// ShmBytes is the size of a sandbox's own /dev/shm: a quarter of its
// memory limit, at most 64 MiB. POSIX shared memory and semaphores live
// there (Python's multiprocessing locks and queues need it). Like /tmp it
// is a tmpfs, whose pages count against the memory limit of the sandbox
// that writes them.
func ShmBytes(l engine.Limits) int64 {
	return min(64<<20, l.MemoryBytes/4)
}

// ShmOptions are the mount options of /dev/shm: /tmp's, with its own size.
func ShmOptions(l engine.Limits) []string {
	return []string{"rw", "noexec", "nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(ShmBytes(l), 10)}
}

// Rlimit is one POSIX resource limit, soft = hard.
type Rlimit struct {
	Type  string // e.g. "RLIMIT_FSIZE"
	Value uint64
}

// Rlimits are the per-process limits of user code. Processes, memory and CPU
// are bounded by the sandbox's cgroup instead: a per-process or per-uid
// rlimit would be shared by every sandbox running as UID.
func Rlimits(l engine.Limits) []Rlimit {
	return []Rlimit{
		{Type: "RLIMIT_FSIZE", Value: uint64(l.FileSizeBytes)},
		{Type: "RLIMIT_CORE", Value: 0},
		{Type: "RLIMIT_NOFILE", Value: 1024},
	}
}

// Namespaces are the Linux namespaces every sandbox gets of its own. The
// network namespace has only a loopback interface.
func Namespaces() []string {
	return []string{"pid", "ipc", "uts", "mount", "network", "cgroup"}
}

// MemorySwapBytes is the memory+swap limit: equal to the memory limit, so
// no swap can be used.
func MemorySwapBytes(l engine.Limits) int64 { return l.MemoryBytes }

// CPUQuota returns a CFS quota for a period of 100 ms that grants l.CPUs.
func CPUQuota(l engine.Limits) (quota int64, period uint64) {
	period = 100_000
	return int64(l.CPUs * float64(period)), period
}

// Protection is one item of the hardening policy as a driver enforces it,
// for `vertal doctor` and the security documentation.
type Protection struct {
	Name     string // e.g. "network: loopback only"
	Enforced bool
	// How says what enforces it on this driver/runtime, or why it is not.
	How string
	// Fix says what an operator can do when Enforced is false.
	Fix string
}

// Protection names shared by every driver so their tables line up.
const (
	ProtNetwork    = "no network (own netns, loopback only)"
	ProtReadonly   = "read-only root filesystem"
	ProtTmp        = "/tmp tmpfs, size-limited, noexec,nosuid,nodev"
	ProtUser       = "own uid/gid per sandbox, not root"
	ProtCaps       = "all capabilities dropped"
	ProtNoNewPrivs = "no-new-privileges"
	ProtSeccomp    = "seccomp profile (ours)"
	ProtNamespaces = "own pid, ipc, uts, mount, cgroup namespaces"
	ProtMasked     = "masked /proc paths, no /sys/firmware"
	ProtEnv        = "no host environment or file descriptors"
	ProtMemory     = "memory limit, no swap"
	ProtCPU        = "CPU quota"
	ProtPids       = "process limit"
	ProtFileSize   = "file size limit"
	ProtTimeout    = "timeout kills every process"
	ProtInit       = "init as pid 1 (signals, zombies)"
	ProtKernelIsol = "user-space kernel (gVisor)"
	ProtCleanup    = "nothing left behind (reaped after a crash)"
)

// String renders p as one line of a doctor table.
func (p Protection) String() string {
	state := "enforced"
	if !p.Enforced {
		state = "NOT enforced"
	}
	s := fmt.Sprintf("%-46s %-12s %s", p.Name, state, p.How)
	if !p.Enforced && p.Fix != "" {
		s += " (fix: " + p.Fix + ")"
	}
	return s
}
