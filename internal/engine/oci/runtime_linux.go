package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// runtimeKind describes how to drive one OCI runtime binary. The runtimes
// agree on `run --bundle B --pid-file P ID`; they differ in global flags and
// in what they can enforce.
type runtimeKind struct {
	name string
	// pkg is the Debian package that installs it.
	pkg string
	// globalArgs come before the subcommand; root and log are filled in.
	globalArgs func(root, log string) []string
	// gvisor marks runsc: a user-space kernel with its own limits.
	gvisor bool
	// bwrap marks bubblewrap: not an OCI runtime, but a launcher the
	// driver hands the spec to translated into arguments (bwrap_linux.go).
	// Its own pid 1 reaps zombies (no tini), and it keeps no state.
	bwrap bool
	// proxiesStdio marks runc: `runc run`, attached, copies the
	// container's stdio through pipes of its own, which the container's
	// pid 1 holds and /proc opens. A live sandbox's agent gets its socket
	// as fd 3 instead (--preserve-fds), passed through untouched.
	proxiesStdio bool
}

var runtimes = map[string]runtimeKind{
	"crun": {
		name: "crun", pkg: "crun",
		globalArgs: func(root, log string) []string {
			return []string{"--root=" + root, "--log=file:" + log, "--log-format=json"}
		},
	},
	"runc": {
		name: "runc", pkg: "runc", proxiesStdio: true,
		globalArgs: func(root, log string) []string {
			return []string{"--root", root, "--log", log, "--log-format", "json"}
		},
	},
	"bwrap": {name: "bwrap", pkg: "bubblewrap", bwrap: true},
	"runsc": {
		name: "runsc", pkg: "runsc", gvisor: true,
		globalArgs: func(root, log string) []string {
			return []string{
				"--root=" + root,
				// Loopback only, inside gVisor's own network stack.
				"--network=none",
				// Apply the spec's seccomp filter to the sandboxed code;
				// without it runsc ignores linux.seccomp.
				"--oci-seccomp",
				// The root must stay read-only: no writable overlay.
				"--overlay2=none",
				// ptrace is the default; kvm hangs on this kind of host.
				"--platform=ptrace",
				"--log=" + log, "--log-format=json",
			}
		},
	},
}

// preference is the order tried when Options.Runtime is empty: bwrap
// costs a third of crun's CPU per sandbox and passes the same suites
// (docs/BENCHMARKS.md, issue 15), crun is the fastest OCI runtime, runc
// the most common. bwrap is skipped where the host does not let an
// unprivileged user create a user namespace (usableBwrap).
var preference = []string{"bwrap", "crun", "runc"}

// findRuntime resolves a runtime binary, or says what to install.
func findRuntime(name string) (runtimeKind, string, error) {
	k, ok := runtimes[name]
	if !ok {
		return runtimeKind{}, "", fmt.Errorf("%w: unknown OCI runtime %q (want crun, runc, runsc or bwrap)", engine.ErrUnavailable, name)
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return runtimeKind{}, "", fmt.Errorf("%w: %s not found in PATH (apt-get install %s)", engine.ErrUnavailable, name, k.pkg)
	}
	return k, path, nil
}

// findInit locates a static init for pid 1 of the sandbox. The docker
// driver's --init uses the same binary (docker-init is tini-static).
func findInit(path string) (string, error) {
	candidates := []string{"/usr/bin/tini-static", "/usr/bin/docker-init", "/sbin/tini-static"}
	if path != "" {
		candidates = []string{path}
	}
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: no static init for the sandbox's pid 1 (%s) (apt-get install tini)",
		engine.ErrUnavailable, strings.Join(candidates, ", "))
}

// runtimeCmd builds the command line of one runtime invocation. The
// runtime gets a minimal environment: nothing of the server's reaches it.
func (d *Driver) runtimeCmd(ctx context.Context, log string, args ...string) *exec.Cmd {
	return runtimeCmd(ctx, d.rt, d.rtPath, d.runtimeRoot, log, args...)
}

func runtimeCmd(ctx context.Context, rt runtimeKind, path, root, log string, args ...string) *exec.Cmd {
	full := append(rt.globalArgs(root, log), args...)
	cmd := exec.CommandContext(ctx, path, full...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	return cmd
}

// runArgs are args (a `run` subcommand) with, when hostUDS is set under
// runsc, the global flag that lets the sandbox connect to an existing
// host unix socket mounted into it (egress), never create one on the
// host. The other runtimes need none: the socket's file mode decides.
func (d *Driver) runArgs(hostUDS bool, args ...string) []string {
	if hostUDS && d.rt.gvisor {
		return append([]string{"--host-uds=open"}, args...)
	}
	return args
}

// forceDelete removes a container the runtime still knows about, killing
// its processes. It is the slow path (one more process) taken only when
// `run` did not clean up after itself.
func (d *Driver) forceDelete(ctx context.Context, id string) error {
	return forceDelete(ctx, d.rt, d.rtPath, d.runtimeRoot, id)
}

func forceDelete(ctx context.Context, rt runtimeKind, path, root, id string) error {
	if rt.bwrap {
		return nil // no state: its processes die with the cgroup
	}
	state := statePath(rt, root, id)
	if _, err := os.Stat(state); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	out, err := runtimeCmd(ctx, rt, path, root, os.DevNull, "delete", "--force", id).CombinedOutput()
	if _, serr := os.Stat(state); errors.Is(serr, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = errors.New("state still present")
	}
	return fmt.Errorf("%s delete --force %s: %w: %s", rt.name, id, err, strings.TrimSpace(string(out)))
}

// statePath is where a runtime keeps a container's state under root: runc
// and crun use a directory named for the container, runsc files named after
// the sandbox and the container.
func statePath(rt runtimeKind, root, id string) string {
	if rt.gvisor {
		return filepath.Join(root, id+"_sandbox:"+id+".state")
	}
	return filepath.Join(root, id)
}

// stateIDs lists the container ids with state under a runtime root.
func stateIDs(rt runtimeKind, root string) []string {
	ents, _ := os.ReadDir(root)
	var ids []string
	for _, e := range ents {
		n := e.Name()
		if rt.gvisor {
			if id, _, ok := strings.Cut(n, "_sandbox:"); ok {
				ids = append(ids, id)
			}
			continue
		}
		if e.IsDir() {
			ids = append(ids, n)
		}
	}
	return ids
}

// exitCode maps a runtime's exit status to the sandbox's: tini exits with
// the user process's status, or 128+signal when it was killed.
func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
