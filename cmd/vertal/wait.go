package main

import (
	"context"
	"fmt"
)

// cmdWait waits for an execution (one queued with vertal run --async, or
// any other of the key's tenant) and reports it as vertal run does.
func cmdWait(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "wait", `wait [flags] ID

Waits until the execution ID (exe_..., as vertal run --async prints it)
has finished, then prints it as vertal run does: the program's stdout and
stderr, returned files written under --out, and the program's exit code as
this command's. It follows the execution's event stream and polls when the
stream is not available. If the API refuses (an unknown id is not_found)
or cannot be reached, the exit status is 125. Interrupting it stops only
the waiting.

  id=$(vertal run --async "print(6*7)") && vertal wait "$id"
  vertal wait exe_0123456789abcdef0123456789abcdef --json`)
	var (
		cf     clientFlags
		asJSON bool
		outDir string
	)
	cf.register(fs)
	fs.BoolVar(&asJSON, "json", false, "print the whole final execution as JSON instead of the program's output")
	fs.StringVar(&outDir, "out", "", "directory the returned files are written to (default: the current one; with --json only when given)")
	positional, rest, err := parseInterspersed(fs, args)
	if err != nil {
		return parseError(err)
	}
	positional = append(positional, rest...)
	if len(positional) != 1 || positional[0] == "" {
		fmt.Fprintln(e.Stderr, "vertal wait: want exactly one execution ID; see vertal wait -h")
		return exitCode(exitUsage)
	}
	c, err := cf.clientOrUsage(e, "wait")
	if err != nil {
		return err
	}
	ex, err := c.Wait(ctx, positional[0])
	if err != nil {
		return reportClientError(e, "wait", c, err)
	}
	printOutput(e, ex, asJSON)
	return finishRun(e, "wait", ex, outDir, asJSON)
}
