//go:build linux

package fakenet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest/fakenet"
)

// inServerNS runs in ServerNS through Command: the fake zone and the CA
// work, the rest of the world does not, and /sys/fs/cgroup is the host's.
const inServerNS = `
import json, os, socket, ssl, sys, time, urllib.request
ca, v6 = sys.argv[1], sys.argv[2] == "1"
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({}),
    urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca)))
def get(url, data=None):
    return opener.open(urllib.request.Request(url, data=data), timeout=5).read()
out = {}
out["http"] = get("http://allowed.test/").decode()
out["https"] = get("https://allowed.test/").decode()
out["bytes"] = len(get("http://other.test/bytes?n=100000"))
out["echo"] = get("https://other.test/echo", b"ping").decode()
if v6:
    out["v6"] = get("https://v6only.test/six").decode()
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("192.0.2.1", 80))
    out["outside"] = "connected"
except OSError as e:
    out["outside"] = e.errno
t = time.monotonic()
try:
    socket.getaddrinfo("example.com", 80)
    out["dns"] = "resolved"
except socket.gaierror as e:
    out["dns"] = str(e)
out["dns_secs"] = time.monotonic() - t
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(b"to 9999", ("203.0.113.10", 9999))
out["udp_echo"] = u.recvfrom(100)[0].decode()
u.sendto(b"to 53", ("203.0.113.10", 53))
out["hosts"] = open("/etc/hosts").read()
out["resolv"] = open("/etc/resolv.conf").read()
out["cgroup"] = sorted(os.listdir("/sys/fs/cgroup"))
print(json.dumps(out))
`

func TestFakeNet(t *testing.T) {
	e2etest.Require(t, "root, ip (iproute2), nsenter and unshare, to build a fake internet in network namespaces")
	hostsBefore, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	var n *fakenet.Net
	t.Run("running", func(t *testing.T) {
		n = fakenet.Start(t)
		t.Logf("ServerNS %s, InetNS %s, IPv6 %v", n.ServerNS, n.InetNS, n.IPv6)
		testServerNS(t, n)
		testRootNS(t, n)
		testDial(t, n)
	})
	if n == nil {
		return
	}
	// After the cleanup of "running": nothing of n is left.
	list := run(t, "ip", "netns", "list")
	links := run(t, "ip", "-o", "link", "show")
	for _, name := range []string{n.ServerNS, n.InetNS, n.ServerVeth, n.InetVeth} {
		if strings.Contains(list, name) || strings.Contains(links, name) {
			t.Errorf("%s is left after cleanup:\n%s\n%s", name, list, links)
		}
	}
	for _, ns := range []string{n.ServerNS, n.InetNS} {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("/run/netns/%s is left after cleanup (stat: %v)", ns, err)
		}
	}
	if hostsAfter, err := os.ReadFile("/etc/hosts"); err != nil || !bytes.Equal(hostsAfter, hostsBefore) {
		t.Errorf("the host's /etc/hosts changed (err %v):\n%s", err, hostsAfter)
	}
}

func testServerNS(t *testing.T, n *fakenet.Net) {
	// 192.0.2.1 has no route in ServerNS, so the connect below cannot
	// send anything; make sure of it first.
	out, err := exec.Command("ip", "-n", n.ServerNS, "route", "get", "192.0.2.1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unreachable") {
		t.Fatalf("ServerNS has a route to 192.0.2.1 (err %v): %s", err, out)
	}

	v6 := "0"
	if n.IPv6 {
		v6 = "1"
	}
	cmd := n.Command("/usr/bin/python3", "-c", inServerNS, n.CAFile, v6)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 in ServerNS: %v\n%s", err, stderr.Bytes())
	}
	var got struct {
		HTTP, HTTPS, Echo, V6, DNS, Hosts, Resolv string
		Bytes                                     int
		Outside                                   any
		DNSSecs                                   float64 `json:"dns_secs"`
		UDPEcho                                   string  `json:"udp_echo"`
		Cgroup                                    []string
	}
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("python3 in ServerNS: %v\n%s\n%s", err, stdout, stderr.Bytes())
	}
	for _, c := range []struct{ name, got, want string }{
		{"http://allowed.test/", got.HTTP, "hello from allowed.test /\n"},
		{"https://allowed.test/", got.HTTPS, "hello from allowed.test /\n"},
		{"https://other.test/echo", got.Echo, "ping"},
		{"udp echo", got.UDPEcho, "to 9999"},
		{"/etc/hosts", got.Hosts, n.Hosts()},
		{"/etc/resolv.conf", got.Resolv, "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	if n.IPv6 && got.V6 != "hello from v6only.test /six\n" {
		t.Errorf("https://v6only.test/six: got %q", got.V6)
	}
	if got.Bytes != 100000 {
		t.Errorf("/bytes?n=100000: got %d bytes", got.Bytes)
	}
	if got.Outside != float64(syscall.ENETUNREACH) {
		t.Errorf("connect to 192.0.2.1:80 from ServerNS: got %v, want errno %d (ENETUNREACH)", got.Outside, syscall.ENETUNREACH)
	}
	if got.DNS == "resolved" || got.DNSSecs > 2 {
		t.Errorf("example.com from ServerNS: got %q after %.1fs, want a fast failure", got.DNS, got.DNSSecs)
	}
	hostCgroup, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range hostCgroup {
		want = append(want, e.Name())
	}
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(got.Cgroup, want) {
		t.Errorf("/sys/fs/cgroup in ServerNS: got %v, want the host's %v", got.Cgroup, want)
	}

	reqs := n.Requests()
	for _, w := range []fakenet.Request{
		{Scheme: "http", Host: "allowed.test", Method: "GET", Path: "/", BytesOut: 26},
		{Scheme: "https", Host: "allowed.test", SNI: "allowed.test", Method: "GET", Path: "/", BytesOut: 26},
		{Scheme: "http", Host: "other.test", Method: "GET", Path: "/bytes?n=100000", BytesOut: 100000},
		{Scheme: "https", Host: "other.test", SNI: "other.test", Method: "POST", Path: "/echo", BytesIn: 4, BytesOut: 4},
	} {
		if !slices.ContainsFunc(reqs, func(r fakenet.Request) bool {
			r.Local, r.Remote = w.Local, w.Remote
			return r == w
		}) {
			t.Errorf("Requests() has no %+v; it has %+v", w, reqs)
		}
	}
	for _, r := range reqs {
		if a := r.Remote.Addr().String(); a != fakenet.ServerIP4 && a != fakenet.ServerIP6 {
			t.Errorf("request %+v came from %s, want ServerNS's address", r, a)
		}
	}
	if len(n.Conns()) < len(reqs) {
		t.Errorf("Conns() has %d connections for %d requests", len(n.Conns()), len(reqs))
	}
	var udp []string
	for _, d := range n.UDPSeen() {
		udp = append(udp, d.Local.String()+" "+string(d.Data))
	}
	// The datagram to port 53 was sent last, with no answer to wait for.
	deadline := time.Now().Add(5 * time.Second)
	for len(udp) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		udp = udp[:0]
		for _, d := range n.UDPSeen() {
			udp = append(udp, d.Local.String()+" "+string(d.Data))
		}
	}
	if want := []string{"203.0.113.10:9999 to 9999", "203.0.113.10:53 to 53"}; !slices.Equal(udp, want) {
		t.Errorf("UDPSeen: got %q, want %q", udp, want)
	}
}

