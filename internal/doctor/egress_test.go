package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/agent"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

// fakeStarter is a driver that starts fake live sandboxes and remembers
// the last spec and whether its sandbox was discarded.
type fakeStarter struct {
	fakeDriver
	startErr error

	spec      engine.LiveSpec
	discarded bool
}

func (f *fakeStarter) Start(_ context.Context, spec engine.LiveSpec) (engine.Live, error) {
	f.spec = spec
	if f.startErr != nil {
		return nil, f.startErr
	}
	return &fakeLive{s: f}, nil
}

type fakeLive struct{ s *fakeStarter }

func (l *fakeLive) Conn() io.ReadWriteCloser { return nopConn{} }
func (l *fakeLive) Done() <-chan struct{}    { return nil }
func (l *fakeLive) Usage() engine.Usage      { return engine.Usage{} }
func (l *fakeLive) MemoryBytes() int64       { return 0 }
func (l *fakeLive) Discard(context.Context) error {
	// The host's directory is still there while the sandbox goes.
	if _, err := os.Stat(l.s.spec.EgressDir); err != nil {
		return err
	}
	l.s.discarded = true
	return nil
}

type nopConn struct{}

func (nopConn) Read([]byte) (int, error)    { return 0, io.EOF }
func (nopConn) Write(b []byte) (int, error) { return len(b), nil }
func (nopConn) Close() error                { return nil }

// fakeAgent plays the agent and relayProgram: with relay "host" the
// program dials the socket in the sandbox's EgressDir as the relay would
// and reports what came back; "self" answers with the token, as an echo
// inside the sandbox would; "closed" fails to connect.
type fakeAgent struct {
	dir       string
	egressErr error
	relay     string
	direct    string
	errno     int
	ifaces    []string

	egress string
	closed bool
}

func (a *fakeAgent) Ping(context.Context) error { return nil }
func (a *fakeAgent) Close() error               { a.closed = true; return nil }
func (a *fakeAgent) Egress(_ context.Context, socket string, port int) error {
	a.egress = socket + " " + strconv.Itoa(port)
	return a.egressErr
}

func (a *fakeAgent) Spawn(_ context.Context, r agent.SpawnRequest) (agent.Process, error) {
	if len(r.Argv) != 5 || r.Argv[0] != "python3" || r.Argv[2] != relayProgram || r.Argv[3] != strconv.Itoa(engine.EgressPort) {
		return nil, errors.New("unexpected argv")
	}
	token := r.Argv[4]
	out := map[string]any{"direct": a.direct, "interfaces": a.ifaces}
	if a.errno != 0 {
		out["direct_errno"] = a.errno
	}
	switch a.relay {
	case "host":
		got, err := dialEcho(filepath.Join(a.dir, filepath.Base(engine.EgressSocket)), token)
		if err != nil {
			out["relay_error"] = err.Error()
		} else {
			out["relay"] = got
		}
	case "self":
		out["relay"] = token
	default:
		out["relay_error"] = "ConnectionResetError: [Errno 104] Connection reset by peer"
	}
	b, _ := json.Marshal(out)
	p := &fakeProcess{events: make(chan agent.Event, 2)}
	p.events <- agent.Event{Stream: 1, Data: append(b, '\n')}
	p.events <- agent.Event{}
	close(p.events)
	return p, nil
}

func dialEcho(sock, token string) (string, error) {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, token); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

type fakeProcess struct{ events chan agent.Event }

func (p *fakeProcess) PID() int                                     { return 2 }
func (p *fakeProcess) Events() <-chan agent.Event                   { return p.events }
func (p *fakeProcess) Write(context.Context, []byte) error          { return agent.ErrExited }
func (p *fakeProcess) CloseStdin(context.Context) error             { return agent.ErrExited }
func (p *fakeProcess) Signal(context.Context, syscall.Signal) error { return agent.ErrExited }

var pypiPlans = map[string]config.Plan{
	"free": {},
	"pro":  {Egress: &config.Egress{Allow: []string{"pypi.org", "*.pythonhosted.org"}}},
	"team": {Egress: &config.Egress{Allow: []string{"203.0.113.0/24"}, MaxBytes: 1 << 20}},
}

