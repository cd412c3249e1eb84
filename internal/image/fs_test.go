package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHarden(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"etc/passwd":        "root:x:0:0:root:/root:/bin/bash\n",
		"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
		"etc/resolv.conf":   "nameserver 10.0.0.1\n",
		"etc/hostname":      "build-host\n",
		"usr/bin/passwd":    "elf",
		"usr/bin/wall":      "elf",
		"usr/bin/python3":   "elf",
		"tmp/leftover":      "x",
		"dev/null":          "", // a regular file stands in for a node
		"etc/dpkg/dpkg.cfg": "",
	})
	mustChmod(t, filepath.Join(root, "usr/bin/passwd"), 0o755|fs.ModeSetuid)
	mustChmod(t, filepath.Join(root, "usr/bin/wall"), 0o755|fs.ModeSetgid)
	mustChmod(t, filepath.Join(root, "usr/bin/python3"), 0o755)

	rep, err := harden(root)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"/usr/bin/passwd", "/usr/bin/wall"}, rep.SetIDStripped); diff != "" {
		t.Errorf("stripped (-want +got):\n%s", diff)
	}
	if left, err := FindSetID(root); err != nil || len(left) != 0 {
		t.Errorf("setuid/setgid files left: %v %v", left, err)
	}
	for path, want := range map[string]fs.FileMode{
		"tmp":             fs.ModeDir | fs.ModeSticky | 0o777,
		"code":            fs.ModeDir | 0o755,
		"usr/bin/passwd":  0o755,
		"usr/bin/python3": 0o755,
	} {
		info, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode() != want {
			t.Errorf("%s mode %v; want %v", path, info.Mode(), want)
		}
	}
	for _, dir := range []string{"tmp", "code", "dev"} {
		if entries, _ := os.ReadDir(filepath.Join(root, dir)); len(entries) != 0 {
			t.Errorf("/%s not empty: %v", dir, entries)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "nobody:x:65534:65534:") {
		t.Errorf("passwd lacks the sandbox user:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(root, "etc/group"))
	if strings.Count(string(group), ":65534:") != 1 {
		t.Errorf("group should keep its one nogroup entry:\n%s", group)
	}
	for name, want := range map[string]string{"etc/resolv.conf": "", "etc/hostname": "sandbox\n"} {
		if b, _ := os.ReadFile(filepath.Join(root, name)); string(b) != want {
			t.Errorf("%s = %q; want %q (no build host identity)", name, b, want)
		}
	}
}

func mustChmod(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestTrim(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"usr/share/doc/bash/copyright":        "GPL",
		"usr/share/doc/bash/README.gz":        strings.Repeat("x", 1000),
		"usr/share/man/man1/bash.1.gz":        "man",
		"usr/share/locale/de/LC_MESSAGES/mo":  "de",
		"var/cache/apt/pkgcache.bin":          "cache",
		"var/lib/apt/lists/deb_InRelease":     "list",
		"var/lib/apt/lists/lock":              "",
		"var/log/dpkg.log":                    "log",
		"usr/lib/python3.11/json/__init__.py": "py",
		"etc/dpkg/dpkg.cfg.d/.keep":           "",
	})
	freed, err := trim(root)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			left = append(left, rel)
		}
		return nil
	})
	sort.Strings(left)
	want := []string{
		"etc/dpkg/dpkg.cfg.d/.keep",
		"etc/dpkg/dpkg.cfg.d/01-vertal-nodoc",
		"usr/lib/python3.11/json/__init__.py",
		"usr/share/doc/bash/copyright",
		"var/lib/apt/lists/lock",
	}
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("files left (-want +got):\n%s", diff)
	}
	if freed < 1000 {
		t.Errorf("freed %d bytes; want at least the README", freed)
	}
}

func TestWriteTarRoundTrip(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"usr/bin/python3.11": "elf", "etc/passwd": "root"})
	if err := os.Symlink("python3.11", filepath.Join(root, "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "usr/bin/python3.11"), filepath.Join(root, "usr/bin/pyhard")); err != nil {
		t.Fatal(err)
	}
	mustChmod(t, filepath.Join(root, "usr/bin/python3.11"), 0o755)
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o777); err != nil {
		t.Fatal(err)
	}
	mustChmod(t, filepath.Join(root, "tmp"), fs.ModeSticky|0o777)

	var buf bytes.Buffer
	if err := WriteTar(&buf, root); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		Type     byte
		Mode     int64
		Link     string
		Content  string
		Uname    string
		UIDIsSet bool
	}
	got := map[string]entry{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = entry{Type: h.Typeflag, Mode: h.Mode & 0o7777, Link: h.Linkname, Content: string(b), Uname: h.Uname, UIDIsSet: h.Uid == os.Getuid()}
	}
	want := map[string]entry{
		"etc/":               {Type: tar.TypeDir, Mode: 0o755, UIDIsSet: true},
		"etc/passwd":         {Type: tar.TypeReg, Mode: 0o644, Content: "root", UIDIsSet: true},
		"tmp/":               {Type: tar.TypeDir, Mode: 0o1777, UIDIsSet: true},
		"usr/":               {Type: tar.TypeDir, Mode: 0o755, UIDIsSet: true},
		"usr/bin/":           {Type: tar.TypeDir, Mode: 0o755, UIDIsSet: true},
		"usr/bin/pyhard":     {Type: tar.TypeReg, Mode: 0o755, Content: "elf", UIDIsSet: true},
		"usr/bin/python3":    {Type: tar.TypeSymlink, Mode: 0o777, Link: "python3.11", UIDIsSet: true},
		"usr/bin/python3.11": {Type: tar.TypeLink, Mode: 0o755, Link: "usr/bin/pyhard", UIDIsSet: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tar entries (-want +got):\n%s", diff)
	}
}

func TestInstallNode(t *testing.T) {
	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	for name, body := range map[string]string{
		"package/bin/node":              "#!node",
		"package/LICENSE":               "MIT",
		"package/include/node/v8.h":     "header",
		"package/share/man/man1/node.1": "man",
	} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "node.tgz")
	if err := os.WriteFile(path, tgz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := installNode(path, root); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(root, "usr/local/bin/node"))
	if err != nil || info.Mode() != 0o755 {
		t.Fatalf("node binary: %v %v", info, err)
	}
	if target, err := os.Readlink(filepath.Join(root, "usr/bin/node")); err != nil || target != "/usr/local/bin/node" {
		t.Errorf("/usr/bin/node -> %q, %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/include")); err == nil {
		t.Error("headers were extracted; only the binary and licence should be")
	}

	empty := filepath.Join(dir, "empty.tgz")
	var eb bytes.Buffer
	egz := gzip.NewWriter(&eb)
	tar.NewWriter(egz).Close()
	egz.Close()
	os.WriteFile(empty, eb.Bytes(), 0o644)
	if err := installNode(empty, root); err == nil || !strings.Contains(err.Error(), "no bin/node") {
		t.Errorf("installNode without a binary: %v", err)
	}
}

func TestReadImportStream(t *testing.T) {
	id, err := readImportStream(strings.NewReader(`{"status":"sha256:abc"}` + "\n"))
	if err != nil || id != "sha256:abc" {
		t.Errorf("got %q, %v", id, err)
	}
	_, err = readImportStream(strings.NewReader(`{"errorDetail":{"message":"no space left"},"error":"no space left"}`))
	if err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("error stream: %v", err)
	}
	if _, err := readImportStream(strings.NewReader("")); err == nil {
		t.Error("empty stream: want an error")
	}
}
