package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storetest"
)

// TestBackupWhileWriting copies a database that another store keeps
// writing to: the copy opens, passes its integrity check, holds what was
// written before it started, and the writer never fails.
func TestBackupWhileWriting(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "odd #dir %41")
	src := filepath.Join(dir, "vertal.db")
	live := openTemp(t, src)
	ctx := context.Background()
	day := time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)
	if _, err := live.CreateKey(ctx, storetest.NewKey("key_000000000001", "acme", "pro", "s1", day)); err != nil {
		t.Fatal(err)
	}
	save := func(i int) error {
		return live.SaveExecution(ctx, store.Execution{ID: fmt.Sprintf("exe_%032d", i), Tenant: "acme", KeyID: "key_000000000001",
			Language: "python", Status: "succeeded", Stdout: "42\n", CreatedAt: day, StartedAt: day, FinishedAt: day})
	}
	const before = 50
	for i := range before {
		if err := save(i); err != nil {
			t.Fatal(err)
		}
	}

	var wg sync.WaitGroup
	var written atomic.Int64
	stop := make(chan struct{})
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := before; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := save(i); err != nil {
				writeErr = err
				return
			}
			written.Add(1)
		}
	}()
	dest := filepath.Join(t.TempDir(), "backup.db")
	err := Backup(ctx, src, dest)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}
	if writeErr != nil {
		t.Fatalf("a write during the backup failed: %v", writeErr)
	}
	if written.Load() == 0 {
		t.Log("no write landed during the backup (it was fast); consistency is still checked")
	}

	fi, err := os.Stat(dest)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("backup mode %v, want 0600", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dest), ".backup.db.partial-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	copied := openTemp(t, dest)
	keys, err := copied.ListKeys(ctx, "acme")
	if err != nil || len(keys) != 1 || keys[0].Plan != "pro" {
		t.Errorf("keys in the copy: %+v %v", keys, err)
	}
	for i := range before {
		if _, err := copied.Execution(ctx, "acme", fmt.Sprintf("exe_%032d", i)); err != nil {
			t.Errorf("execution %d missing from the copy: %v", i, err)
		}
	}
}

func TestBackupRefusals(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "vertal.db")
	openTemp(t, src)
	existing := filepath.Join(dir, "exists.db")
	if err := os.WriteFile(existing, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, src, dest string
		want            error
	}{
		{"destination exists", src, existing, ErrExists},
		{"destination is the database", src, src, ErrExists},
		{"no database", filepath.Join(dir, "missing.db"), filepath.Join(dir, "b1.db"), os.ErrNotExist},
		{"no destination directory", src, filepath.Join(dir, "nodir", "b.db"), os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Backup(context.Background(), tc.src, tc.dest); !errors.Is(err, tc.want) {
				t.Errorf("Backup: %v, want %v", err, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("existing destination overwritten: %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Backup created the missing source database")
	}
}
