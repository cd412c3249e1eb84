// Command vertal is the Vertal Run server, operator tool and client.
//
// Each subcommand lives in its own file and owns its flags; this file only
// dispatches. Business logic belongs in internal/ packages.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.2.0"

// env is what a subcommand may touch of the outside world.
type env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

// exitCode is returned by a subcommand that wants a specific exit status
// without printing an error (e.g. `vertal run` mirrors the program's).
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func commands() []command {
	return []command{
		{"serve", "start the API server", cmdServe},
		{"run", "run code on a Vertal Run server (client)", cmdRun},
		{"wait", "wait for an execution (e.g. run --async) and print its result (client)", cmdWait},
		{"sandbox", "sandboxes that stay: create, ls, exec, cp, pause, resume, rm (client)", cmdSandbox},
		{"usage", "show today's usage and plan limits (client)", cmdUsage},
		{"mcp", "MCP server on stdio giving agents a run_code tool", cmdMCP},
		{"status", "health, version, sandboxes, pool, today's totals and store of a server (operator)", cmdStatus},
		{"key", "make an API key: vertal key TENANT [PLAN] (operator)", cmdKey},
		{"logs", "show the service's logs from journald or its container, -f to follow (operator)", cmdLogs},
		{"backup", "copy the SQLite database of a running server, consistently (operator)", cmdBackup},
		{"create-key", "create an API key for a tenant (operator)", cmdCreateKey},
		{"revoke-key", "revoke an API key by id (operator)", cmdRevokeKey},
		{"list-keys", "list API keys, never the secrets (operator)", cmdListKeys},
		{"invite", "print a one-time sign-up link for an email (operator)", cmdInvite},
		{"reset-link", "print a one-time password reset link for an account (operator)", cmdResetLink},
		{"tenants", "list tenants with their plan, account and today's usage (operator)", cmdTenants},
		{"set-plan", "change a tenant's plan (operator)", cmdSetPlan},
		{"disable-tenant", "refuse every request of a tenant, on every node (operator)", cmdDisableTenant},
		{"enable-tenant", "undo disable-tenant (operator)", cmdEnableTenant},
		{"make-operator", "give an account the operator role in the dashboard (operator)", cmdMakeOperator},
		{"purge", "delete stored outputs older than N days (operator)", cmdPurge},
		{"image", "build sandbox root filesystems (operator)", cmdImage},
		{"doctor", "check the host and self-test sandbox isolation (operator)", cmdDoctor},
		{"bench", "measure execution latency and throughput against bare interpreters", cmdBench},
		{"version", "print the version", cmdVersion},
	}
}

func cmdVersion(_ context.Context, e *env, _ []string) error {
	fmt.Fprintln(e.Stdout, "vertal", version)
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: vertal <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'vertal <command> -h' for a command's flags.")
}

func main() {
	os.Exit(realMain(os.Args[1:]))
}

func realMain(args []string) int {
	e := &env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.Stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, e, args[1:])
		var code exitCode
		switch {
		case err == nil:
			return 0
		case errors.As(err, &code):
			return int(code)
		default:
			fmt.Fprintf(e.Stderr, "vertal %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(e.Stderr, "vertal: unknown command %q\n\n", args[0])
	usage(e.Stderr)
	return 2
}
