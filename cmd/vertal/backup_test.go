package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestBackupCommand(t *testing.T) {
	dir := t.TempDir()
	if r := runOperator(t, cmdKey, dir, "acme", "pro"); r.err != nil {
		t.Fatal(r.err)
	}
	dest := filepath.Join(t.TempDir(), "b.db")
	for _, tc := range []struct {
		name    string
		dataDir string
		args    []string
		wantOut string
		wantErr string
	}{
		{"copies", dir, []string{dest}, "integrity ok", ""},
		{"never overwrites", dir, []string{dest}, "", "exists; not overwriting it"},
		{"no database", t.TempDir(), []string{filepath.Join(t.TempDir(), "c.db")}, "", "is --data-dir / VERTAL_DATA_DIR"},
		{"no destination", dir, nil, "", "exit status 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runOperator(t, cmdBackup, tc.dataDir, tc.args...)
			if tc.wantErr != "" {
				if r.err == nil || !strings.Contains(r.err.Error(), tc.wantErr) {
					t.Errorf("%v, want an error with %q", r.err, tc.wantErr)
				}
				return
			}
			if r.err != nil || !strings.Contains(r.stdout, tc.wantOut) {
				t.Errorf("%v %q", r.err, r.stdout)
			}
		})
	}
}

// TestBackupPostgres: PostgreSQL is backed up with pg_dump; the command
// says how and fails, without echoing the URL's password.
func TestBackupPostgres(t *testing.T) {
	var out, errOut bytes.Buffer
	e := &env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		return map[string]string{"VERTAL_DATABASE_URL": "postgres://vertal:hunter2@db:5432/vertal"}[k]
	}}
	err := cmdBackup(context.Background(), e, []string{filepath.Join(t.TempDir(), "x")})
	if !errors.Is(err, exitCode(1)) || !strings.Contains(errOut.String(), "pg_dump") || out.Len() != 0 {
		t.Errorf("%v %q %q", err, out.String(), errOut.String())
	}
	if strings.Contains(errOut.String(), "hunter2") {
		t.Errorf("password printed")
	}
}
