package oci

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// probeUID is the unprivileged user the bwrap probe runs as: nobody, a uid
// every Debian and Ubuntu host has and nothing of ours uses.
const probeUID = 65534

// usableBwrap checks that bwrap at path can do what every sandbox needs
// it to, as an unprivileged user: create a user namespace (with pid, net,
// ipc and uts namespaces in it) and run a program there. Hosts can forbid
// that (Debian's kernel.unprivileged_userns_clone=0, user.max_user_namespaces=0,
// Ubuntu 24.04's AppArmor restriction of unprivileged user namespaces), in
// which case the driver picks the next runtime rather than failing every
// execution.
func usableBwrap(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc",
		"--die-with-parent", "--", "/bin/true")
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: probeUID, Gid: probeUID, NoSetGroups: true}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: bwrap cannot create a sandbox as an unprivileged user on this host: %v: %s "+
			"(unprivileged user namespaces are off: check sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces, "+
			"kernel.apparmor_restrict_unprivileged_userns; or use --runtime crun)",
			engine.ErrUnavailable, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
