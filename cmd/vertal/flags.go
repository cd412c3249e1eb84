package main

import (
	"errors"
	"flag"
	"fmt"
)

// The flag handling every subcommand shares. The standard flag package
// does the work; this only fixes the shape of the usage text and what a
// parse error means. ff (peterbourgon/ff) would add environment and
// config-file binding, which config.Bind already does for our settings,
// so it would bring a second way to spell the same thing.

// newFlagSet returns the flags of `vertal <name>`, writing to stderr. Its
// usage text is "usage: vertal <synopsis>", a blank line, "flags:" and
// the flags; the flag package prints it for -h and after a bad flag. An
// empty synopsis keeps the flag package's own usage text.
func newFlagSet(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("vertal "+name, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	if synopsis != "" {
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "usage: vertal %s\n\nflags:\n", synopsis)
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses fs, turning -h into a clean exit and a bad flag into
// exit status 2 (the flag package has printed why).
func parseFlags(fs *flag.FlagSet, args []string) error {
	return parseError(fs.Parse(args))
}

// parseError is what a subcommand returns for an error of fs.Parse.
func parseError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return exitCode(0)
	default:
		return exitCode(exitUsage)
	}
}

// usageError prints the usage text and returns exit status 2, for
// positional arguments the command does not take.
func usageError(fs *flag.FlagSet) error {
	fs.Usage()
	return exitCode(exitUsage)
}

// parseInterspersed parses flags that may come before or after positional
// arguments, as in the documented `run "code" --language javascript`. The
// standard flag package stops at the first positional argument; "--" ends
// flag parsing, and what follows it is returned apart as rest.
func parseInterspersed(fs *flag.FlagSet, args []string) (positional, rest []string, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		left := fs.Args()
		if len(left) == 0 {
			return positional, nil, nil
		}
		// fs.Parse consumed a "--" if that is what stopped it.
		if len(args) > len(left) && args[len(args)-len(left)-1] == "--" {
			return positional, left, nil
		}
		positional = append(positional, left[0])
		args = left[1:]
	}
}
