package main

import (
	"strings"
	"testing"
)

// TestCommandFlags: every command answers -h with its usage on stderr and
// exit status 0, and an unknown flag with exit status 2 and the flag
// package's message first.
func TestCommandFlags(t *testing.T) {
	for _, c := range commands() {
		if c.name == "version" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			environ := map[string]string{"VERTAL_DATA_DIR": t.TempDir()}
			var sub []string // image dispatches; its build subcommand owns the flags
			switch c.name {
			case "image":
				sub = []string{"build"}
			case "sandbox":
				sub = []string{"create"}
			}
			synopsis := strings.Join(append([]string{"usage: vertal", c.name}, sub...), " ")

			got := runCLI(t, c.run, environ, "", append(sub, "-h")...)
			if got.Exit != 0 || got.Stdout != "" || !strings.HasPrefix(got.Stderr, synopsis) || !strings.Contains(got.Stderr, "\nflags:\n") {
				t.Errorf("-h: exit %d, stdout %q, stderr starts %q; want 0, nothing, %q and the flags", got.Exit, got.Stdout, firstLine(got.Stderr), synopsis)
			}
			got = runCLI(t, c.run, environ, "", append(sub, "--no-such-flag")...)
			if got.Exit != 2 || got.Stdout != "" || !strings.HasPrefix(got.Stderr, "flag provided but not defined: -no-such-flag\n") {
				t.Errorf("--no-such-flag: exit %d, stdout %q, stderr starts %q; want 2 and the flag package's message", got.Exit, got.Stdout, firstLine(got.Stderr))
			}
		})
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
