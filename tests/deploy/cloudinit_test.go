package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cloudInitFile is the one-paste server (docs/DEPLOY.md, way A). Its real
// first boot is checked by hand under QEMU (scripts/vm-test.sh cloud-init):
// too long under TCG for CI.
const cloudInitFile = "deploy/hetzner/cloud-init.yaml"

// TestCloudInitSchema validates the file with Debian's cloud-init (scripts/
// setup.sh test installs it), and checks that the validator refuses what it
// should, so a pass means something.
func TestCloudInitSchema(t *testing.T) {
	requireE2E(t)
	good, err := os.ReadFile(filepath.Join(repoRoot(t), cloudInitFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		edit    func(string) string
		wantErr string // "" means valid
	}{
		{name: "as shipped", edit: func(s string) string { return s }},
		{name: "no #cloud-config header", edit: func(s string) string { return strings.TrimPrefix(s, "#cloud-config\n") },
			wantErr: `needs to begin with "#cloud-config"`},
		{name: "packages not a list", edit: func(s string) string { return s + "packages: 5\n" },
			wantErr: "packages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "user-data.yaml")
			if err := os.WriteFile(f, []byte(tc.edit(string(good))), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := tryRun(t, nil, "cloud-init", "schema", "--config-file", f)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("cloud-init schema: %v\n%s", err, out)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("cloud-init schema accepted it:\n%s", out)
			case tc.wantErr != "" && !strings.Contains(out, tc.wantErr):
				t.Fatalf("cloud-init schema: error without %q:\n%s", tc.wantErr, out)
			}
		})
	}
}

// TestCloudInitFillIns checks that what DEPLOY.md tells the reader to fill
// in is there, each marked, and that the units the docs name are written.
func TestCloudInitFillIns(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), cloudInitFile))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{
		"VERTAL_EDGE_SECRET=CHANGE-ME",
		"TUNNEL_TOKEN=CHANGE-ME",
		"VERTAL_IMAGE=ghcr.io/",
		"ssh-ed25519 AAAA-CHANGE-ME",
		"path: /etc/nftables.conf",
		"path: /etc/systemd/system/vertal.service",
		"path: /etc/systemd/system/vertal-tunnel.service",
		"path: /etc/systemd/system/vertal-update.timer",
		"tcp dport 22 accept",
		"policy drop",
		"-p 127.0.0.1:8080:8080",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("%s has no %q", cloudInitFile, want)
		}
	}
}
