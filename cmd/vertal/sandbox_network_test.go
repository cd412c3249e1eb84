package main

import (
	"fmt"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/api/apitest"
	"github.com/kuboprotocol/vertal2kubo/internal/api/sandboxfake"
)

// TestSandboxCreateNetwork: vertal sandbox create sends --allow and
// --no-network as run does, and nothing without them (the plan's list).
func TestSandboxCreateNetwork(t *testing.T) {
	fake := sandboxfake.New()
	srv := apitest.New(t, fake)
	environ := map[string]string{"KUBO_API_URL": srv.URL, "KUBO_API_KEY": srv.Key}
	for _, tc := range []struct {
		args []string
		want string // the request's network, printed
	}{
		{nil, "<nil>"},
		{[]string{"--allow", "pypi.org", "--allow", "*.pythonhosted.org"}, "&{[pypi.org *.pythonhosted.org]}"},
		{[]string{"--no-network"}, "&{[]}"},
	} {
		got := runCLI(t, cmdSandbox, environ, "", append([]string{"create"}, tc.args...)...)
		if got.Exit != 0 {
			t.Fatalf("create %q: %+v", tc.args, got)
		}
		if n := fmt.Sprint(fake.LastCreate.Network); n != tc.want {
			t.Errorf("create %q: network %s, want %s", tc.args, n, tc.want)
		}
	}
	got := runCLI(t, cmdSandbox, environ, "", "create", "--allow", "pypi.org", "--no-network")
	if got != (cliResult{Stderr: "vertal sandbox create: --allow and --no-network cannot go together\n", Exit: 2}) {
		t.Errorf("--allow with --no-network: %+v", got)
	}
}
