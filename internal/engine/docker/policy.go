package docker

import (
	"fmt"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// policy is the shared sandbox policy (internal/engine/sandbox) in Docker's terms,
// computed once per driver.
type policy struct {
	WorkDir       string
	Hostname      string
	MaskedPaths   []string
	ReadonlyPaths []string
	Seccomp       string // Docker seccomp profile JSON
}

// newPolicy renders the shared policy for the Docker runtime rt ("runc",
// "runsc"): the seccomp profile differs slightly for gVisor.
func newPolicy(rt string) (policy, error) {
	// The shared profile already allows for gVisor's answering every
	// refusal with EPERM (runsc --oci-seccomp ignores errnoRet).
	profile, err := sandbox.SeccompDockerJSON(rt)
	if err != nil {
		return policy{}, fmt.Errorf("seccomp profile: %w", err)
	}
	return policy{
		WorkDir:       sandbox.WorkDir,
		Hostname:      sandbox.Hostname,
		MaskedPaths:   sandbox.MaskedPaths(),
		ReadonlyPaths: sandbox.ReadonlyPaths(),
		Seccomp:       string(profile),
	}, nil
}

func (p policy) securityOpt() []string {
	return []string{"no-new-privileges", "seccomp=" + p.Seccomp}
}

// tmpfs is the /tmp mount in Docker's "options" string form.
func tmpfs(l engine.Limits) string {
	return strings.Join(sandbox.TmpfsOptions(l), ",")
}

// shm is the /dev/shm mount in Docker's "options" string form.
func shm(l engine.Limits) string {
	return strings.Join(sandbox.ShmOptions(l), ",")
}

// ulimits turns the policy's rlimits into Docker's names ("RLIMIT_FSIZE"
// is "fsize"). Docker sets no RLIMIT_FSIZE of its own, so this is the only
// file size limit.
func ulimits(l engine.Limits) []*container.Ulimit {
	rl := sandbox.Rlimits(l)
	out := make([]*container.Ulimit, 0, len(rl))
	for _, r := range rl {
		name := strings.ToLower(strings.TrimPrefix(r.Type, "RLIMIT_"))
		out = append(out, &container.Ulimit{Name: name, Soft: int64(r.Value), Hard: int64(r.Value)})
	}
	return out
}

// gvisorThreadsPerTask bounds the host threads gVisor (ptrace platform) may
// use per guest task; see pidsLimits.
const gvisorThreadsPerTask = 16

// pidsLimits returns the cgroup pids limit and any extra ulimit for l.Pids.
//
// With runc the cgroup counts the sandbox's own processes and threads: it
// is the limit. With gVisor the cgroup holds the sentry, whose host thread
// count has nothing to do with the guest's (about 40 idle; with the
// ptrace platform a stub thread per guest address space and sentry
// thread, growing to several hundred under a fork bomb), and runsc
// 2022-12 dies outright when the cgroup refuses it a thread. So the guest
// limit is RLIMIT_NPROC, which gVisor enforces per user in its own kernel:
// one sandbox, one count, fork() fails with EAGAIN as under runc. The
// cgroup keeps a generous backstop for the sentry's threads.
func pidsLimits(l engine.Limits, gvisor bool) (cgroupPids int64, extra []*container.Ulimit) {
	n := sandbox.Pids(l) // the program's, plus the deadline's timeout process
	if !gvisor {
		return n, nil
	}
	return n * gvisorThreadsPerTask, []*container.Ulimit{{Name: "nproc", Soft: n, Hard: n}}
}

// Enforced reports which protections this driver enforces with its
// runtime, and how, for `vertal doctor` and the security documentation.
func (d *Driver) Enforced() []sandbox.Protection { return enforced(d.gvisor) }

func enforced(gvisor bool) []sandbox.Protection {
	yes := func(name, how string) sandbox.Protection {
		return sandbox.Protection{Name: name, Enforced: true, How: how}
	}
	ps := []sandbox.Protection{
		yes(sandbox.ProtNetwork, "NetworkMode none: own network namespace with lo only"),
		yes(sandbox.ProtReadonly, "ReadonlyRootfs; code bind-mounted read-only"),
		yes(sandbox.ProtTmp, "Docker tmpfs at /tmp with size, noexec, nosuid, nodev"),
		yes(sandbox.ProtUser, "User: a host uid:gid leased per sandbox (uidpool)"),
		yes(sandbox.ProtCaps, "CapDrop ALL"),
		yes(sandbox.ProtNoNewPrivs, "security-opt no-new-privileges"),
		yes(sandbox.ProtSeccomp, "security-opt seccomp=<our profile>, ENOSYS default"),
		yes(sandbox.ProtNamespaces, "own pid, uts, mount; IpcMode none; CgroupnsMode private"),
		yes(sandbox.ProtMasked, "HostConfig.MaskedPaths and ReadonlyPaths from the shared policy"),
		yes(sandbox.ProtEnv, "fixed Env; Docker passes no host descriptors"),
		yes(sandbox.ProtMemory, "Memory = MemorySwap (cgroup), OOM kill reported by the engine"),
		yes(sandbox.ProtCPU, "NanoCPUs (CFS quota)"),
		yes(sandbox.ProtPids, "PidsLimit (cgroup pids.max)"),
		yes(sandbox.ProtFileSize, "Ulimits fsize"),
		yes(sandbox.ProtTimeout, "force-remove kills every process of the container"),
		yes(sandbox.ProtInit, "Init: Docker's tini as pid 1"),
		yes(sandbox.ProtCleanup, "container, code directory and cgroup removed; Reap after a crash (labels + instance locks)"),
		{Name: sandbox.ProtKernelIsol, Enforced: false, How: "host kernel shared (namespaces, seccomp)", Fix: "--runtime runsc"},
	}
	if gvisor {
		ps = sandbox.Overlay(ps, map[string]string{
			sandbox.ProtKernelIsol: "runsc, ptrace platform, --network=none",
			sandbox.ProtTmp:        "host tmpfs (anonymous local volume) served by the gofer: gVisor's own tmpfs ignores noexec for mmap",
			sandbox.ProtSeccomp:    "applied inside gVisor (runsc --oci-seccomp); refusals are EPERM, never ENOSYS",
			sandbox.ProtPids:       "RLIMIT_NPROC inside gVisor (per sandbox kernel); cgroup pids.max bounds the sentry's threads",
			sandbox.ProtMemory:     "cgroup limit on the whole gVisor sandbox: over it the sandbox is killed, not one process",
			sandbox.ProtMasked:     "gVisor's synthetic /proc and /sys; masked paths from the shared policy",
			sandbox.ProtNetwork:    "NetworkMode none and runsc --network=none: gVisor's stack has lo only",
		})
	}
	return ps
}
