package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
)

type opResult struct {
	stdout, stderr string
	err            error
}

// runOperator runs an operator command against the SQLite store in dataDir.
func runOperator(t *testing.T, cmd func(context.Context, *env, []string) error, dataDir string, args ...string) opResult {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return map[string]string{"VERTAL_DATA_DIR": dataDir}[k] }}
	err := cmd(context.Background(), e, args)
	return opResult{out.String(), errOut.String(), err}
}

var keyLine = regexp.MustCompile(`^kubo_sk_[0-9A-Za-z]{43}\n$`)

// TestKeyCommands walks a key's life: create (key alone on stdout),
// list (never the key), revoke, and the refusals in between.
func TestKeyCommands(t *testing.T) {
	dir := t.TempDir()
	created := runOperator(t, cmdCreateKey, dir, "acme", "--plan", "pro")
	if created.err != nil || !keyLine.MatchString(created.stdout) {
		t.Fatalf("create-key: %v %q %q", created.err, created.stdout, created.stderr)
	}
	secret := strings.TrimSpace(created.stdout)
	keyID := regexp.MustCompile(`key_[0-9a-f]{12}`).FindString(created.stderr)
	if keyID == "" || !strings.Contains(created.stderr, "shown only once") {
		t.Errorf("stderr %q", created.stderr)
	}
	if r := runOperator(t, cmdCreateKey, dir, "--plan", "free", "globex"); r.err != nil {
		t.Fatalf("flags before the tenant: %v", r.err)
	}

	listed := runOperator(t, cmdListKeys, dir)
	if listed.err != nil || strings.Contains(listed.stdout, "kubo_sk_") || !strings.Contains(listed.stdout, keyID) ||
		!strings.Contains(listed.stdout, "globex") || !strings.Contains(listed.stdout, "active") {
		t.Errorf("list-keys: %v\n%s", listed.err, listed.stdout)
	}
	js := runOperator(t, cmdListKeys, dir, "acme", "--json")
	var k keyJSON
	if err := json.Unmarshal([]byte(js.stdout), &k); err != nil || k.ID != keyID || k.Plan != "pro" || k.RevokedAt != nil {
		t.Errorf("list-keys acme --json: %v %q", err, js.stdout)
	}

	// The key works against the store as the API uses it.
	st := openTestStore(t, dir)
	if got, err := st.KeyByHash(context.Background(), api.HashAPIKey(secret)); err != nil || got.Tenant != "acme" || got.Plan != "pro" {
		t.Errorf("KeyByHash: %+v %v", got, err)
	}

	if r := runOperator(t, cmdRevokeKey, dir, keyID); r.err != nil || r.stdout != "revoked "+keyID+"\n" {
		t.Errorf("revoke-key: %v %q", r.err, r.stdout)
	}
	if _, err := st.KeyByHash(context.Background(), api.HashAPIKey(secret)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoked key still found: %v", err)
	}
	if r := runOperator(t, cmdListKeys, dir, "acme"); !strings.Contains(r.stdout, "revoked ") {
		t.Errorf("list after revoke: %q", r.stdout)
	}

	for _, tc := range []struct {
		name string
		cmd  func(context.Context, *env, []string) error
		args []string
		want string
	}{
		{"revoke twice", cmdRevokeKey, []string{keyID}, "no active key"},
		{"revoke garbage", cmdRevokeKey, []string{"kubo_sk_oops"}, "not a key id"},
		{"unknown plan", cmdCreateKey, []string{"acme", "--plan", "gold"}, `unknown plan "gold"`},
		{"bad tenant", cmdCreateKey, []string{"Acme Corp"}, "tenant name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runOperator(t, tc.cmd, dir, tc.args...)
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("error %v, want %q", r.err, tc.want)
			}
		})
	}
	for i := 0; i < store.MaxActiveKeys-1; i++ {
		runOperator(t, cmdCreateKey, dir, "globex")
	}
	if r := runOperator(t, cmdCreateKey, dir, "globex"); r.err == nil || !strings.Contains(r.err.Error(), "already has 5 active keys") {
		t.Errorf("sixth key: %v", r.err)
	}
	for _, args := range [][]string{{}, {"a", "b"}} {
		var code exitCode
		if r := runOperator(t, cmdCreateKey, dir, args...); !errors.As(r.err, &code) || code != 2 {
			t.Errorf("create-key %v: %v", args, r.err)
		}
	}
}

