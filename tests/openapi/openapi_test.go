// Package openapi_test checks internal/api/openapi.json with the tools a
// user of the API reaches for, pinned in package.json: Redocly's linter
// (no error, no warning), openapi-typescript with openapi-fetch, and
// @hey-api/openapi-ts, whose generated clients must type-check the obvious
// calls in fetch.ts and heyapi.ts (tsc --noEmit).
//
// Gated by VERTAL_E2E=1, which scripts/test.sh sets; it needs node with
// `npm ci` done here (scripts/setup.sh test does it).
package openapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

const doc = "../../internal/api/openapi.json"

func setup(t *testing.T) {
	t.Helper()
	e2etest.Require(t, "npm ci done in tests/openapi, to check openapi.json with Redocly and generated TypeScript clients")
	if _, err := os.Stat(filepath.Join("node_modules", ".bin", "redocly")); err != nil {
		t.Fatal("the OpenAPI tools are not installed: run npm ci in tests/openapi (scripts/setup.sh test)")
	}
}

// tool runs one of the pinned tools from node_modules/.bin here.
func tool(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join("node_modules", ".bin", name), args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", name, args, err, out.Bytes(), errOut.Bytes())
	}
	return out.Bytes()
}

// TestRedoclyLint: the recommended rules (redocly.yaml here) find nothing.
// The one ignored problem is listed in .redocly.lint-ignore.yaml.
func TestRedoclyLint(t *testing.T) {
	setup(t)
	out := tool(t, "redocly", "lint", doc, "--format=json")
	var res struct {
		Totals struct {
			Errors, Warnings, Ignored int
		}
		Problems []struct {
			RuleID, Message string
			Location        []struct{ Pointer string }
		}
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("redocly lint printed %q: %v", out, err)
	}
	if res.Totals.Errors != 0 || res.Totals.Warnings != 0 || res.Totals.Ignored != 2 {
		for _, p := range res.Problems {
			t.Logf("%s: %s %v", p.RuleID, p.Message, p.Location)
		}
		t.Errorf("redocly lint: %+v, want no errors or warnings and the two ignored (.redocly.lint-ignore.yaml)", res.Totals)
	}
}

// TestGeneratedClients generates types with openapi-typescript and a
// client with @hey-api/openapi-ts, with their defaults, and type-checks a
// POST /v1/executions {language, code} against each: optional request
// fields must be optional and the JSON answer typed as the Execution.
func TestGeneratedClients(t *testing.T) {
	setup(t)
	if err := os.RemoveAll("gen"); err != nil {
		t.Fatal(err)
	}
	tool(t, "openapi-typescript", doc, "-o", filepath.Join("gen", "schema.d.ts"))
	tool(t, "openapi-ts", "-f", "openapi-ts.config.mjs")
	for _, f := range []string{"gen/schema.d.ts", "gen/hey/sdk.gen.ts", "gen/hey/types.gen.ts"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("generated %s: %v", f, err)
		}
	}
	tool(t, "tsc", "-p", ".")
}
