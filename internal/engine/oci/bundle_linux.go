package oci

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// initPath is where the init binary appears in the sandbox. /dev is a tmpfs
// the runtime creates, so the mount point never touches the shared image.
const initPath = "/dev/init"

// timeoutPath is coreutils timeout(1) in the image, the sandbox's own
// deadline (sandbox.DeadlineArgv).
const timeoutPath = "/usr/bin/timeout"

// idPlaceholder marks where the execution id goes in a config template.
const idPlaceholder = "@@VERTAL_EXECUTION_ID@@"

// uidPlaceholder stands for the sandbox's own uid (and gid) in a config
// template: no uidpool range reaches it.
const uidPlaceholder = 4_000_000_007

// templateKey identifies everything config.json depends on except the id.
// agent is the driver's copy of the agent of a one-shot sandbox with
// egress (withEgress), "" for every other.
type templateKey struct {
	image, file, command string
	limits               engine.Limits
	agent                string
}

// template is config.json split around the execution id and the
// sandbox's uid, so an execution costs a concatenation instead of building
// and encoding a spec.
type template struct {
	parts [][]byte // len(holes)+1 pieces of JSON
	holes []byte   // 'i' the execution id, 'u' the uid
}

// userJSON is how encoding/json writes process.user with uid = gid = u.
func userJSON(u uint32) string { return fmt.Sprintf(`"user":{"uid":%d,"gid":%d}`, u, u) }

// newTemplate splits an encoded spec built with idPlaceholder and
// uidPlaceholder; each must appear exactly once.
func newTemplate(b []byte) (*template, error) {
	t := &template{}
	user := userJSON(uidPlaceholder)
	for {
		i, u := bytes.Index(b, []byte(idPlaceholder)), bytes.Index(b, []byte(user))
		switch {
		case i < 0 && u < 0:
			t.parts = append(t.parts, b)
			if string(t.holes) != "iu" && string(t.holes) != "ui" {
				return nil, fmt.Errorf("config template: execution id and user must appear exactly once")
			}
			return t, nil
		case u < 0 || i >= 0 && i < u:
			t.parts, t.holes, b = append(t.parts, b[:i]), append(t.holes, 'i'), b[i+len(idPlaceholder):]
		default:
			t.parts, t.holes, b = append(t.parts, b[:u]), append(t.holes, 'u'), b[u+len(user):]
		}
	}
}

func (t *template) render(id string, uid uint32) []byte {
	user := userJSON(uid)
	n := len(id) + len(user)
	for _, p := range t.parts {
		n += len(p)
	}
	b := make([]byte, 0, n)
	for i, h := range t.holes {
		b = append(b, t.parts[i]...)
		if h == 'i' {
			b = append(b, id...)
		} else {
			b = append(b, user...)
		}
	}
	return append(b, t.parts[len(t.parts)-1]...)
}

// template returns the cached config template for a language and limits.
func (d *Driver) template(lang engine.Language, l engine.Limits) (*template, error) {
	return cachedFromSpec(d, d.templates, lang, l, "", func(spec *specs.Spec) (*template, error) {
		b, err := json.Marshal(spec)
		if err != nil {
			return nil, fmt.Errorf("encoding config.json: %w", err)
		}
		return newTemplate(b)
	})
}

// cachedFromSpec returns what build made of the spec for a language and
// limits (with the id placeholder), and with egress through agent unless
// it is "" (withEgress), building it once per key. The cache is bounded:
// languages × plans (× agent binaries) is small.
func cachedFromSpec[T any](d *Driver, cache map[templateKey]T, lang engine.Language, l engine.Limits, agent string, build func(*specs.Spec) (T, error)) (T, error) {
	key := templateKey{image: lang.Image, file: lang.File, command: strings.Join(lang.Command, "\x00"), limits: l, agent: agent}
	d.mu.Lock()
	v, ok := cache[key]
	d.mu.Unlock()
	if ok {
		return v, nil
	}
	spec, err := d.spec(lang, l, idPlaceholder)
	if err != nil {
		return v, err
	}
	if agent != "" {
		d.withEgress(spec, lang, l, agent)
	}
	if v, err = build(spec); err != nil {
		return v, err
	}
	d.mu.Lock()
	if len(cache) > 256 {
		clear(cache)
	}
	cache[key] = v
	d.mu.Unlock()
	return v, nil
}

