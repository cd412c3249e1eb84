package oci

import (
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

// A sandbox's way out (package egress) is a host directory holding the
// proxy's socket, bound read-only, nosuid, nodev and noexec into the
// bundle (hostBind) and from there at engine.EgressDir, and the agent,
// mounted read-only at engine.AgentPath, which relays
// 127.0.0.1:engine.EgressPort to the socket. A live sandbox's agent does
// it on request (live_linux.go); a one-shot sandbox with Spec.EgressDir
// runs its program under the agent's relay (engine.RelayArgv), with
// engine.ProxyEnv in its environment (sandbox.SpecEnv). Under runsc the
// sandbox may then connect to a host unix socket (--host-uds=open). The
// bind goes with the bundle, as every mount under it does (cleanup, and
// Reap after a crash).

// egressSource is the bundle's mount point for the egress directory.
const egressSource = "net"

// checkEgressDir refuses an egress directory that is not an absolute
// path to a directory.
func checkEgressDir(dir string) error {
	if fi, err := os.Stat(dir); !filepath.IsAbs(dir) || err != nil || !fi.IsDir() {
		return fmt.Errorf("EgressDir %q is not an absolute path to a directory (%v)", dir, err)
	}
	return nil
}

// egressMount is the spec's mount of the bundle's bind of the egress
// directory (hostBind), already read-only, nosuid, nodev and noexec:
// bwrap keeps a source's flags and resolves the source as the sandbox's
// uid, which may not pass through the directory's parents on the host.
func egressMount() specs.Mount {
	return specs.Mount{Destination: engine.EgressDir, Type: "bind", Source: egressSource, Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}}
}

// agentMount is the spec's mount of the driver's copy of the agent
// (agentCopy): read-only, nosuid and nodev, and executable.
func agentMount(agent string) specs.Mount {
	return specs.Mount{Destination: engine.AgentPath, Type: "bind", Source: agent, Options: []string{"bind", "ro", "nosuid", "nodev"}}
}

// oneShotEgress prepares a one-shot execution with Spec.EgressDir: it
// checks the directory, adds the agent's mount points to the image, and
// returns the driver's copy of the agent. Without EgressDir it does
// nothing and returns "".
func (d *Driver) oneShotEgress(spec engine.Spec) (agent string, err error) {
	if spec.EgressDir == "" {
		return "", nil
	}
	if err := checkEgressDir(spec.EgressDir); err != nil {
		return "", err
	}
	if err := agentMountPoints(spec.Language.Image); err != nil {
		return "", err
	}
	return d.agentCopy(spec.Agent)
}

// withEgress changes the cold path's spec s of lang and l for a one-shot
// execution with egress: the language's command runs under the agent's
// relay, still under the sandbox's own deadline and (but for bwrap) the
// init in front of it, and the agent and the egress directory are
// mounted. The environment is the request's (sandbox.SpecEnv), added by
// the caller.
func (d *Driver) withEgress(s *specs.Spec, lang engine.Language, l engine.Limits, agent string) {
	keep := 2 // initPath, "--"
	if d.rt.bwrap {
		keep = 0
	}
	s.Process.Args = append(s.Process.Args[:keep:keep], sandbox.DeadlineArgv(timeoutPath, l.Lifetime, engine.RelayArgv(lang.Argv()))...)
	s.Mounts = append(s.Mounts, agentMount(agent), egressMount())
}

// hostBind bind-mounts the directory src at dst (created, in a bundle)
// read-only, nosuid, nodev and noexec, not recursively. Read-only also
// keeps the bundle's removal from deleting anything of src should the
// unmount before it fail.
func hostBind(src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s at %s: %w", src, dst, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		_ = unix.Unmount(dst, unix.MNT_DETACH)
		return fmt.Errorf("making %s read-only: %w", dst, err)
	}
	return nil
}
