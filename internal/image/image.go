// Package image builds the sandbox root filesystem that every execution
// runs on: Debian bookworm (debootstrap, minbase) with the full Python 3
// standard library and Bash from Debian, and the official Node.js 22
// binary from the npm registry.
//
// An image directory holds rootfs/ (the tree a driver mounts read-only, or
// that is imported into Docker) and versions.json (each language's real
// interpreter version, which the API reports). A build happens in a
// temporary directory next to the output and is swapped in atomically, so
// a failed or interrupted build leaves the previous image untouched.
package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Defaults for Options.
const (
	DefaultOutDir      = "/var/lib/vertal/images/default"
	DefaultMirror      = "http://deb.debian.org/debian"
	DefaultSuite       = "bookworm"
	DefaultNodeVersion = "22"
	DefaultCacheDir    = "/var/cache/vertal/debootstrap"
	DefaultDockerTag   = "vertal/default:latest"
)

// Sentinel errors of the host checks.
var (
	// ErrNotRoot means the build was started without root privileges
	// (debootstrap creates device nodes, chowns files and chroots).
	ErrNotRoot = errors.New("building an image needs root")
	// ErrMissingTool means a required program is not installed.
	ErrMissingTool = errors.New("required tool not installed")
)

// Options configure a build. Zero values take the defaults above.
type Options struct {
	// OutDir is the image directory to create or replace.
	OutDir string
	// Mirror is the Debian archive debootstrap downloads from.
	Mirror string
	// Suite is the Debian release.
	Suite string
	// NodeVersion is a version or range of the npm node-linux-* package.
	NodeVersion string
	// CacheDir keeps downloaded .deb files between builds (debootstrap
	// --cache-dir); "-" disables the cache.
	CacheDir string
	// Logger receives debug detail; nil discards it.
	Logger *slog.Logger

	// Hooks for tests of the host checks; nil means the real ones.
	geteuid  func() int
	lookPath func(string) (string, error)

	debootstrapPath, npmPath string
}

