package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// commandRunner runs the host's tools (systemctl, journalctl, docker);
// it is the seam that lets tests choose a log source without them.
type commandRunner interface {
	// Output runs name and returns its stdout, for short probes.
	Output(ctx context.Context, name string, args ...string) ([]byte, error)
	// Run runs name with its output on stdout and stderr, until it exits
	// or ctx ends.
	Run(ctx context.Context, stdout, stderr io.Writer, name string, args ...string) error
}

type execRunner struct{}

func (execRunner) Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, name, args...).Output()
}

func (execRunner) Run(ctx context.Context, stdout, stderr io.Writer, name string, args ...string) error {
	c := exec.CommandContext(ctx, name, args...)
	c.Stdout, c.Stderr = stdout, stderr
	return c.Run()
}

// logSource is where the service's logs are and how to read them.
type logSource struct {
	kind string // "journald" or "docker"
	name string // the unit or the container
}

// Defaults match the unit the cloud-init installs and the compose
// service, both named vertal.
const (
	defaultUnit      = "vertal"
	defaultContainer = "vertal"
)

func cmdLogs(ctx context.Context, e *env, args []string) error {
	return runLogs(ctx, e, execRunner{}, args)
}

func runLogs(ctx context.Context, e *env, r commandRunner, args []string) error {
	fs := newFlagSet(e, "logs", "logs [-f] [--lines N] [--unit U | --container C]\n\n"+
		"Shows the server's logs: from journald when the systemd unit exists (journalctl -u),\n"+
		"else from its container (docker logs). --unit or --container picks the source.")
	follow := fs.Bool("f", false, "keep following new lines (Ctrl-C ends)")
	lines := fs.Int("lines", 100, "how many of the latest lines to show first; 0 shows all")
	unit := fs.String("unit", defaultUnit, "systemd unit to read from journald")
	container := fs.String("container", defaultContainer, "Docker container name, or compose service name, to read with docker logs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *lines < 0 {
		return usageError(fs)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["unit"] && set["container"] {
		return errors.New("give --unit or --container, not both")
	}
	src, err := chooseLogSource(ctx, r, *unit, *container, set["unit"], set["container"])
	if err != nil {
		return err
	}
	name, cmdArgs := src.command(*lines, *follow)
	err = r.Run(ctx, e.Stdout, e.Stderr, name, cmdArgs...)
	if ctx.Err() != nil {
		return nil // Ctrl-C while following is the normal end
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		// The tool has said why (e.g. no permission to read the journal).
		return exitCode(exit.ExitCode())
	}
	return err
}

// chooseLogSource picks journald when the unit exists, else the container
// (by name, then by compose service label); an explicit flag skips the
// probing of the other source.
func chooseLogSource(ctx context.Context, r commandRunner, unit, container string, unitSet, containerSet bool) (logSource, error) {
	if !containerSet {
		if unitLoaded(ctx, r, unit) {
			return logSource{"journald", unit}, nil
		}
		if unitSet {
			return logSource{}, fmt.Errorf("no systemd unit %s here (systemctl show %s.service: not loaded, or no systemd)", unit, unit)
		}
	}
	if name, ok := findContainer(ctx, r, container); ok {
		return logSource{"docker", name}, nil
	}
	if containerSet {
		return logSource{}, fmt.Errorf("no Docker container or compose service named %s (or docker is not usable: are you in the docker group?)", container)
	}
	return logSource{}, fmt.Errorf("found neither the systemd unit %s nor a Docker container or compose service %s; name them with --unit or --container", unit, container)
}

func unitLoaded(ctx context.Context, r commandRunner, unit string) bool {
	out, err := r.Output(ctx, "systemctl", "show", "--property=LoadState", "--value", unit+".service")
	return err == nil && strings.TrimSpace(string(out)) == "loaded"
}

// findContainer returns the container called name, or else the first one
// compose made for a service called name.
func findContainer(ctx context.Context, r commandRunner, name string) (string, bool) {
	if _, err := r.Output(ctx, "docker", "container", "inspect", "--format", "{{.Name}}", name); err == nil {
		return name, true
	}
	out, err := r.Output(ctx, "docker", "ps", "--all", "--filter", "label=com.docker.compose.service="+name, "--format", "{{.Names}}")
	if err != nil {
		return "", false
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first, first != ""
}

// command is the tool and arguments that show the source's logs.
func (s logSource) command(lines int, follow bool) (string, []string) {
	n := strconv.Itoa(lines)
	if lines == 0 {
		n = "all" // both tools spell it so
	}
	if s.kind == "journald" {
		args := []string{"--unit", s.name + ".service", "--no-pager", "--lines", n}
		if follow {
			args = append(args, "--follow")
		}
		return "journalctl", args
	}
	args := []string{"logs", "--tail", n}
	if follow {
		args = append(args, "--follow")
	}
	return "docker", append(args, s.name)
}
