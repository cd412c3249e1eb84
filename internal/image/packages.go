package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// npmGlobal is where --npm packages go. Node looks in $PREFIX/lib/node
// for a bare require() after every node_modules up the tree (its
// "global folders", PREFIX being /usr/local for /usr/local/bin/node);
// that path is a link to this directory, so require finds the packages
// without NODE_PATH, under every driver, and a program's own
// node_modules still wins.
const npmGlobal = "usr/local/lib/node_modules"

var (
	aptNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	// A registry package, optionally scoped, with an optional version or
	// range: no URL, path, git or alias spec (those would run or fetch
	// something other than a registry tarball).
	npmSpecRe = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*(@[A-Za-z0-9.^~<>=*| -]+)?$`)
	// NameRe is what an image name may be: it is a directory and part of
	// a Docker tag.
	NameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,38}$`)
)

// checkRecipe validates the package lists before anything is downloaded.
func checkRecipe(o Options) error {
	var errs []error
	if !NameRe.MatchString(o.Name) {
		errs = append(errs, fmt.Errorf("image name %q: want lower-case letters, digits, '-' and '_', at most 39", o.Name))
	}
	for _, a := range o.Apt {
		if !aptNameRe.MatchString(a) {
			errs = append(errs, fmt.Errorf("--apt %q is not a Debian package name (the archive's version is installed and recorded)", a))
		}
	}
	for _, n := range o.Npm {
		if !npmSpecRe.MatchString(n) {
			errs = append(errs, fmt.Errorf("--npm %q: want a registry package, name or name@version", n))
		}
	}
	if o.Wheelhouse != "" {
		wheels, err := wheelsIn(o.Wheelhouse)
		if err != nil {
			errs = append(errs, err)
		} else if len(wheels) == 0 {
			errs = append(errs, fmt.Errorf("--pip-wheelhouse %s holds no .whl files", o.Wheelhouse))
		}
	}
	return errors.Join(errs...)
}

func wheelsIn(dir string) ([]string, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("--pip-wheelhouse %s: not a directory", dir)
	}
	wheels, err := filepath.Glob(filepath.Join(dir, "*.whl"))
	if err != nil {
		return nil, err
	}
	for i, w := range wheels {
		wheels[i] = filepath.Base(w)
	}
	return wheels, nil
}

// npmName is the package name of an npm spec ("@scope/x@1" -> "@scope/x").
func npmName(spec string) string {
	at := strings.LastIndexByte(spec, '@')
	if at <= 0 {
		return spec
	}
	return spec[:at]
}

// runLogged runs cmd, sending its output lines to p's detail line, and
// returns a CommandError with the last lines when it fails.
func runLogged(ctx context.Context, cmd *exec.Cmd, what string, p *Progress) error {
	var buf tailBuffer
	buf.p = p
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.SysProcAttr = mergeSysProc(cmd.SysProcAttr)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &CommandError{Cmd: what, Err: err, Tail: buf.tail()}
	}
	return nil
}

func mergeSysProc(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Setpgid, a.Pdeathsig = true, syscall.SIGKILL
	return a
}

// tailBuffer keeps the last lines of a command's output and shows each
// as the progress detail.
type tailBuffer struct {
	p     *Progress
	lines []string
	part  []byte
}

func (b *tailBuffer) Write(data []byte) (int, error) {
	b.part = append(b.part, data...)
	for {
		i := bytes.IndexByte(b.part, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(b.part[:i]))
		b.part = b.part[i+1:]
		if line == "" {
			continue
		}
		b.lines = append(b.lines, line)
		if len(b.lines) > tailLines {
			b.lines = b.lines[len(b.lines)-tailLines:]
		}
		if b.p != nil {
			b.p.Detail(truncate(line, 100))
		}
	}
	return len(data), nil
}

func (b *tailBuffer) tail() []string {
	if len(b.part) > 0 {
		return append(b.lines, string(b.part))
	}
	return b.lines
}

// installNpm installs the npm packages into rootfs's global node_modules
// with the host's npm. Install scripts are not run: they would run on the
// build host, as root; packages that need one (native addons) are not
// supported.
func installNpm(ctx context.Context, o Options, rootfs string, p *Progress) error {
	if len(o.Npm) == 0 {
		return nil
	}
	dir := filepath.Join(rootfs, "usr/local")
	args := append([]string{"install", "--global", "--prefix", dir, "--ignore-scripts", "--no-fund",
		"--no-audit", "--no-update-notifier", "--loglevel=warn"}, o.Npm...)
	cmd := exec.CommandContext(ctx, o.npmPath, args...)
	cmd.Dir = os.TempDir()
	if err := runLogged(ctx, cmd, "npm "+strings.Join(args, " "), p); err != nil {
		return err
	}
	link := filepath.Join(rootfs, "usr/local/lib/node")
	os.Remove(link)
	return os.Symlink("node_modules", link)
}

