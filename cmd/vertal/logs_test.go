package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeHost answers the probes of `vertal logs` as a host with some of
// the unit, the container and the compose service would, and records
// the command it was asked to run.
type fakeHost struct {
	unit      string // loaded systemd unit ("" none; "nosystemd" makes systemctl fail)
	container string // container by that name
	service   string // compose service label
	composed  string // the container compose made for service
	ran       []string
}

func (h *fakeHost) Output(_ context.Context, name string, args ...string) ([]byte, error) {
	line := name + " " + strings.Join(args, " ")
	switch {
	case name == "systemctl" && h.unit == "nosystemd":
		return nil, errors.New("System has not been booted with systemd as init system (PID 1). Can't operate.")
	case name == "systemctl":
		if args[len(args)-1] == h.unit+".service" {
			return []byte("loaded\n"), nil
		}
		return []byte("not-found\n"), nil
	case strings.HasPrefix(line, "docker container inspect"):
		if h.container != "" && args[len(args)-1] == h.container {
			return []byte("/" + h.container + "\n"), nil
		}
		return nil, &exec.ExitError{}
	case strings.HasPrefix(line, "docker ps"):
		if h.service != "" && strings.Contains(line, "com.docker.compose.service="+h.service+" ") {
			return []byte(h.composed + "\n"), nil
		}
		return []byte{}, nil
	}
	return nil, exec.ErrNotFound
}

func (h *fakeHost) Run(_ context.Context, stdout, _ io.Writer, name string, args ...string) error {
	h.ran = append(h.ran, name+" "+strings.Join(args, " "))
	_, err := io.WriteString(stdout, "a log line\n")
	return err
}

func TestLogsChoosesSource(t *testing.T) {
	for _, tc := range []struct {
		name    string
		host    fakeHost
		args    []string
		want    string // the command run; "" when none should be
		wantErr string
	}{
		{name: "unit exists", host: fakeHost{unit: "vertal", container: "vertal"},
			want: "journalctl --unit vertal.service --no-pager --lines 100"},
		{name: "unit, follow, all lines", host: fakeHost{unit: "vertal"}, args: []string{"-f", "--lines", "0"},
			want: "journalctl --unit vertal.service --no-pager --lines all --follow"},
		{name: "no systemd: the container", host: fakeHost{unit: "nosystemd", container: "vertal"}, args: []string{"--lines", "20"},
			want: "docker logs --tail 20 vertal"},
		{name: "no unit: the compose service", host: fakeHost{service: "vertal", composed: "deploy-vertal-1"}, args: []string{"-f"},
			want: "docker logs --tail 100 --follow deploy-vertal-1"},
		{name: "--container skips journald", host: fakeHost{unit: "vertal", container: "api"}, args: []string{"--container", "api"},
			want: "docker logs --tail 100 api"},
		{name: "--unit names another unit", host: fakeHost{unit: "vertal-edge", container: "vertal"}, args: []string{"--unit", "vertal-edge"},
			want: "journalctl --unit vertal-edge.service --no-pager --lines 100"},
		{name: "--unit that does not exist", host: fakeHost{container: "vertal"}, args: []string{"--unit", "nope"},
			wantErr: "no systemd unit nope"},
		{name: "--container that does not exist", host: fakeHost{unit: "vertal"}, args: []string{"--container", "nope"},
			wantErr: "no Docker container or compose service named nope"},
		{name: "nothing found", host: fakeHost{unit: "nosystemd"},
			wantErr: "found neither the systemd unit vertal nor a Docker container or compose service vertal"},
		{name: "both flags", host: fakeHost{unit: "vertal"}, args: []string{"--unit", "a", "--container", "b"},
			wantErr: "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			e := &env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}
			h := tc.host
			err := runLogs(context.Background(), e, &h, tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one containing %q", err, tc.wantErr)
				}
				if len(h.ran) != 0 {
					t.Errorf("ran %v after refusing", h.ran)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{tc.want}, h.ran); diff != "" {
				t.Errorf("commands run (-want +got):\n%s", diff)
			}
			if out.String() != "a log line\n" {
				t.Errorf("stdout %q", out.String())
			}
		})
	}
}

func TestLogsBadArgs(t *testing.T) {
	for _, args := range [][]string{{"extra"}, {"--lines", "-1"}} {
		var errOut bytes.Buffer
		e := &env{Stdout: io.Discard, Stderr: &errOut, Getenv: func(string) string { return "" }}
		if err := runLogs(context.Background(), e, &fakeHost{unit: "vertal"}, args); !errors.Is(err, exitCode(2)) {
			t.Errorf("%v: %v, want exit status 2", args, err)
		}
	}
}
