package sandbox

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// TestCollectFiles lays out a working directory as a hostile program
// could and checks what comes back: regular files that match, in path
// order, within the caps; never what a symlink, FIFO or device points at.
func TestCollectFiles(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	must(t, os.WriteFile(secret, []byte("host secret"), 0o644))

	dir := t.TempDir()
	for p, content := range map[string]string{
		"a.png": "png", "b.txt": "text", "out/deep/c.csv": "1,2", "out/d.txt": "d", "big.bin": "0123456789",
	} {
		must(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, p), []byte(content), 0o644))
	}
	must(t, os.Symlink(secret, filepath.Join(dir, "leak.txt")))
	must(t, os.Symlink(outside, filepath.Join(dir, "out", "linkdir")))
	must(t, os.Symlink("../../"+secret, filepath.Join(dir, "out", "rel.txt")))
	must(t, syscall.Mkfifo(filepath.Join(dir, "out", "pipe.txt"), 0o644))

	for _, tc := range []struct {
		name      string
		globs     []string
		limits    engine.Limits
		want      []string
		truncated bool
	}{
		{"one glob", []string{"*.png"}, engine.Limits{}, []string{"a.png"}, false},
		{"double star", []string{"out/**"}, engine.Limits{}, []string{"out/d.txt", "out/deep/c.csv"}, false},
		{"everything", []string{"**"}, engine.Limits{}, []string{"a.png", "b.txt", "big.bin", "out/d.txt", "out/deep/c.csv"}, false},
		{"count cap", []string{"**"}, engine.Limits{ReturnFiles: 2}, []string{"a.png", "b.txt"}, true},
		{"bytes cap skips what does not fit", []string{"**"}, engine.Limits{ReturnBytes: 9}, []string{"a.png", "b.txt", "out/d.txt"}, true},
		{"symlinks never followed", []string{"*.txt", "out/*.txt", "out/linkdir/*"}, engine.Limits{}, []string{"b.txt", "out/d.txt"}, false},
		{"nothing matches", []string{"*.jpg"}, engine.Limits{}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, truncated, err := CollectFiles(dir, tc.globs, tc.limits.WithDefaults(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range files {
				got = append(got, f.Path)
				if string(f.Content) == "host secret" {
					t.Errorf("%s returned the host's file", f.Path)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("paths (-want +got):\n%s", diff)
			}
			if truncated != tc.truncated {
				t.Errorf("truncated = %v; want %v", truncated, tc.truncated)
			}
		})
	}
}

func TestCheckFilePath(t *testing.T) {
	for p, ok := range map[string]bool{
		"a.csv": true, "dir/sub/f.txt": true, "": false, "/etc/passwd": false, "../x": false, "a/../b": false,
		"./a": false, "a//b": false, "a/": false, "a\\b": false, "a\x00b": false,
	} {
		if err := CheckFilePath(p); (err == nil) != ok {
			t.Errorf("CheckFilePath(%q) = %v; want ok %v", p, err, ok)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