// spec builds the OCI runtime spec of one execution. Paths of bind mount
// sources are relative to the bundle directory, so only the cgroup path
// names the execution.
func (d *Driver) spec(lang engine.Language, l engine.Limits, id string) (*specs.Spec, error) {
	if len(lang.Command) == 0 || lang.File == "" || strings.Contains(lang.File, "/") {
		return nil, fmt.Errorf("language %q: needs a command and a plain file name", lang.Name)
	}
	args := sandbox.DeadlineArgv(timeoutPath, l.Lifetime, lang.Argv())
	if !d.rt.bwrap {
		// bwrap's own pid 1 reaps zombies and passes the exit status on
		// (128+signal), which is tini's job under the OCI runtimes.
		args = append([]string{initPath, "--"}, args...)
	}

	var rlimits []specs.POSIXRlimit
	for _, r := range sandbox.Rlimits(l) {
		rlimits = append(rlimits, specs.POSIXRlimit{Type: r.Type, Hard: r.Value, Soft: r.Value})
	}
	if d.rt.gvisor {
		// gVisor counts RLIMIT_NPROC per user of its own kernel, i.e. per
		// sandbox: it is the process limit there (see pidsLimit).
		rlimits = append(rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(sandbox.Pids(l)), Soft: uint64(sandbox.Pids(l))})
	}
	tmp := specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: sandbox.TmpfsOptions(l)}
	shm := specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: sandbox.ShmOptions(l)}
	if d.rt.gvisor || d.rt.bwrap {
		// gVisor's in-sandbox tmpfs lets the dynamic loader map files
		// from a noexec mount; a host tmpfs served by the gofer does not
		// (the host kernel refuses the executable mapping). bwrap's
		// --tmpfs has no noexec at all. The driver mounts them at
		// <bundle>/tmp and <bundle>/shm with the same options
		// (hostTmpfs).
		tmp = specs.Mount{Destination: "/tmp", Type: "bind", Source: "tmp", Options: []string{"rbind", "rw", "noexec", "nosuid", "nodev"}}
		shm = specs.Mount{Destination: "/dev/shm", Type: "bind", Source: "shm", Options: []string{"rbind", "rw", "noexec", "nosuid", "nodev"}}
	}
	var namespaces []specs.LinuxNamespace
	for _, ns := range sandbox.Namespaces() {
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.LinuxNamespaceType(ns)})
	}
	oomScore := engine.SandboxOOMScore // under host memory pressure, sandboxes go first
	s := &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			Args: args,
			Env:  sandbox.EnvFor(l),
			Cwd:  sandbox.WorkDir,
			// Each sandbox runs as a host uid of its own (uidpool): no
			// per-user kernel limit is shared between executions.
			User: specs.User{UID: uidPlaceholder, GID: uidPlaceholder},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{},
			},
			Rlimits:         rlimits,
			NoNewPrivileges: true,
			OOMScoreAdj:     &oomScore,
		},
		Root:     &specs.Root{Path: lang.Image, Readonly: true},
		Hostname: sandbox.Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=65536k"}},
			// The sandbox's own /dev/shm, in its IPC namespace's place.
			shm,
			tmp,
			// The working directory: a host tmpfs (sandbox.MountWorkdir)
			// with the code file and the request's files.
			{Destination: engine.CodeDir, Type: "bind", Source: "code", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: d.cg.runtimePath(id),
			// Limits live on the parent cgroup the driver creates; the
			// runtime only confines the sandbox's devices.
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Namespaces:    namespaces,
			MaskedPaths:   sandbox.MaskedPaths(),
			ReadonlyPaths: sandbox.ReadonlyPaths(),
			Seccomp:       sandbox.Seccomp(d.rt.name),
		},
	}
	if !d.rt.bwrap {
		init := specs.Mount{Destination: initPath, Type: "bind", Source: d.initPath, Options: []string{"bind", "ro", "nosuid", "nodev"}}
		s.Mounts = slices.Insert(s.Mounts, 3, init)
	}
	return s, nil
}

// cgLimitsFor derives the parent cgroup's limits. Under runsc the host sees
// gVisor's own threads (about 25 idle, and several per guest process on the
// ptrace platform), so its pids.max is only a backstop against runaway
// growth; the guest's process count is bounded by RLIMIT_NPROC inside.
func (d *Driver) cgLimitsFor(l engine.Limits) cgLimits {
	quota, period := sandbox.CPUQuota(l)
	c := cgLimits{memory: sandbox.MemorySwapBytes(l), cpuQuota: quota, cpuPeriod: period, pids: sandbox.Pids(l)}
	if d.rt.gvisor {
		c.pids = sandbox.Pids(l)*8 + 128
	}
	if d.rt.bwrap {
		// bwrap's monitor outside the pid namespace is in the cgroup
		// too, where crun's parent is not; its pid 1 stands for tini.
		c.pids++
	}
	return c
}

// ociVersion is the runtime-spec version config.json declares: the oldest
// our runtimes accept (crun 1.8 rejects newer ones it does not know).
const ociVersion = "1.0.2"