// testRootNS checks that the test process's own namespace has no way into
// the fake internet. It never sends to 203.0.113.10 from there: the host's
// default route would take that to the real network. Instead it connects
// with SO_DONTROUTE (on-link destinations only), which fails without
// sending unless some link of this namespace reaches 203.0.113.10.
func testRootNS(t *testing.T, n *fakenet.Net) {
	d := net.Dialer{
		Timeout: 2 * time.Second,
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_DONTROUTE, 1)
			})
			return errors.Join(err, serr)
		},
	}
	start := time.Now()
	c, err := d.DialContext(t.Context(), "tcp4", n.HTTPAddr)
	if err == nil {
		c.Close()
		t.Fatalf("%s is reachable from the host's network namespace", n.HTTPAddr)
	}
	if !errors.Is(err, syscall.ENETUNREACH) || time.Since(start) > time.Second {
		t.Errorf("dialing %s on-link from the host's namespace: got %v after %v, want ENETUNREACH at once", n.HTTPAddr, err, time.Since(start))
	}
	addrs := run(t, "ip", "-o", "addr", "show")
	links := run(t, "ip", "-o", "link", "show")
	for _, s := range []string{fakenet.InetIP4, fakenet.InetIP6, fakenet.ServerIP4, fakenet.ServerIP6, n.ServerVeth, n.InetVeth} {
		if strings.Contains(addrs, s) || strings.Contains(links, s) {
			t.Errorf("the host's network namespace has %s of the fake internet", s)
		}
	}
}

// testDial reaches a server on ServerNS's loopback from the test process,
// as a test does with the server under test's API.
func testDial(t *testing.T, n *fakenet.Net) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte("inside"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cmd := n.CommandContext(ctx, "/usr/bin/python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", dir, "8080")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	client := &http.Client{Transport: &http.Transport{DialContext: n.DialContext}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	var body []byte
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("http://127.0.0.1:8080/index.html")
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server on ServerNS's loopback: %v\n%s", err, logs.Bytes())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if string(body) != "inside" {
		t.Errorf("the server on ServerNS's loopback answered %q", body)
	}
	// A client in the test process, dialing from ServerNS, reaches the fake
	// zone by name and the outside not at all.
	resp, err := client.Get("http://allowed.test/from-test")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != "hello from allowed.test /from-test\n" {
		t.Errorf("http://allowed.test/from-test: got %q", got)
	}
	if _, err := n.DialContext(t.Context(), "tcp", "192.0.2.1:80"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("DialContext 192.0.2.1:80: got %v, want ENETUNREACH", err)
	}
	if _, err := n.DialContext(t.Context(), "tcp", "example.com:80"); err == nil {
		t.Errorf("DialContext example.com:80: got no error for a name outside the zone")
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// TestDNS: the fake internet's DNS server answers for the zone and
// NXDOMAIN for everything else, over IPv4 and IPv6.
func TestDNS(t *testing.T) {
	n := fakenet.Start(t)
	servers := []string{n.DNSAddr}
	if n.IPv6 {
		servers = append(servers, n.DNSAddr6)
	}
	for _, server := range servers {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return n.DialContext(ctx, network, server)
		}}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		got, err := r.LookupNetIP(ctx, "ip", "allowed.test")
		want := []netip.Addr{netip.MustParseAddr(fakenet.InetIP4)}
		if n.IPv6 {
			want = append(want, netip.MustParseAddr(fakenet.InetIP6))
		}
		slices.SortFunc(got, netip.Addr.Compare)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: allowed.test = %v, %v; want %v", server, got, err, want)
		}
		if got, err := r.LookupNetIP(ctx, "ip4", "meta.test"); err != nil || len(got) != 1 || got[0].String() != "169.254.169.254" {
			t.Errorf("%s: meta.test = %v, %v", server, got, err)
		}
		var dnsErr *net.DNSError
		if got, err := r.LookupNetIP(ctx, "ip", "nowhere.test"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("%s: nowhere.test = %v, %v; want not found", server, got, err)
		}
	}
}
