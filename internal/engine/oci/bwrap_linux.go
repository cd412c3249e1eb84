package oci

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The bwrap runtime enforces the OCI spec the driver builds for every
// runtime (Driver.spec): bwrapPlanFor translates it into bubblewrap's
// arguments and into what the driver does itself while bwrap waits
// (bwrapProcess.Start). Whatever in the spec has no translation is an
// error, never dropped.
//
// bwrap runs as the sandbox's leased host uid and gid, never as root: an
// unprivileged bwrap makes a user namespace whose only mapped uid is the
// spec's (uid_map "U U 1", written by the driver), so the sandbox holds no
// privilege on the host, whatever it does inside.

// File descriptors bwrap gets (exec.Cmd.ExtraFiles, from 3).
//
// One pipe is both --userns-block-fd and --seccomp: bwrap's parent reads
// one byte from it as the go-ahead, and the sandbox's pid 1 later reads
// the rest, the compiled filter, and closes it. bwrap closes --info-fd,
// --json-status-fd and --seccomp in the sandbox but not
// --userns-block-fd, which the program would otherwise inherit.
const (
	bwrapInfoFD    = 3 // --info-fd: {"child-pid": N}, the sandbox's pid 1
	bwrapSeccompFD = 4 // --userns-block-fd and --seccomp (see above)
	bwrapStatusFD  = 5 // --json-status-fd: {"exit-code": N} once the command ran
	bwrapArgsFD    = 6 // --args: the request's env and args (bwrapPlan.inner), when it has any
)

// bwrapPlan is one spec as a bwrap invocation.
type bwrapPlan struct {
	// args are bwrap's options; the command follows "--".
	args    []string
	command []string
	// env is bwrap's own environment: the spec's fixed one only.
	env []string
	// inner holds bwrap options read from bwrapArgsFD (NUL-separated),
	// never from its command line or environment: --setenv for the
	// request's env and args (see render).
	inner []byte
	// uid and gid run bwrap and are the sandbox's, inside and out.
	uid, gid uint32
	// rlimits are set on the sandbox's pid 1 before it goes on.
	rlimits []bwrapRlimit
	// oomScoreAdj is written for bwrap's processes before it goes on.
	oomScoreAdj *int
	// checks are bind sources (host paths) and the mount flags they must
	// have: bwrap keeps a source's flags, and the kernel locks them in
	// the sandbox's user namespace.
	checks []mountCheck
	// seccomp is the profile to compile and pass on bwrapSeccompFD.
	seccomp *specs.LinuxSeccomp
	// agentChannel: stdin and stdout are the agent's socket
	// (stdio.openAgent), not pipes.
	agentChannel bool
}

// mountCheck is a host path and the statfs flags (ST_*) it must carry.
type mountCheck struct {
	path  string
	flags int64
}

type bwrapRlimit struct {
	resource int
	limit    unix.Rlimit
}

// bwrapRlimits are the rlimits the translation knows.
var bwrapRlimits = map[string]int{
	"RLIMIT_FSIZE":  unix.RLIMIT_FSIZE,
	"RLIMIT_CORE":   unix.RLIMIT_CORE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE,
	"RLIMIT_NPROC":  unix.RLIMIT_NPROC,
	"RLIMIT_AS":     unix.RLIMIT_AS,
	"RLIMIT_STACK":  unix.RLIMIT_STACK,
	"RLIMIT_CPU":    unix.RLIMIT_CPU,
}

// bwrapNamespaces maps the spec's namespaces to bwrap's options. The user
// namespace is not in the spec (the OCI runtimes run the sandbox as a
// host uid directly): bwrap, unprivileged, always creates one.
var bwrapNamespaces = map[specs.LinuxNamespaceType]string{
	specs.PIDNamespace:     "--unshare-pid",
	specs.IPCNamespace:     "--unshare-ipc",
	specs.UTSNamespace:     "--unshare-uts",
	specs.MountNamespace:   "", // always: bwrap builds a new root
	specs.NetworkNamespace: "--unshare-net",
	specs.CgroupNamespace:  "--unshare-cgroup",
}