func TestEgressPlans(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plans map[string]config.Plan
		want  string
	}{
		{"none", config.DefaultPlans(), "no plan allows egress (sandboxes have no network)"},
		{"two", pypiPlans, "pro: pypi.org, *.pythonhosted.org (100 MiB in and out per sandbox); team: 203.0.113.0/24 (1 MiB in and out per sandbox)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := Check{Group: "egress", Name: "plans with egress", Status: StatusOK, Detail: tc.want}
			if diff := cmp.Diff(want, egressPlans(tc.plans)); diff != "" {
				t.Errorf("egressPlans (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEgressRelay drives the relay check through a fake driver and agent
// whose "sandbox" reaches the doctor's real socket.
func TestEgressRelay(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	const dockerFix = "dockerd's runsc runtime needs --host-uds=open: rerun scripts/dockerd.sh"
	const leakFix = "a sandbox must have loopback only (its own network namespace; runsc --network=none); do not give any plan egress until this passes"
	unreach := int(syscall.ENETUNREACH)
	lo := []string{"lo"}
	for _, tc := range []struct {
		name     string
		driver   string
		plans    map[string]config.Plan
		startErr error
		agent    fakeAgent
		want     Check // Group and Name are filled in
		// detail is a part of want.Detail when want.Detail is empty.
		detail    string
		discarded bool
	}{
		{name: "works", driver: "oci/crun", plans: pypiPlans,
			agent:     fakeAgent{relay: "host", direct: "Network is unreachable (ENETUNREACH)", errno: unreach, ifaces: lo},
			want:      Check{Status: StatusOK, Detail: egressOKDetail, Essential: true},
			discarded: true},
		{name: "gVisor says host unreachable", driver: "oci/runsc",
			agent:     fakeAgent{relay: "host", direct: "No route to host (EHOSTUNREACH)", errno: int(syscall.EHOSTUNREACH), ifaces: lo},
			want:      Check{Status: StatusOK, Detail: egressOKDetail},
			discarded: true},
		{name: "relay closed under docker/runsc", driver: "docker/runsc",
			agent:  fakeAgent{relay: "closed", errno: unreach, ifaces: lo},
			want:   Check{Status: StatusFail, Fix: dockerFix},
			detail: "connecting to 127.0.0.1:3128 in the sandbox: ConnectionResetError", discarded: true},
		{name: "relay closed, a plan needs it", driver: "docker/runsc", plans: pypiPlans,
			agent:  fakeAgent{relay: "closed", errno: unreach, ifaces: lo},
			want:   Check{Status: StatusFail, Fix: dockerFix, Essential: true},
			detail: "(the host's socket was reached 0 times)", discarded: true},
		{name: "an echo inside the sandbox", driver: "oci/runc",
			agent:  fakeAgent{relay: "self", errno: unreach, ifaces: lo},
			want:   Check{Status: StatusFail, Fix: relayFix("oci/runc")},
			detail: "not the host's answer", discarded: true},
		{name: "a route of its own", driver: "oci/runc",
			agent:  fakeAgent{relay: "host", direct: "connected", ifaces: lo},
			want:   Check{Status: StatusFail, Fix: leakFix, Essential: true},
			detail: "did not fail at once for want of a route: connected (the relay works)", discarded: true},
		{name: "a timeout is a route too", driver: "oci/runc",
			agent:  fakeAgent{relay: "closed", direct: "timed out", ifaces: lo},
			want:   Check{Status: StatusFail, Fix: leakFix, Essential: true},
			detail: "route: timed out; and connecting to 127.0.0.1:3128", discarded: true},
		{name: "an interface besides lo", driver: "oci/runc",
			agent:  fakeAgent{relay: "host", errno: unreach, ifaces: []string{"eth0", "lo"}},
			want:   Check{Status: StatusFail, Fix: leakFix, Essential: true},
			detail: "interfaces besides lo: eth0, lo", discarded: true},
		{name: "the agent refuses the relay", driver: "oci/runsc",
			agent:  fakeAgent{egressErr: agent.ErrInvalid},
			want:   Check{Status: StatusFail, Fix: relayFix("oci/runsc")},
			detail: "starting the agent's relay: agent: invalid request", discarded: true},
		{name: "the driver cannot start it", driver: "docker/runsc", startErr: errors.New("runsc: unknown flag --host-uds"),
			want:   Check{Status: StatusFail, Fix: dockerFix},
			detail: "starting a sandbox that stays with an egress directory: runsc: unknown flag --host-uds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeStarter{fakeDriver: fakeDriver{name: tc.driver}, startErr: tc.startErr}
			a := tc.agent
			connect := func(io.ReadWriteCloser) sandboxAgent { a.dir = d.spec.EgressDir; return &a }
			rep := Run(context.Background(), Options{Driver: d, Languages: []engine.Language{{Name: "python", Image: "/images/default/rootfs"}},
				Probes: []probes.Probe{}, Egress: &EgressOptions{Plans: tc.plans, Agent: "/usr/bin/vertal-agent", connect: connect}})
			got := rep.Checks[len(rep.Checks)-1]
			want := tc.want
			want.Group, want.Name = "egress", "egress relay"
			if want.Detail == "" {
				if !strings.Contains(got.Detail, tc.detail) {
					t.Errorf("detail %q lacks %q", got.Detail, tc.detail)
				}
				want.Detail = got.Detail
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("relay row (-want +got):\n%s", diff)
			}
			if rep.Checks[len(rep.Checks)-2].Name != "plans with egress" {
				t.Errorf("rows: %+v", rep.Checks)
			}
			s := d.spec
			if !strings.HasPrefix(s.ID, "sbx_") || len(s.ID) != 36 || s.Image != "/images/default/rootfs" || s.Agent != "/usr/bin/vertal-agent" ||
				s.HomeBytes <= 0 || s.Limits.Validate() != nil || !s.Deadline.After(time.Now()) || !filepath.IsAbs(s.EgressDir) {
				t.Errorf("spec: %+v", s)
			}
			if _, err := os.Stat(s.EgressDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the egress directory %s after the check: %v", s.EgressDir, err)
			}
			if d.discarded != tc.discarded {
				t.Errorf("discarded = %v, want %v", d.discarded, tc.discarded)
			}
			if tc.discarded && (!a.closed || (tc.agent.egressErr == nil && a.egress != "/.vertal/net/proxy.sock 3128")) {
				t.Errorf("agent closed %v, egress %q", a.closed, a.egress)
			}
		})
	}
}

// TestEgressSkipped: the relay row is skipped, never failed, when no
// sandbox that stays can run, and the plans row is there anyway.
func TestEgressSkipped(t *testing.T) {
	python := []engine.Language{{Name: "python"}}
	starter := &fakeStarter{fakeDriver: fakeDriver{name: "oci/crun"}}
	for _, tc := range []struct {
		name string
		opts Options
		eo   EgressOptions
		want string
	}{
		{"host only", Options{HostOnly: true}, EgressOptions{Agent: "/a"}, "--host-only: no sandbox runs"},
		{"no driver", Options{DriverName: "oci/crun", DriverErr: errors.New("no crun")}, EgressOptions{Agent: "/a"}, "no working driver"},
		{"not a starter", Options{Driver: &fakeDriver{name: "fake"}, Languages: python}, EgressOptions{Agent: "/a"}, "the driver fake cannot start sandboxes that stay"},
		{"no agent", Options{Driver: starter, Languages: python}, EgressOptions{AgentErr: errors.New("no vertal-agent next to vertal or on PATH")}, "no vertal-agent next to vertal or on PATH"},
		{"no python", Options{Driver: starter, Languages: []engine.Language{{Name: "bash"}}}, EgressOptions{Agent: "/a"}, "language python is not configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Probes = []probes.Probe{}
			tc.eo.Plans = pypiPlans
			tc.opts.Egress = &tc.eo
			rep := Run(context.Background(), tc.opts)
			n := len(rep.Checks)
			if n < 2 {
				t.Fatalf("checks: %+v", rep.Checks)
			}
			want := []Check{
				egressPlans(pypiPlans),
				{Group: "egress", Name: "egress relay", Status: StatusSkipped, Detail: tc.want, Essential: true},
			}
			if diff := cmp.Diff(want, rep.Checks[n-2:]); diff != "" {
				t.Errorf("egress rows (-want +got):\n%s", diff)
			}
			if starter.spec.ID != "" {
				t.Errorf("a sandbox was started: %+v", starter.spec)
			}
		})
	}
}
