package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cloudInitFile is the one-paste server (docs/DEPLOY.md, way A). Its real
// first boot is checked by hand under QEMU (scripts/vm-test.sh cloud-init,
// 11 to 16 minutes under TCG, too long for CI's 30 next to the VM smoke);
// CI checks the file's schema and its firewall here.
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
			checkVerdict(t, "cloud-init schema", out, err, tc.wantErr)
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

// writeFileContent returns the content of the write_files entry for path in
// a cloud-config, its block scalar ("content: |") with the indentation
// removed. A text scan, not a YAML parser: the file's layout is ours, and
// TestCloudInitSchema checks it is valid YAML.
func writeFileContent(t *testing.T, cloudConfig, path string) string {
	t.Helper()
	lines := strings.Split(cloudConfig, "\n")
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == "- path: "+path {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("no write_files entry for %s", path)
	}
	for i := start + 1; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "- path:") {
			break
		}
		if l != "content: |" {
			continue
		}
		var body []string
		indent := -1
		for _, b := range lines[i+1:] {
			if strings.TrimSpace(b) == "" {
				body = append(body, "")
				continue
			}
			n := len(b) - len(strings.TrimLeft(b, " "))
			if indent < 0 {
				indent = n
			}
			if n < indent {
				break
			}
			body = append(body, b[indent:])
		}
		return strings.TrimRight(strings.Join(body, "\n"), "\n") + "\n"
	}
	t.Fatalf("the write_files entry for %s has no \"content: |\"", path)
	return ""
}

// TestCloudInitFirewall checks the nftables ruleset the file writes to
// /etc/nftables.conf with the nft of Debian 12 (scripts/setup.sh test
// installs nftables): `nft -c` parses it and checks it against the kernel
// without changing anything, and in a network namespace of its own it is
// loaded for real, twice (a reboot or `systemctl reload nftables` loads the
// file again over the table it made), leaving one table whose input chain
// drops by default and accepts only port 22. A broken ruleset must be
// refused, so a pass means something. The boot itself, with a connection
// attempt from outside, is scripts/vm-test.sh cloud-init.
func TestCloudInitFirewall(t *testing.T) {
	requireE2E(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("no nft: scripts/setup.sh test installs nftables")
	}
	b, err := os.ReadFile(filepath.Join(repoRoot(t), cloudInitFile))
	if err != nil {
		t.Fatal(err)
	}
	ruleset := writeFileContent(t, string(b), "/etc/nftables.conf")
	for _, tc := range []struct {
		name    string
		ruleset string
		wantErr string // "" means valid
	}{
		{name: "as shipped", ruleset: ruleset},
		{name: "a typo", ruleset: strings.Replace(ruleset, "tcp dport 22 accept", "tcp dprt 22 accept", 1),
			wantErr: "syntax error"},
		{name: "an unknown hook", ruleset: strings.Replace(ruleset, "hook input", "hook inbound", 1),
			wantErr: "hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "nftables.conf")
			if err := os.WriteFile(f, []byte(tc.ruleset), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := tryRun(t, nil, "nft", "-c", "-f", f)
			checkVerdict(t, "nft -c -f", out, err, tc.wantErr)
		})
	}

	t.Run("loaded twice in a namespace", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "nftables.conf")
		if err := os.WriteFile(f, []byte(ruleset), 0o600); err != nil {
			t.Fatal(err)
		}
		out := run(t, nil, "unshare", "--net", "sh", "-ec",
			`nft -f "$1"; nft -f "$1"; nft list ruleset`, "sh", f)
		if n := strings.Count(out, "table inet vertal_firewall"); n != 1 {
			t.Errorf("%d vertal_firewall tables after two loads, want 1:\n%s", n, out)
		}
		for _, want := range []string{"hook input priority filter; policy drop;", "tcp dport 22 accept", `iif "lo" accept`} {
			if !strings.Contains(out, want) {
				t.Errorf("the loaded ruleset has no %q:\n%s", want, out)
			}
		}
		if n := strings.Count(out, "dport"); n != 1 {
			t.Errorf("%d port rules, want only port 22's:\n%s", n, out)
		}
	})
}

// checkVerdict checks a validator's answer: accepted when wantErr is "",
// else refused with wantErr in its output.
func checkVerdict(t *testing.T, validator, out string, err error, wantErr string) {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("%s: %v\n%s", validator, err, out)
	case wantErr != "" && err == nil:
		t.Fatalf("%s accepted it:\n%s", validator, out)
	case wantErr != "" && !strings.Contains(out, wantErr):
		t.Fatalf("%s: error without %q:\n%s", validator, wantErr, out)
	}
}
