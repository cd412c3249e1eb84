package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/doctor"
)

// TestDoctorEgressE2E runs `vertal doctor` as an operator would, with the
// agent next to the binary and a plan given egress by a flag, on the
// default driver (oci, its best runtime) and on docker: the relay check
// runs a sandbox that stays and passes, as an essential check.
func TestDoctorEgressE2E(t *testing.T) {
	needE2E(t)
	bin := vertalBinary(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"default", nil},
		{"docker", []string{"--driver", "docker", "--docker-image", dockerImage()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// t.TempDir's parent is private to root; bwrap runs as the
			// sandbox's uid and must pass it.
			state := t.TempDir()
			if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"doctor", "--json", "--pool-max", "0", "--state-dir", state, "--image-dir", imageDir(), "--egress", "pro:pypi.org"}, tc.args...)
			cmd := exec.Command(bin, args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Errorf("vertal doctor: %v\n%s\n%s", err, stdout.String(), stderr.String())
			}
			want := []doctor.Check{
				{Group: "egress", Name: "plans with egress", Status: doctor.StatusOK, Detail: "pro: pypi.org (100 MiB in and out per sandbox)"},
				{Group: "egress", Name: "egress relay", Status: doctor.StatusOK, Detail: "relay through the agent to the host's proxy socket works; no other route", Essential: true},
			}
			if diff := cmp.Diff(want, egressRows(t, stdout.String())); diff != "" {
				t.Errorf("egress rows (-want +got):\n%s\nstderr: %s", diff, stderr.String())
			}
		})
	}
}

// dockerImage is the image the docker driver runs (VERTAL_DOCKER_IMAGE).
func dockerImage() string {
	if img := os.Getenv("VERTAL_DOCKER_IMAGE"); img != "" {
		return img
	}
	return "vertal/default:latest"
}
