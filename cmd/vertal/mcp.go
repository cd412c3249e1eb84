package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"
)

// cmdMCP serves MCP on stdin/stdout for a local agent. Stdout carries the
// protocol only; diagnostics go to stderr.
func cmdMCP(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "mcp", `mcp [flags]

Serves the Model Context Protocol on stdin/stdout with the tools run_code
and get_usage, and, when the API offers sandboxes, create_sandbox,
run_command, read_file, write_file, list_files, pause_sandbox,
resume_sandbox and kill_sandbox. The tools call the Vertal Run API at
KUBO_API_URL with KUBO_API_KEY, so the key's quota, rate limit and metering
apply. Configure
it in an MCP client as the command "vertal" with the argument "mcp".`)
	var cf clientFlags
	cf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c, err := cf.clientOrUsage(e, "mcp")
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err = mcpserver.ServeStdio(ctx, c, e.Stdin, e.Stdout, mcpserver.Options{Version: version, Logger: logger})
	if err != nil {
		return fmt.Errorf("serving MCP on stdio: %w", err)
	}
	return nil
}