// bwrapDevices are the device nodes the OCI runtimes create in every
// container's /dev (runtime-spec "Default Devices"), made by the driver
// in the /dev it shares read-only with every bwrap sandbox (prepareDev);
// the sandbox's user namespace cannot add to them (no mknod). With the
// spec's device cgroup denying everything else, that is the same set.
var bwrapDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// bwrapDevLinks are the links of that /dev, as the OCI runtimes make them.
var bwrapDevLinks = [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}}

// bwrapEnv describes the host to the translation, so tests can fix it.
type bwrapEnv struct {
	// bundle is the execution's bundle directory: relative bind sources
	// are in it.
	bundle string
	// dev is the host directory that becomes /dev (prepareDev).
	dev string
	// exists says whether a masked path exists in the sandbox and is a
	// directory: under /proc the host's procfs answers (the same kernel),
	// elsewhere the image.
	exists func(path string) (dir, ok bool)
}

// bwrapPlanFor translates spec. It consumes a copy field by field; what
// is left at the end was not understood and makes it fail.
func bwrapPlanFor(spec *specs.Spec, env bwrapEnv) (*bwrapPlan, error) {
	var s specs.Spec
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	s.Version = ""
	p := &bwrapPlan{}
	fail := func(format string, args ...any) (*bwrapPlan, error) {
		return nil, fmt.Errorf("bwrap: "+format, args...)
	}
	if s.Process == nil || s.Root == nil || s.Linux == nil {
		return fail("the spec needs process, root and linux")
	}

	// The sandbox's life: it dies with the server (and the server's
	// thread that started it, PR_SET_PDEATHSIG), and has no terminal to
	// push input into (TIOCSTI).
	p.args = []string{"--die-with-parent", "--new-session", "--unshare-user"}

	// Namespaces.
	seen := map[specs.LinuxNamespaceType]bool{}
	for _, ns := range s.Linux.Namespaces {
		opt, ok := bwrapNamespaces[ns.Type]
		if !ok || ns.Path != "" || seen[ns.Type] {
			return fail("namespace %q (path %q) is not supported", ns.Type, ns.Path)
		}
		seen[ns.Type] = true
		if opt != "" {
			p.args = append(p.args, opt)
		}
	}
	if !seen[specs.MountNamespace] {
		return fail("a mount namespace is required")
	}
	s.Linux.Namespaces = nil

	// Who runs: the spec's uid and gid, the same number inside and out.
	u := s.Process.User
	if len(u.AdditionalGids) > 0 || u.Umask != nil || u.Username != "" {
		return fail("process.user: only uid and gid are supported")
	}
	if u.UID == 0 || u.GID == 0 {
		return fail("process.user: the sandbox must not be root")
	}
	p.uid, p.gid = u.UID, u.GID
	uid, gid := strconv.FormatUint(uint64(u.UID), 10), strconv.FormatUint(uint64(u.GID), 10)
	p.args = append(p.args, "--uid", uid, "--gid", gid)
	s.Process.User = specs.User{}

	if s.Hostname != "" {
		if !seen[specs.UTSNamespace] {
			return fail("hostname needs a uts namespace")
		}
		p.args = append(p.args, "--hostname", s.Hostname)
		s.Hostname = ""
	}

	// The root.
	if !s.Root.Readonly || !filepath.IsAbs(s.Root.Path) {
		return fail("root %q: must be an absolute path, read-only", s.Root.Path)
	}
	p.args = append(p.args, "--ro-bind", s.Root.Path, "/")
	s.Root = nil

	// Mounts, in the spec's order.
	for _, m := range s.Mounts {
		args, err := bwrapMount(m, env, p)
		if err != nil {
			return nil, fmt.Errorf("bwrap: mount %s: %w", m.Destination, err)
		}
		p.args = append(p.args, args...)
	}
	s.Mounts = nil

	// Masked paths: a file gets the empty /dev/null over it, a directory
	// an empty read-only tmpfs. What does not exist has nothing to hide.
	for _, m := range s.Linux.MaskedPaths {
		dir, ok := env.exists(m)
		switch {
		case !ok:
		case dir:
			p.args = append(p.args, "--perms", "0555", "--size", "4096", "--tmpfs", m, "--remount-ro", m)
		default:
			p.args = append(p.args, "--ro-bind", "/dev/null", m)
		}
	}
	s.Linux.MaskedPaths = nil
	// Read-only paths: bwrap can remount only mount points, and these
	// are files and directories of the sandbox's procfs. They need no
	// mount there: they belong to the host's root (unmapped in the
	// sandbox's user namespace, so not even its owner's caps apply), are
	// writable by their owner only, and the sandbox has no capability in
	// any namespace. The security suite writes them. Other read-only
	// paths would need that proof too, so they are refused.
	for _, r := range s.Linux.ReadonlyPaths {
		if r != "/proc" && !strings.HasPrefix(r, "/proc/") {
			return fail("read-only path %s: only /proc paths (root-owned in the sandbox's procfs) are supported", r)
		}
	}
	s.Linux.ReadonlyPaths = nil

	// Devices: only bwrapDevices exist (see there).
	if r := s.Linux.Resources; r != nil {
		if !slices.Equal(r.Devices, []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}) {
			return fail("linux.resources.devices: only deny-all is supported")
		}
		r.Devices = nil
		if !isZero(r) {
			return fail("linux.resources: limits belong on the execution's cgroup")
		}
		s.Linux.Resources = nil
	}
	// The cgroup the spec names is created by the driver, which puts
	// bwrap's processes in it (execCgroup.adopt).
	s.Linux.CgroupsPath = ""

	if s.Linux.Seccomp != nil {
		p.seccomp = s.Linux.Seccomp
		p.args = append(p.args, "--seccomp", strconv.Itoa(bwrapSeccompFD))
		s.Linux.Seccomp = nil
	}

	// The process.
	pr := s.Process
	if pr.Terminal || pr.ConsoleSize != nil {
		return fail("process.terminal is not supported")
	}
	if !pr.NoNewPrivileges {
		// bwrap always sets it.
		return fail("process.noNewPrivileges must be true")
	}
	pr.NoNewPrivileges = false
	if c := pr.Capabilities; c != nil {
		if len(c.Bounding)+len(c.Effective)+len(c.Inheritable)+len(c.Permitted)+len(c.Ambient) > 0 {
			return fail("process.capabilities: only none is supported")
		}
		pr.Capabilities = nil
	}
	p.args = append(p.args, "--cap-drop", "ALL")
	for _, r := range pr.Rlimits {
		res, ok := bwrapRlimits[r.Type]
		if !ok {
			return fail("rlimit %s is not supported", r.Type)
		}
		p.rlimits = append(p.rlimits, bwrapRlimit{resource: res, limit: unix.Rlimit{Cur: r.Soft, Max: r.Hard}})
	}
	pr.Rlimits = nil
	p.oomScoreAdj, pr.OOMScoreAdj = pr.OOMScoreAdj, nil
	if !filepath.IsAbs(pr.Cwd) {
		return fail("process.cwd %q: not absolute", pr.Cwd)
	}
	cwd := pr.Cwd
	p.args = append(p.args, "--chdir", cwd)
	pr.Cwd = ""
	// The spec's fixed environment is bwrap's own, which it passes on.
	// A request's env and args never are (render): bwrap runs in the
	// host's namespaces, so LD_PRELOAD and the like would act there.
	p.env, pr.Env = pr.Env, nil
	if len(pr.Args) == 0 {
		return fail("process.args is empty")
	}
	// bwrap sets PWD to the working directory in the environment it
	// passes on (bubblewrap.c, after parsing its options, so --unsetenv
	// cannot remove it). The spec must already say so, or the program
	// would not get exactly the spec's environment.
	if !slices.Contains(p.env, "PWD="+cwd) {
		return fail("process.env must hold PWD=%s: bwrap sets PWD to the working directory", cwd)
	}
	p.command, pr.Args = pr.Args, nil
	if !isZero(pr) {
		return fail("unsupported process settings: %s", remainder(pr))
	}
	s.Process = nil
	if !isZero(s.Linux) {
		return fail("unsupported linux settings: %s", remainder(s.Linux))
	}
	s.Linux = nil
	if !isZero(&s) {
		return fail("unsupported settings: %s", remainder(&s))
	}
	p.args = append(p.args,
		"--info-fd", strconv.Itoa(bwrapInfoFD),
		"--userns-block-fd", strconv.Itoa(bwrapSeccompFD),
		"--json-status-fd", strconv.Itoa(bwrapStatusFD))
	return p, nil
}