func TestPurgeCommand(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir)
	ctx := context.Background()
	old := store.Execution{ID: "exe_00000000000000000000000000000001", Tenant: "acme", Language: "python", Status: "succeeded",
		Stdout: "old output", SandboxSeconds: 1, CreatedAt: time.Now().Add(-72 * time.Hour)}
	recent := old
	recent.ID, recent.Stdout, recent.CreatedAt = "exe_00000000000000000000000000000002", "new output", time.Now()
	for _, e := range []store.Execution{old, recent} {
		if err := st.SaveExecution(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// Sandboxes: one ended three days ago (purged), one ended an hour ago
	// and one still running (both kept).
	sst := st.(store.Sandboxes)
	for i, ended := range []time.Duration{72 * time.Hour, time.Hour, 0} {
		at := time.Now().Add(-96 * time.Hour)
		sb := store.Sandbox{ID: fmt.Sprintf("sbx_%026d", i), Tenant: "acme", KeyID: "key_1", Status: "running", Image: "default",
			ImageVersion: "v1", Limits: []byte(`{}`), OnTimeout: "kill", TimeoutS: 300, Node: "n", CreatedAt: at, StartedAt: at, ExpiresAt: at.Add(time.Hour)}
		if err := sst.CreateSandbox(ctx, sb, 10); err != nil {
			t.Fatal(err)
		}
		if ended > 0 {
			sb.Status, sb.Reason, sb.EndedAt = "ended", "killed", time.Now().Add(-ended)
			if err := sst.UpdateSandbox(ctx, sb, "running"); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := runOperator(t, cmdPurge, dir, "--days", "2")
	if r.err != nil || !strings.HasPrefix(r.stdout, "purged the output of 1 executions") || !strings.Contains(r.stdout, "the records of 1 sandboxes") {
		t.Fatalf("purge: %v %q", r.err, r.stdout)
	}
	for i, want := range []bool{false, true, true} {
		if _, err := sst.Sandbox(ctx, "acme", fmt.Sprintf("sbx_%026d", i)); (err == nil) != want {
			t.Errorf("sandbox %d after purge: %v, want kept %v", i, err, want)
		}
	}
	got, _ := st.Execution(ctx, "acme", old.ID)
	kept, _ := st.Execution(ctx, "acme", recent.ID)
	u, _ := st.Usage(ctx, "acme", old.CreatedAt.UTC().Format(time.DateOnly))
	if got.Stdout != "" || kept.Stdout != "new output" || u.SandboxSeconds != 1 {
		t.Errorf("after purge: old %q, recent %q, metering %v", got.Stdout, kept.Stdout, u.SandboxSeconds)
	}
	var code exitCode
	if r := runOperator(t, cmdPurge, dir); !errors.As(r.err, &code) || code != 2 {
		t.Errorf("purge without --days: %v", r.err)
	}
}

func openTestStore(t *testing.T, dir string) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "vertal.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestKeyShortForm: `vertal key NAME [PLAN]` is create-key with the plan
// positional, defaulting to free.
func TestKeyShortForm(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args     []string
		wantPlan string // "" when refused
		wantErr  string
	}{
		{args: []string{"acme", "pro"}, wantPlan: "pro"},
		{args: []string{"globex"}, wantPlan: "free"},
		{args: []string{"initech", "gold"}, wantErr: `unknown plan "gold"`},
		{args: []string{}, wantErr: "exit status 2"},
		{args: []string{"a", "pro", "extra"}, wantErr: "exit status 2"},
	} {
		r := runOperator(t, cmdKey, dir, tc.args...)
		if tc.wantErr != "" {
			if r.err == nil || !strings.Contains(r.err.Error(), tc.wantErr) || r.stdout != "" {
				t.Errorf("key %v: %v %q, want error %q and nothing on stdout", tc.args, r.err, r.stdout, tc.wantErr)
			}
			continue
		}
		if r.err != nil || !keyLine.MatchString(r.stdout) || !strings.Contains(r.stderr, "(plan "+tc.wantPlan+")") {
			t.Errorf("key %v: %v %q %q", tc.args, r.err, r.stdout, r.stderr)
			continue
		}
		k, err := openTestStore(t, dir).KeyByHash(context.Background(), api.HashAPIKey(strings.TrimSpace(r.stdout)))
		if err != nil || k.Tenant != tc.args[0] || k.Plan != tc.wantPlan {
			t.Errorf("key %v in the store: %+v %v", tc.args, k, err)
		}
	}
}
