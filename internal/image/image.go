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
	DefaultImagesDir   = "/var/lib/vertal/images"
	DefaultName        = "default"
	DefaultOutDir      = DefaultImagesDir + "/" + DefaultName
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
	// Name is the image's name (default "default"); OutDir is the image
	// directory to create or replace (default DefaultImagesDir/Name).
	Name   string
	OutDir string
	// From is the directory of an image to extend: its root is copied and
	// the packages below are added to it. Empty: a fresh debootstrap.
	From string
	// Apt are Debian packages (name or name=version) added to the root;
	// Npm are registry packages (name or name@version) installed in the
	// global node_modules; Wheelhouse is a directory of Python wheels
	// installed offline with pip (dependencies included).
	Apt        []string
	Npm        []string
	Wheelhouse string
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
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(DefaultImagesDir, o.Name)
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
	if err := checkRecipe(o); err != nil {
		return o, err
	}
	tools := []struct {
		name string
		dst  *string
	}{{"debootstrap", &o.debootstrapPath}, {"npm", &o.npmPath}}
	switch {
	case o.From != "" && len(o.Npm) == 0:
		tools = nil
	case o.From != "":
		tools = tools[1:]
	}
	if o.From != "" {
		if fi, err := os.Stat(filepath.Join(o.From, RootfsDir)); err != nil || !fi.IsDir() {
			return o, fmt.Errorf("--from %s: no image there (no %s/)", o.From, RootfsDir)
		}
		if filepath.Clean(o.From) == filepath.Clean(o.OutDir) {
			return o, errors.New("--from names the image being built; build it under another --name")
		}
	}
	var missing []error
	for _, tool := range tools {
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
	Version   string // versions/<Version> holds it
	Versions  Versions
	Manifest  Manifest
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
	parent := filepath.Join(out, VersionsSubdir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("creating %s: %w", parent, err)
	}
	if err := cleanStaleBuilds(out); err != nil {
		p.Fail(shortReason(err))
		return Result{}, fmt.Errorf("removing an interrupted build: %w", err)
	}
	if _, err := GC(out, RetireGrace); err != nil {
		o.Logger.Warn("removing unused image versions", "err", err)
	}
	tmp, err := os.MkdirTemp(parent, fmt.Sprintf(".build-%d-", os.Getpid()))
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

	id := newVersionID(began)
	res, err := build(ctx, o, tmp, id, p)
	if err != nil {
		return Result{}, err
	}

	p.Step("switching " + o.Name + " to the new version")
	if err := os.Rename(tmp, filepath.Join(parent, id)); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	placed = true
	if err := switchTo(out, id); err != nil {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	// The version just replaced stays until unused and RetireGrace old;
	// older ones go now if nothing runs on them.
	removed, err := GC(out, RetireGrace)
	if err != nil {
		o.Logger.Warn("removing unused image versions", "err", err)
	}
	if len(removed) > 0 {
		p.Note("removed unused versions " + strings.Join(removed, ", "))
	}
	p.Done(filepath.Join(out, VersionsSubdir, id))
	res.Dir = out
	res.Version = id
	res.Duration = time.Since(began)
	return res, nil
}

// build runs the steps that produce tmp/rootfs, tmp/versions.json and
// tmp/image.json.
func build(ctx context.Context, o Options, tmp, id string, p *Progress) (Result, error) {
	rootfs := filepath.Join(tmp, RootfsDir)
	fail := func(err error) (Result, error) {
		p.Fail(shortReason(err))
		return Result{}, err
	}
	m := Manifest{Name: o.Name, Version: id, BuiltAt: time.Now().UTC()}
	var nodeVersion string
	if o.From != "" {
		base, err := ReadManifest(o.From)
		if err != nil {
			base = Manifest{Name: filepath.Base(o.From), Version: CurrentVersion(o.From)}
		}
		m.From = base.Name + "@" + base.Version
		m.Recipe = base.Recipe
		p.Step("copying the root of " + m.From)
		if err := copyTree(ctx, filepath.Join(o.From, RootfsDir), rootfs); err != nil {
			return fail(err)
		}
		p.Done("")
		if len(o.Apt) > 0 {
			p.Step("apt-get install " + strings.Join(o.Apt, " "))
			if err := installApt(ctx, o, rootfs, p); err != nil {
				return fail(err)
			}
			p.Done("")
		}
	} else {
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
		nodeVersion = pack.Version

		p.Step(fmt.Sprintf("debootstrap %s (minbase + %s)", o.Suite, strings.Join(includePackages(o), ", ")))
		p.Note("mirror " + o.Mirror)
		if err := runDebootstrap(ctx, o, rootfs, p); err != nil {
			return fail(err)
		}
		p.Done("")

		p.Step("installing Node.js " + pack.Version)
		if err := installNode(tgz, rootfs); err != nil {
			p.Fail(shortReason(err))
			return Result{}, fmt.Errorf("installing node: %w", err)
		}
		if err := os.RemoveAll(dl); err != nil {
			return fail(err)
		}
		p.Done("/usr/local/bin/node, /usr/bin/node -> /usr/local/bin/node")
	}
	if len(o.Npm) > 0 {
		p.Step("npm install " + strings.Join(o.Npm, " "))
		if err := installNpm(ctx, o, rootfs, p); err != nil {
			return fail(err)
		}
		p.Done("/" + npmGlobal)
	}
	if o.Wheelhouse != "" {
		wheels, _ := wheelsIn(o.Wheelhouse)
		p.Step(fmt.Sprintf("pip install %d wheels from %s (offline)", len(wheels), o.Wheelhouse))
		if err := installWheels(ctx, o, rootfs, p); err != nil {
			return fail(err)
		}
		p.Done("/usr/local/lib/python3/dist-packages")
		m.Recipe.Wheels = sortedUnique(append(m.Recipe.Wheels, wheels...))
	}
	m.Recipe.Apt = sortedUnique(append(m.Recipe.Apt, o.Apt...))
	m.Recipe.Npm = sortedUnique(append(m.Recipe.Npm, o.Npm...))

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
	if ok, err := prepareMatplotlib(ctx, rootfs); err != nil {
		return fail(err)
	} else if ok {
		p.Note("matplotlib: Agg backend, font cache built into " + mplCacheDir)
	}
	v, err := detectVersions(ctx, rootfs)
	if err != nil {
		return fail(err)
	}
	if nodeVersion != "" && v.JavaScript != nodeVersion {
		return fail(fmt.Errorf("node reports %s but the npm package was %s", v.JavaScript, nodeVersion))
	}
	if m.Packages, err = installedPackages(rootfs); err != nil {
		return fail(fmt.Errorf("recording installed packages: %w", err))
	}
	for _, pkg := range m.Main() {
		if pkg.Version == "" {
			return fail(fmt.Errorf("%s package %s was asked for but is not installed", pkg.Source, pkg.Name))
		}
	}
	m.Languages = v
	if err := writeVersions(tmp, v); err != nil {
		return fail(err)
	}
	if err := writeManifest(tmp, m); err != nil {
		return fail(err)
	}
	size, _ := treeSize(rootfs)
	p.Done(fmt.Sprintf("python %s, javascript %s, bash %s; %d dpkg, %d npm, %d pip packages; rootfs %s",
		v.Python, v.JavaScript, v.Bash, len(m.Packages.Dpkg), len(m.Packages.Npm), len(m.Packages.Pip), humanBytes(size)))
	return Result{Versions: v, Manifest: m, SizeBytes: size, SetIDStripped: hr.SetIDStripped, CapsRemoved: hr.CapsRemoved}, nil
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

// Steps is how many progress steps Build shows for o (for "[n/Steps]");
// the command adds one when it imports into Docker.
func Steps(o Options) int {
	n := 4 // host, trim, versions, switch
	if o.From != "" {
		n++
		if len(o.Apt) > 0 {
			n++
		}
	} else {
		n += 3
	}
	if len(o.Npm) > 0 {
		n++
	}
	if o.Wheelhouse != "" {
		n++
	}
	return n
}

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
