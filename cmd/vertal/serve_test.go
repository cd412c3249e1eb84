package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

// TestCreateKeyHint: the create-key line serve prints names the server's
// database when it is not the default one.
func TestCreateKeyHint(t *testing.T) {
	rel, err := filepath.Abs("data")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  config.Config
		want string
	}{
		{"default", config.Config{DataDir: config.DefaultDataDir}, "vertal create-key local --plan pro"},
		{"data-dir", config.Config{DataDir: "/srv/vertal"}, "vertal create-key local --plan pro --data-dir /srv/vertal"},
		{"relative", config.Config{DataDir: "data"}, "vertal create-key local --plan pro --data-dir " + rel},
		{"spaces", config.Config{DataDir: "/srv/my vertal's"}, `vertal create-key local --plan pro --data-dir '/srv/my vertal'\''s'`},
		{"postgres", config.Config{DataDir: config.DefaultDataDir, DatabaseURL: "postgres://vertal:secret@db:5432/vertal"},
			"vertal create-key local --plan pro --database-url postgres://vertal:xxxxx@db:5432/vertal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, createKeyHint(tc.cfg, "local")); diff != "" {
				t.Errorf("hint (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDevKeyHintActsOnServerDB: a later --dev start prints the hint, and
// running it (from a shell whose VERTAL_DATA_DIR names another database)
// adds the key to the server's database.
func TestDevKeyHintActsOnServerDB(t *testing.T) {
	ctx := context.Background()
	serverDir, otherDir := t.TempDir(), t.TempDir()
	st := openTestStore(t, serverDir)
	if _, _, err := api.CreateKey(ctx, st, devTenant, "pro", time.Now()); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	e := &env{Stdout: &out, Stderr: &out}
	if err := devKey(ctx, e, st, "http://127.0.0.1:8080", createKeyHint(config.Config{DataDir: serverDir}, devTenant)); err != nil {
		t.Fatal(err)
	}
	_, hint, ok := strings.Cut(out.String(), "A new one: vertal create-key ")
	if !ok {
		t.Fatalf("no create-key hint in:\n%s", out.String())
	}
	if r := runOperator(t, cmdCreateKey, otherDir, strings.Fields(hint)...); r.err != nil {
		t.Fatalf("running the hint %q: %v\n%s", hint, r.err, r.stderr)
	}
	keys, err := st.ListKeys(ctx, devTenant)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("the server's database has %d keys for %s after running the hint; want 2", len(keys), devTenant)
	}
}
