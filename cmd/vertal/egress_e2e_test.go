//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest/fakenet"
)

// nsHost is the loopback address servers in a fake internet's ServerNS
// listen on: no server of the host's own namespace uses it, so a dial to
// it goes to the namespace registered for its port (nsDialers).
const nsHost = "127.0.0.2"

// nsDialers maps "127.0.0.2:port" to the dialer of the namespace that
// port's server listens in.
var nsDialers sync.Map

func init() {
	tr := http.DefaultTransport.(*http.Transport)
	plain := (&net.Dialer{Timeout: 30 * time.Second}).DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if d, ok := nsDialers.Load(addr); ok {
			return d.(func(context.Context, string, string) (net.Conn, error))(ctx, network, addr)
		}
		return plain(ctx, network, addr)
	}
}

// startNetServer starts a server in n's ServerNS, whose egress proxy
// resolves names with the fake internet's DNS server, and that the test's
// HTTP calls reach.
func startNetServer(t *testing.T, n *fakenet.Net, dataDir string, args ...string) *serverProc {
	t.Helper()
	p := startServerWith(t, n.NetCommand, dataDir, nil, append([]string{"--host", nsHost, "--metrics-addr", nsHost + ":0", "--egress-dns", n.DNSAddr}, args...)...)
	register := func(u string) {
		addr := strings.TrimPrefix(u, "http://")
		nsDialers.Store(addr, n.DialContext)
		t.Cleanup(func() { nsDialers.Delete(addr) })
	}
	register(p.url)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, l := range strings.Split(p.stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "metrics listening" {
				register("http://" + m["addr"].(string))
				return p
			}
		}
	}
	t.Fatal("the server never logged its metrics address")
	return nil
}

// egressProbe runs inside a sandbox: each argument is a probe, and it
// prints one JSON object of probe → result ("ok:<body>" or "err:<why>").
const egressProbe = `
import json, os, socket, ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=os.environ.get("CA", "/home/user/ca.pem"))
out = {}
for p in sys.argv[1:]:
    try:
        if p.startswith("http"):
            with urllib.request.urlopen(p, timeout=15, context=ctx) as r:
                body = r.read()
                out[p] = "ok:%d:%s" % (len(body), body[:60].decode(errors="replace"))
        elif p == "dns":
            out[p] = "ok:" + str(socket.getaddrinfo("allowed.test", 443))
        elif p.startswith("tcp:"):
            host, port = p[4:].rsplit(":", 1)
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
            out[p] = "ok"
        elif p.startswith("udp:"):
            host, port = p[4:].rsplit(":", 1)
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.sendto(b"exfiltrated", (host.strip("[]"), int(port)))
            out[p] = "ok:" + repr(s.recvfrom(100))
        elif p == "ifaces":
            out[p] = "ok:" + ",".join(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l))
    except Exception as e:
        out[p] = "err:%s:%s" % (type(e).__name__, str(e)[:120])
print(json.dumps(out))
`

// nodeFetch fetches its argument with Node's fetch, which follows
// HTTPS_PROXY with NODE_USE_ENV_PROXY (set in every sandbox with network).
const nodeFetch = `fetch(process.argv[1]).then(r => r.ok ? r.text() : Promise.reject(new Error("HTTP " + r.status))).then(t => console.log("ok:" + t.trim()), e => console.log("err:" + (e.cause ? e.cause.code || e.cause.message : e.message)))`

// nodeFetchArg is nodeFetch for a code file: the URL is its first
// argument.
var nodeFetchArg = strings.Replace(nodeFetch, "process.argv[1]", "process.argv[2]", 1)

// probeOnce runs egressProbe as a one-shot execution with network (nil:
// leave it out) and returns the execution and the probes' results.
func probeOnce(t *testing.T, p *serverProc, key string, ca []byte, network any, probes ...string) (map[string]any, map[string]string) {
	t.Helper()
	body := map[string]any{"language": "python", "code": egressProbe, "args": probes, "timeout_s": 60,
		"files": []map[string]string{{"path": "ca.pem", "content": string(ca)}}, "env": map[string]string{"CA": "/code/ca.pem"}}
	if network != nil {
		body["network"] = network
	}
	r := call(t, "POST", p.url+"/v1/executions", key, body, nil)
	if r.status != 200 || r.body["status"] != "succeeded" {
		t.Fatalf("one-shot probe: %d %s", r.status, r.raw)
	}
	out := map[string]string{}
	if err := json.Unmarshal([]byte(r.body["stdout"].(string)), &out); err != nil {
		t.Fatalf("probe output %q (stderr %q): %v", r.body["stdout"], r.body["stderr"], err)
	}
	return r.body, out
}

