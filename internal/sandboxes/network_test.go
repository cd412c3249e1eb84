package sandboxes

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/egress/egresstest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// egressFixture is a fixture whose service gives network to a plan
// allowing allowed.test and other.test, both served by one local site
// (the guard lets loopback through here, as no real one does).
func egressFixture(t *testing.T, warm int) (*fixture, config.Plan, string) {
	t.Helper()
	site := egresstest.NewSite(t)
	f := warmFixture(t, warm)
	h, err := egress.NewHost(egress.HostOptions{
		Dir:       filepath.Join(f.dir, "net"),
		Guard:     site.Guard,
		Resolver:  site.Zone,
		HTTPPorts: []int{site.Port},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Reap(); err != nil {
		t.Fatal(err)
	}
	f.s.opts.Egress = h
	p := config.DefaultPlans()["pro"]
	p.Egress = &config.Egress{Allow: []string{"allowed.test", "other.test"}, MaxBytes: 1 << 20}
	return f, p, strconv.Itoa(site.Port)
}

// through fetches u through sandbox id's proxy socket, as the agent's
// relay would carry a program's request; the status, or -1 when the
// socket is gone.
func through(t *testing.T, f *fixture, id, u string) (int, string) {
	t.Helper()
	resp, err := egresstest.Client(filepath.Join(f.s.opts.Egress.Dir(id), egress.SocketName)).Get(u)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestNetworkSandbox: a sandbox with network gets its own proxy with its
// own policy, the agent's relay and the proxy environment; its attempts
// are counted and shown; ending it closes the proxy and removes its
// socket. A sandbox without network gets none of it.
func TestNetworkSandbox(t *testing.T) {
	for _, warm := range []int{0, 1} {
		t.Run(fmt.Sprintf("warm=%d", warm), func(t *testing.T) {
			f, p, port := egressFixture(t, warm)
			if warm > 0 {
				f.create(t, caller("warmup", p), CreateRequest{TimeoutS: 60, Network: &NetworkRequest{Allow: []string{}}})
				waitWarm(t, f, 1)
			}
			a := f.create(t, caller("acme", p), CreateRequest{TimeoutS: 60, Env: map[string]string{"HTTP_PROXY": "http://elsewhere"}})
			b := f.create(t, caller("beta", p), CreateRequest{TimeoutS: 60, Network: &NetworkRequest{Allow: []string{"other.test"}}})
			if warm > 0 && f.s.warm.stats().Hits == 0 {
				t.Fatalf("no create took the pre-started sandbox: %+v", f.s.warm.stats())
			}
			if code, body := through(t, f, a.ID, "http://allowed.test:"+port+"/"); code != 200 || body != "hello from allowed.test:"+port {
				t.Errorf("a to allowed.test: %d %q", code, body)
			}
			if code, _ := through(t, f, a.ID, "http://evil.test:"+port+"/"); code == 200 {
				t.Errorf("a reached a name outside its allowlist")
			}
			if code, _ := through(t, f, b.ID, "http://allowed.test:"+port+"/"); code == 200 {
				t.Errorf("b reached allowed.test, which its own request left out: the policies are mixed")
			}
			if code, _ := through(t, f, b.ID, "http://other.test:"+port+"/"); code != 200 {
				t.Errorf("b to other.test: %d", code)
			}

			for _, sb := range []Sandbox{a, b} {
				l := f.starter.byID(sb.ID)
				if got := l.ag.getEgress(); !slices.Equal(got, []string{engine.EgressSocket + ":3128"}) {
					t.Errorf("%s: relays %q", sb.ID, got)
				}
				if env := l.ag.getEnv(); env["HTTPS_PROXY"] != "http://127.0.0.1:3128" || env["HTTP_PROXY"] != "http://127.0.0.1:3128" || env["NODE_USE_ENV_PROXY"] != "1" {
					t.Errorf("%s: env %v", sb.ID, env)
				}
			}
			got, err := f.s.Get(t.Context(), caller("acme", p), a.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Limits.Network == nil || !slices.Equal(got.Limits.Network.Allow, []string{"allowed.test", "other.test"}) || got.Limits.Network.MaxBytes != 1<<20 {
				t.Errorf("limits.network = %+v", got.Limits.Network)
			}
			if n := got.Network; n == nil || n.Connections != 1 || n.Refused != 1 || n.BytesIn == 0 || n.BytesOut == 0 || len(n.Attempts) != 2 {
				t.Errorf("network usage = %+v", n)
			} else if at := n.Attempts[1]; at.Host != "evil.test" || at.Allowed || at.Reason == "" {
				t.Errorf("the refused attempt = %+v", at)
			}
			if _, err := f.s.Kill(t.Context(), caller("acme", p), a.ID); err != nil {
				t.Fatal(err)
			}
			if code, _ := through(t, f, a.ID, "http://allowed.test:"+port+"/"); code != -1 {
				t.Errorf("a killed sandbox's proxy still answers: %d", code)
			}
			if _, err := os.Stat(f.s.opts.Egress.Dir(a.ID)); !os.IsNotExist(err) {
				t.Errorf("a killed sandbox's egress directory: %v", err)
			}

			free := f.create(t, caller("gamma", config.DefaultPlans()["pro"]), CreateRequest{TimeoutS: 60})
			if got := f.starter.byID(free.ID).ag.getEgress(); got != nil || free.Limits.Network != nil {
				t.Errorf("a sandbox of a plan without egress: relays %q, limits.network %+v", got, free.Limits.Network)
			}
			if env := f.starter.byID(free.ID).ag.getEnv(); env["HTTP_PROXY"] != "" {
				t.Errorf("a sandbox without network has HTTP_PROXY %q", env["HTTP_PROXY"])
			}
		})
	}
}

// TestNetworkRefusedWithoutEgress: a server without egress refuses a
// create that would get network, before counting it.
func TestNetworkRefusedWithoutEgress(t *testing.T) {
	f := newFixture(t)
	p := config.DefaultPlans()["pro"]
	p.Egress = &config.Egress{Allow: []string{"pypi.org"}}
	_, err := f.s.Create(t.Context(), caller("acme", p), "", CreateRequest{})
	wantKind(t, "create", err, execution.KindUnavailable)
	if n := f.used(t, "acme"); n != 0 {
		t.Errorf("counted %d", n)
	}
}

// TestNetworkConnectionBound: a sandbox holds at most egress.MaxBoxConns
// connections to its proxy at once (code can open the socket itself,
// past the agent's relay); the next waits until one ends.
func TestNetworkConnectionBound(t *testing.T) {
	f, p, port := egressFixture(t, 0)
	sb := f.create(t, caller("acme", p), CreateRequest{TimeoutS: 60})
	sock := filepath.Join(f.s.opts.Egress.Dir(sb.ID), egress.SocketName)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range egress.MaxBoxConns {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	ask := func() (net.Conn, chan string) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET http://allowed.test:%s/ HTTP/1.1\r\nHost: allowed.test:%s\r\nConnection: close\r\n\r\n", port, port)
		got := make(chan string, 1)
		go func() { b, _ := io.ReadAll(c); got <- string(b) }()
		return c, got
	}
	c, got := ask()
	defer c.Close()
	select {
	case b := <-got:
		t.Fatalf("connection %d was served past the bound: %q", egress.MaxBoxConns+1, b)
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	select {
	case b := <-got:
		if !strings.Contains(b, "200 OK") {
			t.Errorf("once a slot was free: %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a freed slot did not let the waiting connection in")
	}
}

// TestNetworkResume: a paused sandbox resumes with its kept
// network only as far as the caller's plan allows it now, whether the
// key moved to a plan without egress or the operator narrowed the plan's
// list; the resume is not refused, the proxy it gets enforces the
// narrowed list, its record shows it, and the narrowing is logged.
func TestNetworkResume(t *testing.T) {
	for _, tc := range []struct {
		name string
		now  func(p config.Plan) config.Plan // the plan at resume
		want []string                        // the resumed sandbox's allowlist; nil is no network
	}{
		{"free", func(p config.Plan) config.Plan { p.Egress = nil; return p }, nil},
		{"narrow", func(p config.Plan) config.Plan {
			p.Egress = &config.Egress{Allow: []string{"allowed.test"}, MaxBytes: 1 << 20}
			return p
		}, []string{"allowed.test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, p, port := egressFixture(t, 0)
			var logs e2etest.Buffer
			f.s.log = slog.New(slog.NewTextHandler(&logs, nil))
			ctx := t.Context()
			sb := f.create(t, caller("acme", p), CreateRequest{TimeoutS: 60})
			if _, err := f.s.Pause(ctx, caller("acme", p), sb.ID); err != nil {
				t.Fatal(err)
			}
			now := caller("acme", tc.now(p))
			resumed, err := f.s.Resume(ctx, now, sb.ID)
			if err != nil || resumed.Status != StatusRunning {
				t.Fatalf("Resume = %+v, %v", resumed, err)
			}
			got, err := f.s.Get(ctx, now, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			for what, nw := range map[string]*Network{"the resume's": resumed.Limits.Network, "the record's": got.Limits.Network} {
				if tc.want == nil && nw != nil || tc.want != nil && (nw == nil || !slices.Equal(nw.Allow, tc.want) || nw.MaxBytes != 1<<20) {
					t.Errorf("%s limits.network = %+v, want %q", what, nw, tc.want)
				}
			}
			l := f.starter.last()
			env := l.ag.getEnv()
			if tc.want == nil {
				if relays := l.ag.getEgress(); relays != nil || env["HTTP_PROXY"] != "" {
					t.Errorf("resumed without network yet relays %q, HTTP_PROXY %q", relays, env["HTTP_PROXY"])
				}
				if code, _ := through(t, f, sb.ID, "http://other.test:"+port+"/"); code != -1 {
					t.Errorf("a proxy answers for a sandbox resumed without network: %d", code)
				}
			} else {
				if env["HTTP_PROXY"] == "" {
					t.Error("resumed with network but no HTTP_PROXY")
				}
				if code, body := through(t, f, sb.ID, "http://allowed.test:"+port+"/"); code != 200 {
					t.Errorf("to allowed.test, still allowed: %d %q", code, body)
				}
				if code, body := through(t, f, sb.ID, "http://other.test:"+port+"/"); code == 200 || !strings.Contains(body, "not in the allowlist") {
					t.Errorf("to other.test, dropped from the plan: %d %q", code, body)
				}
			}
			if out := logs.String(); !strings.Contains(out, "narrows its network") || !strings.Contains(out, sb.ID) || !strings.Contains(out, "other.test") {
				t.Errorf("the narrowing is not logged:\n%s", out)
			}
		})
	}
}
