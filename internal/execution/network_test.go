package execution

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/egress/egresstest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
)

func TestNetworkFor(t *testing.T) {
	none := config.DefaultPlans()["pro"]
	open := none
	open.Egress = &config.Egress{Allow: []string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24"}}
	for _, tc := range []struct {
		name  string
		plan  config.Plan
		req   *NetworkRequest
		want  *Network
		error Kind
	}{
		{"no egress, nothing asked", none, nil, nil, 0},
		{"no egress, none asked", none, &NetworkRequest{Allow: []string{}}, nil, 0},
		{"allow left out", open, &NetworkRequest{}, nil, KindInvalidRequest},
		{"no egress, some asked", none, &NetworkRequest{Allow: []string{"pypi.org"}}, nil, KindForbidden},
		{"the plan's", open, nil, &Network{Allow: []string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24"}, MaxBytes: config.DefaultEgressMaxBytes}, 0},
		{"narrowed", open, &NetworkRequest{Allow: []string{"files.pythonhosted.org", "203.0.113.8/29"}},
			&Network{Allow: []string{"files.pythonhosted.org", "203.0.113.8/29"}, MaxBytes: config.DefaultEgressMaxBytes}, 0},
		{"turned off", open, &NetworkRequest{Allow: []string{}}, nil, 0},
		{"widened by name", open, &NetworkRequest{Allow: []string{"evil.example"}}, nil, KindForbidden},
		{"widened by wildcard", open, &NetworkRequest{Allow: []string{"*.example.org"}}, nil, KindForbidden},
		{"widened by prefix", open, &NetworkRequest{Allow: []string{"203.0.0.0/16"}}, nil, KindForbidden},
		{"not a rule", open, &NetworkRequest{Allow: []string{"http://pypi.org/"}}, nil, KindInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NetworkFor(tc.plan, tc.req)
			if tc.error != 0 {
				var e *Error
				if !errors.As(err, &e) || e.Kind != tc.error {
					t.Fatalf("NetworkFor: %v, want kind %v", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("NetworkFor = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestNetworkForRefusalListsThePlan: a 403 names the plan's rules as a
// plain comma-separated list.
func TestNetworkForRefusalListsThePlan(t *testing.T) {
	p := config.DefaultPlans()["pro"]
	p.Egress = &config.Egress{Allow: []string{"pypi.org", "*.pythonhosted.org"}}
	_, err := NetworkFor(p, &NetworkRequest{Allow: []string{"evil.example"}})
	want := `network.allow names what your plan does not allow ("evil.example"); your plan allows pypi.org, *.pythonhosted.org`
	if err == nil || err.Error() != want {
		t.Errorf("NetworkFor: %v\nwant %s", err, want)
	}
}

// TestNetworkWithin: a kept network (a paused sandbox's) is cut down to
// what the plan allows now; never widened.
func TestNetworkWithin(t *testing.T) {
	plan := func(maxBytes int64, allow ...string) config.Plan {
		p := config.DefaultPlans()["pro"]
		p.Egress = &config.Egress{Allow: allow, MaxBytes: maxBytes}
		return p
	}
	none := config.DefaultPlans()["pro"]
	none.Egress = nil
	pro := plan(1000, "allowed.test", "other.test", "*.example.org", "203.0.113.0/24")
	kept := &Network{Allow: []string{"allowed.test", "other.test", "*.example.org", "203.0.113.0/24"}, MaxBytes: 1000}
	for _, tc := range []struct {
		name    string
		plan    config.Plan
		kept    *Network
		want    *Network
		dropped []string
	}{
		{"no kept network", pro, nil, nil, nil},
		{"plan unchanged", pro, kept, kept, nil},
		{"plan narrowed", plan(1000, "allowed.test"), kept,
			&Network{Allow: []string{"allowed.test"}, MaxBytes: 1000}, []string{"other.test", "*.example.org", "203.0.113.0/24"}},
		{"plan without egress", none, kept, nil, kept.Allow},
		{"nothing left", plan(1000, "else.test"), kept, nil, kept.Allow},
		{"wildcard covers a kept name", plan(1000, "*.example.org"), &Network{Allow: []string{"api.example.org", "example.org"}, MaxBytes: 1000},
			&Network{Allow: []string{"api.example.org"}, MaxBytes: 1000}, []string{"example.org"}},
		{"a wider range covers a kept one", plan(1000, "203.0.0.0/16"), &Network{Allow: []string{"203.0.113.0/24", "198.51.100.0/24"}, MaxBytes: 1000},
			&Network{Allow: []string{"203.0.113.0/24"}, MaxBytes: 1000}, []string{"198.51.100.0/24"}},
		{"plan's cap smaller", plan(10, "allowed.test"), &Network{Allow: []string{"allowed.test"}, MaxBytes: 1000},
			&Network{Allow: []string{"allowed.test"}, MaxBytes: 10}, nil},
		{"kept cap smaller", plan(1000, "allowed.test"), &Network{Allow: []string{"allowed.test"}, MaxBytes: 10},
			&Network{Allow: []string{"allowed.test"}, MaxBytes: 10}, nil},
		{"kept has no cap", plan(1000, "allowed.test"), &Network{Allow: []string{"allowed.test"}},
			&Network{Allow: []string{"allowed.test"}, MaxBytes: 1000}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, dropped := NetworkWithin(tc.plan, tc.kept)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("NetworkWithin = %+v, want %+v", got, tc.want)
			}
			if fmt.Sprint(dropped) != fmt.Sprint(tc.dropped) {
				t.Errorf("dropped %q, want %q", dropped, tc.dropped)
			}
		})
	}
}

// netDriver stands in for a sandbox with a network: it fetches each URL
// of the code (one a line) through the socket in spec.EgressDir, as the
// agent's relay would carry a program's request, and prints the statuses.
type netDriver struct {
	*fakeDriver
	specs chan engine.Spec
}

func (d *netDriver) Run(ctx context.Context, spec engine.Spec) (engine.Result, error) {
	d.specs <- spec
	res := engine.Result{Status: engine.StatusSucceeded, Duration: time.Second}
	if spec.EgressDir == "" {
		return res, nil
	}
	c := egresstest.Client(filepath.Join(spec.EgressDir, egress.SocketName))
	for _, u := range strings.Fields(spec.Code) {
		r, err := c.Get(u)
		if err != nil {
			res.Stdout += "err\n"
			continue
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		res.Stdout += strconv.Itoa(r.StatusCode) + "\n"
	}
	c.CloseIdleConnections()
	return res, nil
}

// TestExecutionNetwork: an execution on a plan with egress gets a proxy
// of its own for its run, on the socket in the directory its Spec names,
// with the agent; its allowlist decides; what it reached is recorded with
// it, and the directory is gone after. [] is none; a wider list is 403;
// a server without egress refuses one that would get a network.
func TestExecutionNetwork(t *testing.T) {
	site := egresstest.NewSite(t)
	dir := t.TempDir()
	h, err := egress.NewHost(egress.HostOptions{Dir: filepath.Join(dir, "net"), Guard: site.Guard, Resolver: site.Zone, HTTPPorts: []int{site.Port}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Reap(); err != nil {
		t.Fatal(err)
	}
	d := &netDriver{fakeDriver: newFakeDriver(), specs: make(chan engine.Spec, 4)}
	newService := func(eg *egress.Host) *Service {
		s, err := New(Options{Store: storefake.New(), Engine: enginetest.New(t, d, enginetest.Options(2)),
			Languages: []engine.Language{{Name: "python", File: "main.py"}}, Egress: eg, Agent: "/usr/lib/vertal/vertal-agent",
			Now: func() time.Time { return day0 }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := newService(h)
	c := caller("acme", 2)
	c.Plan.Egress = &config.Egress{Allow: []string{"allowed.test", "other.test"}, MaxBytes: 1 << 20}
	run := func(code string, nw *NetworkRequest) (store.Execution, engine.Spec) {
		t.Helper()
		req := request(code)
		req.Input.Network = nw
		out, err := s.Run(t.Context(), c, req)
		if err != nil {
			t.Fatal(err)
		}
		return out.Execution, <-d.specs
	}

	exe, spec := run(site.URL("allowed.test")+" "+site.URL("other.test"), &NetworkRequest{Allow: []string{"allowed.test"}})
	if spec.EgressDir != h.Dir(exe.ID) || spec.Agent != "/usr/lib/vertal/vertal-agent" {
		t.Errorf("spec: EgressDir %q, Agent %q; want %q and the agent", spec.EgressDir, spec.Agent, h.Dir(exe.ID))
	}
	if want := c.Plan.Limits(spec.Timeout).Pids + engine.RelayPids; spec.Limits.Pids != want {
		t.Errorf("pids %d, want the plan's and the relay's, %d", spec.Limits.Pids, want)
	}
	if exe.Stdout != "200\n403\n" {
		t.Errorf("through the execution's proxy: %q, want the allowed name's 200 and the other's 403", exe.Stdout)
	}
	var rec NetworkRecord
	if err := json.Unmarshal([]byte(exe.Network), &rec); err != nil {
		t.Fatalf("network record %q: %v", exe.Network, err)
	}
	if fmt.Sprint(rec.Allow) != "[allowed.test]" || rec.Connections != 1 || rec.Refused != 1 || rec.BytesIn == 0 || len(rec.Attempts) != 2 {
		t.Errorf("network record: %+v", rec)
	}
	if stored, err := s.Get(t.Context(), c, exe.ID); err != nil || stored.Network != exe.Network {
		t.Errorf("stored network %q (%v); the run's %q", stored.Network, err, exe.Network)
	}
	if _, err := os.Stat(h.Dir(exe.ID)); !os.IsNotExist(err) {
		t.Errorf("the execution's egress directory after the run: %v", err)
	}

	// Left out: the plan's list. []: none, and no record.
	exe, spec = run(site.URL("other.test"), nil)
	if exe.Stdout != "200\n" || spec.EgressDir == "" {
		t.Errorf("the plan's list: %q, EgressDir %q", exe.Stdout, spec.EgressDir)
	}
	exe, spec = run(site.URL("other.test"), &NetworkRequest{Allow: []string{}})
	if spec.EgressDir != "" || spec.Agent != "" || exe.Network != "" || spec.Limits.Pids != c.Plan.Limits(spec.Timeout).Pids {
		t.Errorf("no network: EgressDir %q, Agent %q, record %q", spec.EgressDir, spec.Agent, exe.Network)
	}

	req := request("x")
	req.Input.Network = &NetworkRequest{Allow: []string{"evil.test"}}
	if _, err := s.Run(t.Context(), c, req); kindOf(err) != KindForbidden {
		t.Errorf("a wider list: %v, want forbidden", err)
	}
	off := newService(nil)
	req.Input.Network = nil
	if _, err := off.Run(t.Context(), c, req); kindOf(err) != KindUnavailable {
		t.Errorf("a network on a server without egress: %v, want unavailable", err)
	}
	req.Input.Network = &NetworkRequest{Allow: []string{}}
	if _, err := off.Run(t.Context(), c, req); err != nil {
		t.Errorf("no network on a server without egress: %v", err)
	}
	<-d.specs
}

// TestNetworkHash: a request without a network hashes as before networks
// existed (so a retry across the upgrade replays), whether it leaves
// network out or asks for none; the list is part of the hash.
func TestNetworkHash(t *testing.T) {
	s := newTestService(t, 1)
	c := caller("acme", 1)
	hash := func(nw *NetworkRequest) string {
		req := request("print(1)")
		req.Input.Network = nw
		h, err := s.RequestHash(c, req.Input)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// The hash of this request before networks existed.
	const before = "5c85629c1c4d023c34fae3346fa6f1f3c9087af081cacdac6aa05d84ab3940a8"
	if h := hash(nil); h != before || hash(&NetworkRequest{Allow: []string{}}) != before {
		t.Errorf("hash without network: %s, %s; want %s", h, hash(&NetworkRequest{Allow: []string{}}), before)
	}
	c.Plan.Egress = &config.Egress{Allow: []string{"a.test", "b.test"}}
	s.opts.Egress, s.opts.Agent = &egress.Host{}, "/agent"
	if a, b := hash(&NetworkRequest{Allow: []string{"a.test"}}), hash(&NetworkRequest{Allow: []string{"b.test"}}); a == b || a == before || hash(&NetworkRequest{Allow: []string{}}) != before {
		t.Errorf("hashes with networks: %s, %s (none: %s)", a, b, hash(&NetworkRequest{Allow: []string{}}))
	}
}