// oneShotEgress: one-shot executions on a plan with egress get the same
// network as sandboxes that stay: their own list (the plan's when they
// name none), by name only, HTTP and TLS, Python and Node; two at once
// keep their own; the byte cap cuts; [] is lo alone; a wider list is 403;
// the execution records its attempts and bytes, and its socket directory
// is gone once it ends.
func oneShotEgress(t *testing.T, p *serverProc, key string, ca []byte, data string) {
	exe, got := probeOnce(t, p, key, ca, map[string]any{"allow": []string{"allowed.test", "loop.test", "meta.test"}},
		"http://allowed.test/x", "https://allowed.test/x", "http://other.test/x", "https://203.0.113.10/x",
		"http://loop.test/x", "https://meta.test/x", "http://169.254.169.254/latest/meta-data/",
		"dns", "tcp:203.0.113.10:80", "tcp:[2001:db8::10]:443", "udp:203.0.113.10:9999", "ifaces")
	for _, probe := range []string{"http://allowed.test/x", "https://allowed.test/x"} {
		if !strings.Contains(got[probe], "hello from allowed.test /x") {
			t.Errorf("one-shot %s: %q", probe, got[probe])
		}
	}
	for _, probe := range []string{"http://other.test/x", "https://203.0.113.10/x", "http://loop.test/x", "https://meta.test/x",
		"http://169.254.169.254/latest/meta-data/", "dns", "tcp:203.0.113.10:80", "tcp:[2001:db8::10]:443", "udp:203.0.113.10:9999"} {
		if !strings.HasPrefix(got[probe], "err:") {
			t.Errorf("one-shot %s got through: %q", probe, got[probe])
		}
	}
	if got["ifaces"] != "ok:lo" {
		t.Errorf("interfaces in a one-shot sandbox with network: %q", got["ifaces"])
	}
	nw, _ := exe["network"].(map[string]any)
	usage, _ := exe["usage"].(map[string]any)
	if nw == nil || nw["connections"].(float64) < 2 || nw["refused"].(float64) < 4 || nw["bytes_in"].(float64) == 0 ||
		len(nw["attempts"].([]any)) < 6 || len(nw["allow"].([]any)) != 3 {
		t.Errorf("the execution's network: %v", exe["network"])
	}
	if usage == nil || usage["network_bytes_in"] == nil || usage["network_bytes_in"].(float64) != nw["bytes_in"].(float64) {
		t.Errorf("the execution's usage: %v", exe["usage"])
	}
	if g := call(t, "GET", p.url+"/v1/executions/"+exe["id"].(string), key, nil, nil); fmt.Sprint(g.body["network"]) != fmt.Sprint(exe["network"]) {
		t.Errorf("GET shows network %v; the run answered %v", g.body["network"], exe["network"])
	}
	if !strings.Contains(p.stderr.String(), `"msg":"egress","execution_id":"`+exe["id"].(string)) {
		t.Errorf("no egress audit line for %s in the log", exe["id"])
	}

	// The plan's list when the request names none; two at once, each its
	// own; Node's fetch.
	var wg sync.WaitGroup
	results := make([]map[string]string, 2)
	for i, nwReq := range []any{nil, map[string]any{"allow": []string{"other.test"}}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, results[i] = probeOnce(t, p, key, ca, nwReq, "https://allowed.test/p", "https://other.test/p")
		}()
	}
	wg.Wait()
	if !strings.Contains(results[0]["https://allowed.test/p"], "hello") || !strings.Contains(results[0]["https://other.test/p"], "hello") {
		t.Errorf("the plan's list, left out: %q", results[0])
	}
	if !strings.HasPrefix(results[1]["https://allowed.test/p"], "err:") || !strings.Contains(results[1]["https://other.test/p"], "hello from other.test /p") {
		t.Errorf("a parallel execution's own list: %q", results[1])
	}
	// (Plain HTTP: a request cannot set NODE_EXTRA_CA_CERTS for the fake
	// internet's CA, a reserved name; Node tunnels it through CONNECT.)
	node := call(t, "POST", p.url+"/v1/executions", key, map[string]any{"language": "javascript", "code": nodeFetchArg, "args": []string{"http://allowed.test/node"},
		"network": map[string]any{"allow": []string{"allowed.test"}}}, nil)
	if node.status != 200 || strings.TrimSpace(fmt.Sprint(node.body["stdout"])) != "ok:hello from allowed.test /node" {
		t.Errorf("one-shot Node fetch: %d %s", node.status, node.raw)
	}

	// curl, from a shell script.
	sh := call(t, "POST", p.url+"/v1/executions", key, map[string]any{"language": "bash",
		"code":  "curl -sS --cacert /code/ca.pem https://allowed.test/curl; curl -sS http://allowed.test/curl; curl -sS --max-time 10 https://other.test/curl || echo refused",
		"files": []map[string]string{{"path": "ca.pem", "content": string(ca)}}, "network": map[string]any{"allow": []string{"allowed.test"}}}, nil)
	if lines := strings.Split(strings.TrimSpace(fmt.Sprint(sh.body["stdout"])), "\n"); sh.status != 200 || len(lines) != 3 ||
		lines[0] != "hello from allowed.test /curl" || lines[1] != lines[0] || lines[2] != "refused" {
		t.Errorf("one-shot curl: %d %s", sh.status, sh.raw)
	}

	// The cap (300000 bytes) cuts a 1 MB download.
	_, got = probeOnce(t, p, key, ca, nil, "http://allowed.test/bytes?n=1000000")
	if r := got["http://allowed.test/bytes?n=1000000"]; strings.HasPrefix(r, "ok:1000000:") {
		t.Errorf("a one-shot 1 MB download went through a cap of 300 kB: %q", r)
	}
	// [] is no network at all, and no network record.
	exe, got = probeOnce(t, p, key, ca, map[string]any{"allow": []string{}}, "ifaces", "http://allowed.test/none")
	if got["ifaces"] != "ok:lo" || !strings.HasPrefix(got["http://allowed.test/none"], "err:") || exe["network"] != nil {
		t.Errorf("a one-shot execution without network: %q, network %v", got, exe["network"])
	}
	if r := call(t, "POST", p.url+"/v1/executions", key, map[string]any{"language": "python", "code": "print(1)", "network": map[string]any{"allow": []string{"evil.test"}}}, nil); r.status != 403 || r.body["error"] == nil {
		t.Errorf("an execution widening the plan's list: %d %s", r.status, r.raw)
	}
	// The tenant's usage of today sums them: executions' and sandboxes'
	// (the open live periods included).
	u := call(t, "GET", p.url+"/v1/usage", key, nil, nil)
	today, _ := u.body["today"].(map[string]any)
	sbx, _ := u.body["sandboxes"].(map[string]any)
	if today == nil || sbx == nil || today["network_bytes_in"].(float64) < nw["bytes_in"].(float64) || sbx["network_bytes_in"].(float64) == 0 {
		t.Errorf("usage of today: %s", u.raw)
	}
	if left, _ := filepath.Glob(filepath.Join(data, "egress", "*", "exe_*")); len(left) != 0 {
		t.Errorf("executions left their egress directories: %q", left)
	}
}

