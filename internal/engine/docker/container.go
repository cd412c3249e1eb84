package docker

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// containerConfig turns one execution into the container Docker creates.
// Every hardening item of the sandbox policy is set here, in one place, so
// the unit test can hold the whole list against the policy.
//
// uid is the sandbox's own host uid (and gid), leased from the uidpool:
// no per-user kernel limit is shared with another sandbox.
func (d *Driver) containerConfig(spec engine.Spec, codeDir string, pid int, uid uint32) (*container.Config, *container.HostConfig) {
	lim := spec.Limits
	cfg, host := d.walls(spec.ID, spec.Language.Image, lim, pid, uid)
	argv := command(spec.Language)
	if spec.EgressDir != "" {
		argv = engine.RelayArgv(argv)
	}
	cfg.Cmd = sandbox.DeadlineArgv("timeout", lim.Lifetime, append(argv, spec.Args...))
	cfg.Env = append(sandbox.EnvFor(lim), sandbox.UserEnv(sandbox.SpecEnv(spec))...)
	cfg.WorkingDir = d.policy.WorkDir
	// The working directory: a host tmpfs (sandbox.MountWorkdir, whose
	// noexec, nosuid and nodev the bind mount keeps) with the code file
	// and the request's files.
	host.Mounts = append([]mount.Mount{{
		Type:   mount.TypeBind,
		Source: codeDir,
		Target: engine.CodeDir,
	}}, host.Mounts...)
	if spec.EgressDir != "" {
		// The state directory's binds (Run, bindInto): the egress
		// directory read-only, nosuid, nodev and noexec, the agent
		// read-only, nosuid and nodev (see egress.go).
		host.Mounts = append(host.Mounts,
			d.stateBind(spec.ID, agentSource, engine.AgentPath),
			d.stateBind(spec.ID, egressSource, engine.EgressDir))
	}
	return cfg, host
}

// walls is every container's hardening, an execution's or a live
// sandbox's (live.go): what they share apart from the command, the
// environment, the working directory and the mounts of their own. id
// names the container's labels and parent cgroup; an empty img is the
// driver's image.
func (d *Driver) walls(id, img string, lim engine.Limits, pid int, uid uint32) (*container.Config, *container.HostConfig) {
	if img == "" {
		img = d.opts.Image
	}

	cfg := &container.Config{
		Image:      img,
		Entrypoint: []string{}, // an image's entrypoint is not ours to run
		User:       fmt.Sprintf("%d:%d", uid, uid),
		Hostname:   d.policy.Hostname,
		// Stdin is always a pipe, closed after spec.Stdin is written (so a
		// read never hangs). Without one, runsc (2022-12) hands the sandbox
		// the host's /dev/null and chowns it to the sandbox user.
		AttachStdin:  true,
		OpenStdin:    true,
		StdinOnce:    true,
		AttachStdout: true,
		AttachStderr: true,
		Labels: map[string]string{
			labelSandbox:   "1",
			labelInstance:  d.instance,
			labelOwner:     d.lockPath(),
			labelExecution: id,
			labelPID:       strconv.Itoa(pid),
		},
	}

	pids, extraUlimits := pidsLimits(lim, d.gvisor)
	init := true
	oomScore := engine.SandboxOOMScore // under host memory pressure, sandboxes go first
	host := &container.HostConfig{
		Runtime: d.opts.Runtime,
		// Docker's tini as pid 1: user code gets ordinary signal handling
		// (a process may be killed, even by itself) and zombies are reaped.
		Init:           &init,
		NetworkMode:    "none",                // own network namespace, loopback only
		IpcMode:        container.IPCModeNone, // own IPC namespace; /dev/shm is ours (below)
		PidMode:        "",                    // own PID namespace
		UTSMode:        "",                    // own UTS namespace
		CgroupnsMode:   container.CgroupnsModePrivate,
		ReadonlyRootfs: true,
		OomScoreAdj:    oomScore,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    d.policy.securityOpt(),
		MaskedPaths:    slices.Clone(d.policy.MaskedPaths),
		ReadonlyPaths:  slices.Clone(d.policy.ReadonlyPaths),
		// Output is read through attach; Docker's default json-file log
		// would write every flooded byte to the host's disk a second time.
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     lim.MemoryBytes,
			MemorySwap: lim.MemoryBytes, // equal to Memory: no swap
			NanoCPUs:   int64(lim.CPUs * 1e9),
			PidsLimit:  &pids,
			Ulimits:    append(ulimits(lim), extraUlimits...),
		},
	}
	d.addTmpfs(cfg, host, "/tmp", tmpfs(lim))
	d.addTmpfs(cfg, host, "/dev/shm", shm(lim))
	if d.acct != nil {
		host.CgroupParent = d.acct.parent(d.instance, id)
		if !d.acct.v2 {
			// The parent holds the limit itself (accounting.limitParent).
			host.Resources.Memory += oomMargin
			host.Resources.MemorySwap += oomMargin
		}
	}
	return cfg, host
}

// addTmpfs mounts a tmpfs with options o (Docker's "options" string) at
// target.
func (d *Driver) addTmpfs(cfg *container.Config, host *container.HostConfig, target, o string) {
	if !d.gvisor {
		if host.Tmpfs == nil {
			host.Tmpfs = map[string]string{}
		}
		host.Tmpfs[target] = o
		return
	}
	// gVisor's own tmpfs (what a Docker tmpfs becomes under runsc)
	// ignores noexec for executable mappings, so the dynamic loader can
	// run a binary written to /tmp. A host tmpfs served through the gofer
	// cannot be mapped executable: the host kernel refuses. An anonymous
	// local volume of type tmpfs is exactly that, made and removed by
	// Docker with the container.
	host.Mounts = append(host.Mounts, mount.Mount{
		Type:   mount.TypeVolume,
		Target: target,
		VolumeOptions: &mount.VolumeOptions{
			Labels: cfg.Labels,
			DriverConfig: &mount.Driver{Name: "local", Options: map[string]string{
				"type": "tmpfs", "device": "tmpfs", "o": o,
			}},
		},
	})
}

// command is the language's command line, ending with the code file. The
// code file is appended unless the configured command already ends with it.
func command(l engine.Language) []string { return l.Argv() }
