package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/doctor"
)

// egressRows are the egress group of doctor's JSON report.
func egressRows(t *testing.T, stdout string) []doctor.Check {
	t.Helper()
	var rep doctor.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("doctor --json printed %q: %v", stdout, err)
	}
	var rows []doctor.Check
	for _, c := range rep.Checks {
		if c.Group == "egress" {
			rows = append(rows, c)
		}
	}
	return rows
}

// TestDoctorEgressHostOnly: the egress group lists the plans the flags
// and the config give egress, and --host-only skips the relay check.
func TestDoctorEgressHostOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ map[string]string
		args    []string
		plans   string
		crucial bool
	}{
		{"none", nil, nil, "no plan allows egress (sandboxes have no network)", false},
		{"flags", nil, []string{"--egress", "pro:pypi.org", "--egress", "pro:*.pythonhosted.org,free:203.0.113.0/24"},
			"free: 203.0.113.0/24 (100 MiB in and out per sandbox); pro: pypi.org, *.pythonhosted.org (100 MiB in and out per sandbox)", true},
		{"config file", nil, []string{"--config", "@"}, "pro: pypi.org (1 MiB in and out per sandbox)", true},
		{"environment", map[string]string{"VERTAL_EGRESS": "pro:pypi.org"}, nil, "pro: pypi.org (100 MiB in and out per sandbox)", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--host-only", "--json", "--image-dir", t.TempDir()}, tc.args...)
			if slices.Contains(args, "@") {
				file := filepath.Join(t.TempDir(), "vertal.json")
				if err := os.WriteFile(file, []byte(`{"plans": {"pro": {"egress": {"allow": ["pypi.org"], "max_bytes": 1048576}}}}`), 0o600); err != nil {
					t.Fatal(err)
				}
				args[slices.Index(args, "@")] = file
			}
			res := runCLI(t, cmdDoctor, tc.environ, "", args...)
			want := []doctor.Check{
				{Group: "egress", Name: "plans with egress", Status: doctor.StatusOK, Detail: tc.plans},
				{Group: "egress", Name: "egress relay", Status: doctor.StatusSkipped, Detail: "--host-only: no sandbox runs", Essential: tc.crucial},
			}
			if diff := cmp.Diff(want, egressRows(t, res.Stdout)); diff != "" {
				t.Errorf("egress rows (-want +got):\n%s\nstderr: %s", diff, res.Stderr)
			}
		})
	}
}