func probeIn(t *testing.T, p *serverProc, key, id string, probes ...string) map[string]string {
	t.Helper()
	r := sbxCall(t, p, key, "POST", id, "/commands", map[string]any{"argv": append([]string{"python3", "/home/user/probe.py"}, probes...), "timeout_s": 60})
	if r.status != 200 {
		t.Fatalf("probe: %d %s", r.status, r.raw)
	}
	out := map[string]string{}
	if err := json.Unmarshal([]byte(r.body["stdout"].(string)), &out); err != nil {
		t.Fatalf("probe output %q (stderr %q): %v", r.body["stdout"], r.body["stderr"], err)
	}
	return out
}

// TestEgressE2E: on every driver and runtime, a sandbox reaches exactly
// what its own allowlist (within its plan's) names, by name, over HTTP
// and TLS, with Python and Node, through its server's proxy; and nothing
// else: not a name outside the list, not a bare address, not a name that
// resolves to loopback, a private or the metadata address, not UDP, not
// DNS. Two sandboxes with different lists at once keep their own. The
// byte cap cuts a download. The first create takes a pre-started
// sandbox. A sandbox whose create asks for no network has only lo. All of
// it on the fake internet of internal/e2etest/fakenet, in namespaces of
// the test's own.
func TestEgressE2E(t *testing.T) {
	needE2E(t)
	img := os.Getenv("VERTAL_DOCKER_IMAGE")
	if img == "" {
		img = "vertal/default:latest"
	}
	n := fakenet.Start(t)
	ca, err := os.ReadFile(n.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "vertal.json")
	if err := os.WriteFile(config, []byte(`{"plans": {"pro": {"egress": {"max_bytes": 300000,
		"allow": ["allowed.test", "other.test", "v6only.test", "loop.test", "private.test", "meta.test"]}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The config of the restart: the operator narrowed pro's list.
	narrower := filepath.Join(t.TempDir(), "narrower.json")
	if err := os.WriteFile(narrower, []byte(`{"plans": {"pro": {"egress": {"max_bytes": 300000, "allow": ["allowed.test"]}}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	files := []map[string]string{{"path": "probe.py", "content": egressProbe}, {"path": "ca.pem", "content": string(ca)}}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"oci/bwrap", nil},
		{"oci/crun", []string{"--runtime", "crun"}},
		{"oci/runc", []string{"--runtime", "runc"}},
		{"oci/runsc", []string{"--runtime", "runsc"}},
		{"docker/runc", []string{"--driver", "docker", "--runtime", "runc", "--docker-image", img}},
		{"docker/runsc", []string{"--driver", "docker", "--runtime", "runsc", "--docker-image", img}},
	} {
		t.Run(strings.ReplaceAll(c.name, "/", "_"), func(t *testing.T) {
			data := t.TempDir()
			p := startNetServer(t, n, data, append(c.args, "--config", config)...)
			key := tenantKey(t, p, "agent", "pro")
			metric := metricsOf(t, p)
			before := prestarted(t, metric, "")

			// Two creates at once, each with its own list.
			ids := make([]string, 2)
			var wg sync.WaitGroup
			for i, allow := range [][]string{{"allowed.test", "v6only.test", "loop.test", "private.test", "meta.test"}, {"other.test"}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := sbxCall(t, p, key, "POST", "", "", map[string]any{"timeout_s": 120, "files": files, "network": map[string]any{"allow": allow}})
					if r.status == 201 {
						ids[i] = r.body["id"].(string)
					} else {
						t.Errorf("create with %q: %d %s", allow, r.status, r.raw)
					}
				}()
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			a, b := ids[0], ids[1]
			if !before[a] && !before[b] {
				t.Errorf("neither create took the pre-started sandbox (%v running before; got %s, %s)", before, a, b)
			}

			got := probeIn(t, p, key, a, "http://allowed.test/a", "https://allowed.test/a", "https://v6only.test/a",
				"http://other.test/a", "https://other.test/a", "http://203.0.113.10/a", "https://203.0.113.10/a",
				"http://loop.test/a", "http://private.test/a", "https://meta.test/a", "http://169.254.169.254/latest/meta-data/",
				"dns", "tcp:203.0.113.10:80", "tcp:[2001:db8::10]:443", "udp:203.0.113.10:9999", "udp:203.0.113.10:53", "ifaces")
			for probe, want := range map[string]string{
				"http://allowed.test/a":  "hello from allowed.test /a",
				"https://allowed.test/a": "hello from allowed.test /a",
				"https://v6only.test/a":  "hello from v6only.test /a",
			} {
				if !strings.HasPrefix(got[probe], "ok:") || !strings.Contains(got[probe], want) {
					t.Errorf("%s: %q, want %q", probe, got[probe], want)
				}
			}
			if got["ifaces"] != "ok:lo" {
				t.Errorf("interfaces in a sandbox with network: %q; want lo alone", got["ifaces"])
			}
			for _, probe := range []string{"http://other.test/a", "https://other.test/a", "http://203.0.113.10/a", "https://203.0.113.10/a",
				"http://loop.test/a", "http://private.test/a", "https://meta.test/a", "http://169.254.169.254/latest/meta-data/",
				"dns", "tcp:203.0.113.10:80", "tcp:[2001:db8::10]:443", "udp:203.0.113.10:9999", "udp:203.0.113.10:53"} {
				if !strings.HasPrefix(got[probe], "err:") {
					t.Errorf("%s got through: %q", probe, got[probe])
				}
			}
			out := sbxRun(t, p, key, a, "NODE_EXTRA_CA_CERTS=/home/user/ca.pem node -e '"+nodeFetch+"' https://allowed.test/node; node -e '"+nodeFetch+"' http://allowed.test/node; node -e '"+nodeFetch+"' http://other.test/node")
			if lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n"); len(lines) != 3 || lines[0] != "ok:hello from allowed.test /node" || lines[1] != lines[0] || !strings.HasPrefix(lines[2], "err:") {
				t.Errorf("node fetch: %q (stderr %q)", out["stdout"], out["stderr"])
			}
			out = sbxRun(t, p, key, a, "curl -sS --cacert /home/user/ca.pem https://allowed.test/curl; curl -sS http://allowed.test/curl; curl -sS --max-time 10 https://other.test/curl || echo refused")
			if lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n"); len(lines) != 3 || lines[0] != "hello from allowed.test /curl" || lines[1] != lines[0] || lines[2] != "refused" {
				t.Errorf("curl: %q (stderr %q)", out["stdout"], out["stderr"])
			}
			// The cap (300000 bytes in and out, this sandbox's connections
			// together) cuts a download short, and refuses what follows.
			got = probeIn(t, p, key, a, "http://allowed.test/bytes?n=1000000", "http://allowed.test/after")
			if r := got["http://allowed.test/bytes?n=1000000"]; strings.HasPrefix(r, "ok:1000000:") {
				t.Errorf("a 1 MB download went through a cap of 300 kB: %q", r)
			}
			if r := got["http://allowed.test/after"]; !strings.HasPrefix(r, "err:") {
				t.Errorf("a request after the cap: %q", r)
			}

			got = probeIn(t, p, key, b, "http://other.test/b", "https://other.test/b", "http://allowed.test/b", "https://allowed.test/b")
			if !strings.Contains(got["http://other.test/b"], "hello from other.test /b") || !strings.Contains(got["https://other.test/b"], "hello from other.test /b") ||
				!strings.HasPrefix(got["http://allowed.test/b"], "err:") || !strings.HasPrefix(got["https://allowed.test/b"], "err:") {
				t.Errorf("the second sandbox's list is not its own: %q", got)
			}

			// What reached the fake internet: only allowed names, each from
			// the sandbox that may reach it.
			for _, r := range n.Requests() {
				host := r.Host
				if r.SNI != "" {
					host = r.SNI
				}
				host, _, _ = strings.Cut(host, ":")
				if !slices.Contains([]string{"allowed.test", "other.test", "v6only.test"}, host) {
					t.Errorf("the fake internet got a request for %q: %+v", host, r)
				}
				if host == "other.test" && strings.HasSuffix(r.Path, "/a") || host == "allowed.test" && strings.HasSuffix(r.Path, "/b") {
					t.Errorf("a sandbox reached a name outside its own list: %+v", r)
				}
			}
			// The proxy's own DNS queries are there; nothing of the
			// sandboxes'.
			for _, d := range n.UDPSeen() {
				if d.Local.Port() != 53 || strings.Contains(string(d.Data), "exfiltrated") {
					t.Errorf("the sandbox's UDP reached the fake internet: %+v", d)
				}
			}

			// The record shows the attempts and the bytes.
			r := sbxCall(t, p, key, "GET", a, "", nil)
			nw, _ := r.body["network"].(map[string]any)
			lim, _ := r.body["limits"].(map[string]any)
			if nw == nil || nw["connections"].(float64) < 4 || nw["refused"].(float64) < 6 || nw["bytes_in"].(float64) == 0 {
				t.Errorf("network usage: %v", r.body["network"])
			}
			if ln, _ := lim["network"].(map[string]any); ln == nil || len(ln["allow"].([]any)) != 5 || ln["max_bytes"].(float64) != 300000 {
				t.Errorf("limits.network: %v", lim["network"])
			}
			if metric("vertal_egress_refused_total") < 6 || metric("vertal_egress_connections_total") < 4 {
				t.Errorf("egress metrics: refused %v, connections %v", metric("vertal_egress_refused_total"), metric("vertal_egress_connections_total"))
			}
			if !strings.Contains(p.stderr.String(), `"msg":"egress","sandbox_id":"`+a) {
				t.Errorf("no egress audit line for %s in the log", a)
			}

			// Asking for more than the plan allows is 403; for nothing,
			// no network at all.
			if r := sbxCall(t, p, key, "POST", "", "", map[string]any{"network": map[string]any{"allow": []string{"evil.test"}}}); r.status != 403 || r.body["error"] == nil {
				t.Errorf("a create widening the plan's list: %d %s", r.status, r.raw)
			}
			sbxCall(t, p, key, "DELETE", b, "", nil)
			none := createSandbox(t, p, key, map[string]any{"timeout_s": 60, "files": files, "network": map[string]any{"allow": []string{}}})
			if got := probeIn(t, p, key, none, "ifaces", "http://allowed.test/none"); got["ifaces"] != "ok:lo" || !strings.HasPrefix(got["http://allowed.test/none"], "err:") {
				t.Errorf("a sandbox without network: %q", got)
			}

			oneShotEgress(t, p, key, ca, data)

			// A sandbox paused with the plan's whole list, resumed after
			// the restart below (whose plan allows allowed.test alone).
			kept := createSandbox(t, p, key, map[string]any{"timeout_s": 120, "files": files})
			if r := sbxCall(t, p, key, "POST", kept, "/pause", nil); r.status != 200 || r.body["status"] != "paused" {
				t.Fatalf("pause: %d %s", r.status, r.raw)
			}

			// SIGKILL, with a sandbox that stays and a one-shot execution
			// with a network in its sandbox: the proxies go with the server
			// (nothing listens on their sockets), and the next start removes
			// their directories and settles the execution as error.
			egressDir := filepath.Join(data, "egress")
			postInBackground(p.url+"/v1/executions", key, `{"language":"bash","code":"echo started; sleep 60","network":{"allow":["allowed.test"]}}`, nil)
			var exeID string
			waitFor(t, func() bool {
				s, _ := filepath.Glob(filepath.Join(egressDir, "*", "exe_*", "proxy.sock"))
				if len(s) == 1 {
					exeID = filepath.Base(filepath.Dir(s[0]))
				}
				return exeID != "" && call(t, "GET", p.url+"/v1/executions/"+exeID, key, nil, nil).body["status"] == "running"
			})
			socks, _ := filepath.Glob(filepath.Join(egressDir, "*", "*_*", "proxy.sock"))
			if len(socks) < 2 {
				t.Fatalf("proxy sockets under %s: %q; want the sandboxes' and the execution's", egressDir, socks)
			}
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited
			p.exited <- nil
			for _, s := range socks {
				if c, err := net.Dial("unix", s); err == nil {
					c.Close()
					t.Errorf("%s still answers after SIGKILL", s)
				}
			}
			p2 := startNetServer(t, n, data, append(c.args, "--config", narrower)...)
			waitFor(t, func() bool {
				left, _ := filepath.Glob(filepath.Join(egressDir, "*", "*_*", "proxy.sock"))
				return len(left) == 0
			})
			if left, _ := filepath.Glob(filepath.Join(egressDir, "*", exeID)); len(left) != 0 {
				t.Errorf("the killed execution's egress directory is left: %q", left)
			}
			if r := call(t, "GET", p2.url+"/v1/executions/"+exeID, key, nil, nil); r.status != 200 || r.body["status"] != "error" {
				t.Errorf("the execution in its sandbox at the SIGKILL, after the restart: %d %s; want settled as error", r.status, r.raw)
			}
			if strings.HasPrefix(c.name, "docker/") {
				// The restart's reap removes the killed execution's container.
				waitFor(t, func() bool {
					out, err := exec.Command("docker", "ps", "-aq", "--filter", "name="+exeID).Output()
					return err == nil && len(strings.TrimSpace(string(out))) == 0
				})
			}

			// The paused sandbox resumes (by this command) with its list
			// cut down to what the plan allows now: the proxy refuses
			// other.test, which it kept at its create, and its record
			// shows allowed.test alone.
			out = sbxRun(t, p2, key, kept, "curl -sS http://allowed.test/kept; curl -sS http://other.test/kept")
			if lines := strings.Split(strings.TrimSpace(out["stdout"].(string)), "\n"); len(lines) != 2 || lines[0] != "hello from allowed.test /kept" ||
				!strings.Contains(lines[1], "other.test is not in the allowlist") {
				t.Errorf("after a resume on a narrower plan: %q (stderr %q)", out["stdout"], out["stderr"])
			}
			lim, _ = sbxCall(t, p2, key, "GET", kept, "", nil).body["limits"].(map[string]any)
			if ln, _ := lim["network"].(map[string]any); ln == nil || fmt.Sprint(ln["allow"]) != "[allowed.test]" {
				t.Errorf("limits.network after a resume on a narrower plan: %v", lim["network"])
			}
			if !strings.Contains(p2.stderr.String(), "narrows its network") {
				t.Error("the resume's narrowing is not logged")
			}
			p2.stop()
		})
	}
}