// withChrootMounts gives rootfs the /dev and /proc that package managers
// run in a chroot expect, for the duration of fn. harden empties /dev
// afterwards; removeBuildDir detaches whatever an interrupted build left.
func withChrootMounts(rootfs string, fn func() error) error {
	var mounted []string
	defer func() {
		for i := len(mounted) - 1; i >= 0; i-- {
			unix.Unmount(mounted[i], unix.MNT_DETACH)
		}
	}()
	for _, m := range []struct{ src, dst, fstype string }{
		{"/dev", "dev", ""}, {"proc", "proc", "proc"},
	} {
		dst := filepath.Join(rootfs, m.dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		var err error
		if m.fstype == "" {
			err = unix.Mount(m.src, dst, "", unix.MS_BIND, "")
			if err == nil {
				// Slave, so that unmounting here never reaches the host.
				err = unix.Mount("", dst, "", unix.MS_SLAVE, "")
			}
		} else {
			err = unix.Mount(m.src, dst, m.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		}
		if err != nil {
			return fmt.Errorf("mounting %s in the build root: %w", m.dst, err)
		}
		mounted = append(mounted, dst)
	}
	return fn()
}

// chrootCmd is argv run chrooted into rootfs as root with a clean
// environment plus env.
func chrootCmd(ctx context.Context, rootfs string, env []string, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	cmd.Dir = "/"
	cmd.Env = append(append([]string(nil), chrootEnv...), env...)
	return cmd
}

// installApt adds Debian packages to an existing root (an image built
// --from another) with the root's own apt, from the mirror in its
// sources.list.
func installApt(ctx context.Context, o Options, rootfs string, p *Progress) error {
	if len(o.Apt) == 0 {
		return nil
	}
	resolv, err := os.ReadFile("/etc/resolv.conf")
	if err == nil {
		os.Remove(filepath.Join(rootfs, "etc/resolv.conf"))
		err = os.WriteFile(filepath.Join(rootfs, "etc/resolv.conf"), resolv, 0o644)
	}
	if err != nil {
		return fmt.Errorf("giving the build root a resolv.conf: %w", err)
	}
	env := []string{"DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"}
	return withChrootMounts(rootfs, func() error {
		if err := runLogged(ctx, chrootCmd(ctx, rootfs, env, "/usr/bin/apt-get", "update"), "apt-get update", p); err != nil {
			return err
		}
		args := append([]string{"/usr/bin/apt-get", "install", "-y", "--no-install-recommends"}, o.Apt...)
		return runLogged(ctx, chrootCmd(ctx, rootfs, env, args...), strings.Join(args[1:], " "), p)
	})
}

// wheelhouseMount is where the wheels are copied inside the build root
// (under /tmp, which harden empties).
const wheelhouseMount = "/tmp/vertal-wheelhouse"

// installWheels installs every wheel of the wheelhouse into /usr/local
// with the image's own pip, offline (--no-index): dependencies must be in
// the wheelhouse too, as `pip download` puts them there.
func installWheels(ctx context.Context, o Options, rootfs string, p *Progress) error {
	if o.Wheelhouse == "" {
		return nil
	}
	wheels, err := wheelsIn(o.Wheelhouse)
	if err != nil {
		return err
	}
	dst := filepath.Join(rootfs, wheelhouseMount)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, w := range wheels {
		if err := copyFile(filepath.Join(o.Wheelhouse, w), filepath.Join(dst, w)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/lib/python3/dist-packages/pip")); err != nil {
		return errors.New("the image has no pip: add --apt python3-pip (a fresh build adds it by itself)")
	}
	args := []string{"/usr/bin/python3", "-m", "pip", "install", "--no-index", "--find-links", wheelhouseMount,
		"--no-cache-dir", "--break-system-packages", "--root-user-action=ignore", "--disable-pip-version-check"}
	for _, w := range wheels {
		args = append(args, wheelhouseMount+"/"+w)
	}
	return withChrootMounts(rootfs, func() error {
		return runLogged(ctx, chrootCmd(ctx, rootfs, nil, args...), "pip install "+strings.Join(wheels, " "), p)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyTree copies the base image's root for --from: cp -a keeps owners,
// modes, links, hard links and xattrs, and reflinks where the filesystem
// can.
func copyTree(ctx context.Context, src, dst string) error {
	cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", dst)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return &CommandError{Cmd: "cp -a " + src, Err: err, Tail: strings.Split(strings.TrimSpace(string(out)), "\n")}
	}
	return nil
}