// bwrapMount translates one mount of the spec.
func bwrapMount(m specs.Mount, env bwrapEnv, p *bwrapPlan) ([]string, error) {
	opts := map[string]bool{}
	for _, o := range m.Options {
		opts[o] = true
	}
	// only says which options a mount may carry; it returns an error
	// naming any other.
	only := func(allowed ...string) error {
		for o := range opts {
			if !slices.Contains(allowed, o) && !strings.HasPrefix(o, "mode=") && !strings.HasPrefix(o, "size=") {
				return fmt.Errorf("option %q is not supported", o)
			}
		}
		return nil
	}
	switch {
	case m.Type == "proc":
		// bwrap mounts procfs nosuid, noexec, nodev.
		return []string{"--proc", m.Destination}, only("nosuid", "noexec", "nodev")

	case m.Type == "tmpfs" && m.Destination == "/dev":
		// The driver's /dev (prepareDev): a host tmpfs with the device
		// nodes and links, noexec and nosuid like the spec's, read-only
		// and root's, so its flags are locked and nothing can be written
		// there. (bwrap's own tmpfs has no noexec and belongs to the
		// sandbox's user.) The size and mode are the driver's: the
		// sandbox cannot write there at all.
		if err := only("nosuid", "noexec", "strictatime"); err != nil {
			return nil, err
		}
		if !opts["noexec"] || !opts["nosuid"] || env.dev == "" {
			return nil, fmt.Errorf("needs noexec and nosuid, and the driver's /dev")
		}
		p.checks = append(p.checks, mountCheck{env.dev, unix.ST_NOEXEC | unix.ST_NOSUID | unix.ST_RDONLY})
		return []string{"--dev-bind", env.dev, "/dev"}, nil

	case m.Type == "bind":
		if err := only("bind", "rbind", "ro", "rw", "nosuid", "nodev", "noexec"); err != nil {
			return nil, err
		}
		// bwrap adds nosuid and nodev to every bind and keeps the
		// source's flags; noexec must come from the source.
		if !opts["nosuid"] || !opts["nodev"] {
			return nil, fmt.Errorf("a bind mount must be nosuid and nodev")
		}
		src := m.Source
		if !filepath.IsAbs(src) {
			src = filepath.Join(env.bundle, src)
		}
		if opts["noexec"] {
			p.checks = append(p.checks, mountCheck{src, unix.ST_NOEXEC | unix.ST_NOSUID | unix.ST_NODEV})
		}
		if opts["ro"] {
			return []string{"--ro-bind", src, m.Destination}, nil
		}
		return []string{"--bind", src, m.Destination}, nil
	}
	return nil, fmt.Errorf("type %q is not supported", m.Type)
}

// isZero reports whether v (a pointer to a struct of the spec) has no
// field set, as JSON sees it.
func isZero(v any) bool {
	return remainder(v) == remainder(reflect.New(reflect.TypeOf(v).Elem()).Interface())
}

func remainder(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