func (o Options) withDefaults() Options {
	if o.OutDir == "" {
		o.OutDir = DefaultOutDir
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.NodeVersion == "" {
		o.NodeVersion = DefaultNodeVersion
	}
	switch o.CacheDir {
	case "":
		o.CacheDir = DefaultCacheDir
	case "-":
		o.CacheDir = ""
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.geteuid == nil {
		o.geteuid = os.Geteuid
	}
	if o.lookPath == nil {
		o.lookPath = exec.LookPath
	}
	return o
}

// toolHints says how to install each external tool on Debian/Ubuntu.
var toolHints = map[string]string{
	"debootstrap": "apt-get install debootstrap",
	"npm":         "apt-get install npm",
}

// Preflight checks the host before anything is downloaded: root, the
// tools, and a sane output directory. It returns the options with the
// tools' paths resolved.
func Preflight(o Options) (Options, error) {
	o = o.withDefaults()
	if uid := o.geteuid(); uid != 0 {
		return o, fmt.Errorf("%w (running as uid %d): debootstrap creates device nodes, sets file owners and chroots; run it as root, e.g. sudo vertal image build", ErrNotRoot, uid)
	}
	var missing []error
	for _, tool := range []struct {
		name string
		dst  *string
	}{{"debootstrap", &o.debootstrapPath}, {"npm", &o.npmPath}} {
		p, err := o.lookPath(tool.name)
		if err != nil {
			missing = append(missing, fmt.Errorf("%w: %s is not in PATH; install it with `%s`", ErrMissingTool, tool.name, toolHints[tool.name]))
			continue
		}
		*tool.dst = p
	}
	if len(missing) > 0 {
		return o, errors.Join(missing...)
	}
	if o.CacheDir != "" && !filepath.IsAbs(o.CacheDir) {
		return o, fmt.Errorf("cache directory %q must be absolute", o.CacheDir)
	}
	if _, err := nodeSpec(o.NodeVersion); err != nil {
		return o, err
	}
	return o, checkOut(o.OutDir)
}

// Result describes a finished build.
type Result struct {
	Dir       string
	Versions  Versions
	SizeBytes int64 // of rootfs/
	Duration  time.Duration
	// Hardening lists what was changed to make the image safe to run.
	SetIDStripped []string
	CapsRemoved   []string
}

// Build creates the image described by o, reporting progress to p (nil
// shows nothing). Preflight runs first.
func Build(ctx context.Context, o Options, p *Progress) (Result, error) {
	if p == nil {
		p = NewProgress(nil, ProgressOptions{})
	}
	began := time.Now()
	p.Step("checking the host")
	o, err := Preflight(o)
	if err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	out := filepath.Clean(o.OutDir)
	parent := filepath.Dir(out)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("creating %s: %w", parent, err)
	}
	if err := cleanStaleBuilds(out); err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("removing an interrupted build: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, buildPrefix(out))
	if err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("creating build directory: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	placed := false
	defer func() {
		if !placed {
			if err := removeBuildDir(tmp); err != nil {
				o.Logger.Warn("leaving the failed build directory behind", "dir", tmp, "err", err)
			}
		}
	}()
	p.Done(fmt.Sprintf("building in %s", tmp))

	res, err := build(ctx, o, tmp, p)
	if err != nil {
		return Result{}, err
	}

	p.Step("moving the image into place")
	if err := placeImage(tmp, out); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	placed = true
	p.Done(out)
	res.Dir = out
	res.Duration = time.Since(began)
	return res, nil
}

// build runs the steps that produce tmp/rootfs and tmp/versions.json.
func build(ctx context.Context, o Options, tmp string, p *Progress) (Result, error) {
	rootfs := filepath.Join(tmp, RootfsDir)
	dl := filepath.Join(tmp, "download")
	if err := os.Mkdir(dl, 0o700); err != nil {
		return Result{}, err
	}

	p.Step("fetching Node.js " + o.NodeVersion + " from the npm registry")
	pack, tgz, err := fetchNode(ctx, o, dl)
	if err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("fetching node: %w", err)
	}
	p.Done(pack.Name + "@" + pack.Version)

	p.Step(fmt.Sprintf("debootstrap %s (minbase + %s)", o.Suite, strings.Join(basePackages, ", ")))
	p.Note("mirror " + o.Mirror)
	if err := runDebootstrap(ctx, o, rootfs, p); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	p.Done("")

	p.Step("installing Node.js " + pack.Version)
	if err := installNode(tgz, rootfs); err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("installing node: %w", err)
	}
	if err := os.RemoveAll(dl); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	p.Done("/usr/local/bin/node, /usr/bin/node -> /usr/local/bin/node")

	p.Step("trimming and hardening")
	freed, err := trim(rootfs)
	if err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("trimming: %w", err)
	}
	hr, err := harden(rootfs)
	if err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("hardening: %w", err)
	}
	for _, f := range hr.SetIDStripped {
		o.Logger.Debug("stripped setuid/setgid", "file", f)
	}
	p.Done(fmt.Sprintf("freed %s; setuid/setgid removed from %d files, capabilities from %d",
		humanBytes(freed), len(hr.SetIDStripped), len(hr.CapsRemoved)))

	p.Step("checking the interpreters (chroot) and recording versions")
	v, err := detectVersions(ctx, rootfs)
	if err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	if v.JavaScript != pack.Version {
		err := fmt.Errorf("node reports %s but the npm package was %s", v.JavaScript, pack.Version)
		p.Fail(shortReason(err))
		return Result{}, err
	}
	if err := writeVersions(tmp, v); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	size, _ := treeSize(rootfs)
	p.Done(fmt.Sprintf("python %s, javascript %s, bash %s; rootfs %s", v.Python, v.JavaScript, v.Bash, humanBytes(size)))
	return Result{Versions: v, SizeBytes: size, SetIDStripped: hr.SetIDStripped, CapsRemoved: hr.CapsRemoved}, nil
}

// shortReason is what the progress line says about a failure whose full
// text (with command output) the caller prints.
func shortReason(err error) error {
	var ce *CommandError
	switch {
	case errors.Is(err, context.Canceled):
		return errors.New("interrupted")
	case errors.As(err, &ce):
		return fmt.Errorf("%v (output below)", ce.Err)
	}
	return errors.New("see the error below")
}

// Steps is how many progress steps Build shows (for "[n/Steps]"); the
// command adds one when it imports into Docker.
const Steps = 7

func treeSize(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
