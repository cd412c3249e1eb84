package docker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"
)

// A sandbox's way out (package egress) is a host directory holding the
// proxy's socket, mounted read-only, nosuid, nodev and noexec at
// engine.EgressDir, and the agent, mounted read-only at engine.AgentPath,
// which relays 127.0.0.1:engine.EgressPort to the socket: a live
// sandbox's agent on request (live.go), a one-shot sandbox's program
// under the agent's relay (engine.RelayArgv, containerConfig). Docker's
// bind mount cannot say noexec, nosuid or nodev, but under runc a plain
// bind keeps its source's flags (as the working directory's tmpfs keeps
// its noexec), where a read-only one is remounted with ro alone: so the
// driver binds the directory into the sandbox's state directory with
// those flags (bindInto), and Docker binds that. Under runsc, Docker's
// runtime arguments let the sandbox connect to a host socket there
// (scripts/dockerd.sh, --host-uds=open). Discard, a cold execution's
// cleanup and Reap unmount what bindInto mounted, following no link.
//
// A one-shot execution with egress has a state directory of its own
// holding code/ (the working directory's tmpfs), net/ and agent, where
// one without has the working directory's tmpfs as its state directory.

// Where bindInto mounts, in a sandbox's state directory: the egress
// directory (a live or one-shot sandbox's) and the agent (a one-shot
// sandbox's; a live one binds it read-only from where it is).
const (
	egressSource = "net"
	agentSource  = "agent"
)

// checkEgressDir refuses an egress directory that is not an absolute
// path to a directory.
func checkEgressDir(dir string) error {
	if fi, err := os.Stat(dir); !filepath.IsAbs(dir) || err != nil || !fi.IsDir() {
		return fmt.Errorf("EgressDir %q is not an absolute path to a directory (%v)", dir, err)
	}
	return nil
}

// checkAgent refuses an agent that is not an absolute path to a file.
func checkAgent(path string) error {
	if fi, err := os.Stat(path); !filepath.IsAbs(path) || err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("the agent %q is not an absolute path to a file (%v)", path, err)
	}
	return nil
}

// bindInto binds the host path src at dst (created: a directory, or an
// empty file for a file), read-only, nosuid and nodev, and noexec unless
// exec, not recursively. Read-only also keeps the removal of the state
// directory from deleting anything of src should the unmount before it
// fail.
func bindInto(src, dst string, exec bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		err = os.Mkdir(dst, 0o700)
	} else {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s at %s: %w", src, dst, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if !exec {
		flags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		_ = unix.Unmount(dst, unix.MNT_DETACH)
		return fmt.Errorf("making %s read-only: %w", dst, err)
	}
	return nil
}

// stateBind is Docker's bind of what bindInto mounted at the state
// directory's name to target: plain under runc, which keeps the source's
// flags; read-only under runsc, whose own mount must say so (the host
// kernel still enforces the source's flags on what the gofer opens).
func (d *Driver) stateBind(id, name, target string) mount.Mount {
	return mount.Mount{Type: mount.TypeBind, Source: filepath.Join(d.codeDir(id), name), Target: target, ReadOnly: d.gvisor}
}

// unmountNoFollow detaches the mount at path, if one is there, without
// following a link: Reap calls it on every execution's directory, and a
// cold one without egress is the code's own working directory, where the
// code could leave a link by any name to any host mount.
func unmountNoFollow(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("docker: unmounting %s: %w", path, err)
	}
	return nil
}

// unmountEgress detaches the egress directory's mount in the state
// directory dir, if one is there (see unmountNoFollow).
func unmountEgress(dir string) error {
	return unmountNoFollow(filepath.Join(dir, egressSource))
}
