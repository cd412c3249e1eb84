package fakenet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// The fixed addresses of the fake internet. 203.0.113.0/24, 198.51.100.0/24
// and 2001:db8::/32 are documentation ranges: nothing real answers there,
// and here nothing outside the two namespaces can be reached anyway.
const (
	InetIP4   = "203.0.113.10"     // the fake servers, in InetNS
	InetIP6   = "2001:db8::10"     // the same servers over IPv6 (Net.IPv6)
	ServerIP4 = "198.51.100.2"     // ServerNS's address towards InetNS
	ServerIP6 = "2001:db8:ffff::2" // ServerNS's IPv6 address towards InetNS
)

// Namespace name prefixes; a name is the prefix, the creating process's
// pid and a random suffix, so Start can tell a leftover of a killed run
// (its pid is gone) from one that a concurrent test process is using.
const (
	serverPrefix = "vtsrv-"
	inetPrefix   = "vtinet-"
	netnsDir     = "/run/netns"
)

// Net is a running fake internet; Start makes one.
type Net struct {
	ServerNS string // netns the server under test runs in: "vtsrv-<pid>-<rand>"
	InetNS   string // netns of the fake servers: "vtinet-<pid>-<rand>"

	ServerVeth string // ServerNS's end of the veth pair
	InetVeth   string // InetNS's end of the veth pair

	CA     []byte // PEM of the CA that signed the HTTPS server's certificate
	CAFile string // CA, written to a file

	HostsFile      string // Hosts(), written to a file: /etc/hosts in a Command
	ResolvConfFile string // /etc/resolv.conf in a Command: nameserver 127.0.0.1

	HTTPAddr  string // "203.0.113.10:80"
	HTTPSAddr string // "203.0.113.10:443"
	DNSAddr   string // "203.0.113.10:53", UDP: records, and answers A and AAAA queries from the fake zone (NXDOMAIN for other names)
	UDPAddr   string // "203.0.113.10:9999", UDP: records and echoes

	// IPv6 reports whether the namespaces have IPv6; then the servers also
	// listen on these, and allowed.test and other.test have AAAA records.
	// They are "" without IPv6.
	IPv6       bool
	HTTPAddr6  string // "[2001:db8::10]:80"
	HTTPSAddr6 string // "[2001:db8::10]:443"
	DNSAddr6   string // "[2001:db8::10]:53"
	UDPAddr6   string // "[2001:db8::10]:9999"

	mu       sync.Mutex
	requests []Request
	conns    []Conn
	udp      []Datagram
}

// Start builds the fake internet, undoing it with t.Cleanup (also after a
// failed Start). It first deletes the namespaces of earlier runs that were
// killed before their cleanup. It skips t unless VERTAL_E2E=1.
func Start(t testing.TB) *Net {
	t.Helper()
	e2etest.Require(t, "root, ip (iproute2), nsenter and unshare, to build a fake internet in network namespaces")
	if os.Geteuid() != 0 {
		t.Fatal("fakenet: needs root (network namespaces, veth, mounts)")
	}
	for _, tool := range []string{"ip", "nsenter", "unshare", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("fakenet: %v", err)
		}
	}
	sweep(t)

	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("fakenet: %v", err)
	}
	suffix := hex.EncodeToString(b[:])
	id := strconv.Itoa(os.Getpid()) + "-" + suffix
	n := &Net{
		ServerNS:   serverPrefix + id,
		InetNS:     inetPrefix + id,
		ServerVeth: "vts" + suffix,
		InetVeth:   "vti" + suffix,
		HTTPAddr:   net.JoinHostPort(InetIP4, "80"),
		HTTPSAddr:  net.JoinHostPort(InetIP4, "443"),
		DNSAddr:    net.JoinHostPort(InetIP4, "53"),
		UDPAddr:    net.JoinHostPort(InetIP4, "9999"),
	}
	if err := n.build(t); err != nil {
		t.Fatalf("fakenet: %v", err)
	}
	dir := t.TempDir()
	ca, cert, err := newCert()
	if err != nil {
		t.Fatalf("fakenet: %v", err)
	}
	n.CA = ca
	n.CAFile = filepath.Join(dir, "ca.pem")
	n.HostsFile = filepath.Join(dir, "hosts")
	n.ResolvConfFile = filepath.Join(dir, "resolv.conf")
	for _, f := range []struct {
		path string
		data []byte
	}{
		{n.CAFile, n.CA},
		{n.HostsFile, []byte(n.Hosts())},
		{n.ResolvConfFile, []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")},
	} {
		if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
			t.Fatalf("fakenet: %v", err)
		}
	}
	if err := n.serve(t, cert); err != nil {
		t.Fatalf("fakenet: %v", err)
	}
	return n
}

// build makes the two namespaces and the veth pair, and registers their
// removal. ServerNS: 198.51.100.2/32 and a link route to 203.0.113.0/24;
// InetNS: 203.0.113.10/24 and a link route back to 198.51.100.2; the same
// in IPv6 where it works. No default route anywhere.
func (n *Net) build(t testing.TB) error {
	for _, ns := range []string{n.ServerNS, n.InetNS} {
		if err := ip("netns", "add", ns); err != nil {
			return err
		}
		t.Cleanup(func() {
			if err := ip("netns", "del", ns); err != nil {
				t.Errorf("fakenet: %v", err)
			}
		})
	}
	// Both ends are created in their namespaces: the pair never exists in
	// the host's namespace, and goes away with the namespaces.
	if err := ip("link", "add", n.ServerVeth, "netns", n.ServerNS, "type", "veth",
		"peer", "name", n.InetVeth, "netns", n.InetNS); err != nil {
		return err
	}
	if err := n.ipv6Setup(); err != nil {
		t.Logf("fakenet: no IPv6: %v", err)
	} else {
		n.IPv6 = true
	}
	s, i := []string{"-n", n.ServerNS}, []string{"-n", n.InetNS}
	steps := [][]string{
		append(s, "link", "set", "lo", "up"),
		append(i, "link", "set", "lo", "up"),
		append(s, "addr", "add", ServerIP4+"/32", "dev", n.ServerVeth),
		append(i, "addr", "add", InetIP4+"/24", "dev", n.InetVeth),
		append(s, "link", "set", n.ServerVeth, "up"),
		append(i, "link", "set", n.InetVeth, "up"),
		append(s, "route", "add", "203.0.113.0/24", "dev", n.ServerVeth, "src", ServerIP4),
		append(i, "route", "add", ServerIP4+"/32", "dev", n.InetVeth),
	}
	if n.IPv6 {
		steps = append(steps,
			append(s, "-6", "route", "add", "2001:db8::/32", "dev", n.ServerVeth, "src", ServerIP6),
			append(i, "-6", "route", "add", ServerIP6+"/128", "dev", n.InetVeth),
		)
	}
	for _, args := range steps {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// ipv6Setup gives both veth ends their IPv6 addresses, without duplicate
// address detection (nothing else is on the link, and a tentative address
// would not answer for a second or two).
func (n *Net) ipv6Setup() error {
	for _, e := range []struct{ ns, dev, addr string }{
		{n.ServerNS, n.ServerVeth, ServerIP6 + "/128"},
		{n.InetNS, n.InetVeth, InetIP6 + "/64"},
	} {
		err := inNetns(nsPath(e.ns), func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/"+e.dev+"/accept_dad", []byte("0"), 0o644)
		})
		if err != nil {
			return fmt.Errorf("ipv6 in %s: %w", e.ns, err)
		}
		if err := ip("-n", e.ns, "-6", "addr", "add", e.addr, "dev", e.dev, "nodad"); err != nil {
			return err
		}
	}
	return nil
}

// zone is the fake DNS: Hosts() and DialContext's names.
func (n *Net) zone() []struct {
	addr  string
	names []string
} {
	z := []struct {
		addr  string
		names []string
	}{
		{"127.0.0.1", []string{"localhost", "loop.test"}},
		{"::1", []string{"localhost", "ip6-localhost", "ip6-loopback"}},
		{InetIP4, []string{"allowed.test", "other.test"}},
		{InetIP6, []string{"v6only.test"}},
		{"10.0.0.1", []string{"private.test"}},
		{"169.254.169.254", []string{"meta.test"}},
	}
	if n.IPv6 {
		z[3].names = []string{"allowed.test", "other.test", "v6only.test"}
	}
	return z
}

// Hosts is the fake zone as /etc/hosts lines: allowed.test and other.test
// are 203.0.113.10 (and 2001:db8::10 with IPv6), v6only.test 2001:db8::10,
// loop.test 127.0.0.1, private.test 10.0.0.1, meta.test 169.254.169.254,
// and localhost as usual.
func (n *Net) Hosts() string {
	var b strings.Builder
	for _, e := range n.zone() {
		fmt.Fprintf(&b, "%s\t%s\n", e.addr, strings.Join(e.names, " "))
	}
	return b.String()
}

// lookup resolves name in the fake zone, IPv4 first.
func (n *Net) lookup(name string) (netip.Addr, bool) {
	var v6 netip.Addr
	for _, e := range n.zone() {
		for _, h := range e.names {
			if !strings.EqualFold(h, name) {
				continue
			}
			a := netip.MustParseAddr(e.addr)
			if a.Is4() {
				return a, true
			}
			if !v6.IsValid() {
				v6 = a
			}
		}
	}
	return v6, v6.IsValid()
}

// Command returns a command that runs name in ServerNS, in a mount
// namespace of its own that sees HostsFile as /etc/hosts and
// ResolvConfFile as /etc/resolv.conf and shares everything else with the
// host (propagation slave: mounts made on the host still show). It joins
// only the network namespace, with nsenter --net (ip netns exec would also
// remount /sys, hiding /sys/fs/cgroup). nsenter, unshare and sh each exec
// the next, so cmd.Process is name itself once it runs.
func (n *Net) Command(name string, args ...string) *exec.Cmd {
	argv := n.argv(name, args)
	return exec.Command(argv[0], argv[1:]...)
}

// NetCommand returns a command that runs name in ServerNS alone: the
// host's mounts and files, its /etc/hosts and resolv.conf included (whose
// resolvers ServerNS has no route to). A server that must create mounts
// other processes see (the docker driver's, which dockerd binds from the
// host's mount namespace) runs so, and resolves the fake zone through
// DNSAddr.
func (n *Net) NetCommand(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + nsPath(n.ServerNS), "--", name}, args...)...)
}

// CommandContext is Command with exec.CommandContext.
func (n *Net) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := n.argv(name, args)
	return exec.CommandContext(ctx, argv[0], argv[1:]...)
}

func (n *Net) argv(name string, args []string) []string {
	const script = `mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"`
	return append([]string{
		"nsenter", "--net=" + nsPath(n.ServerNS), "--",
		"unshare", "--mount", "--propagation", "slave", "--",
		"/bin/sh", "-c", script, "sh", n.HostsFile, n.ResolvConfFile, name,
	}, args...)
}

// DialContext dials addr from inside ServerNS, so that a client in the
// test process reaches a server listening on 127.0.0.1 there, e.g. as an
// http.Transport's DialContext. addr's host is an IP address or a name of
// the fake zone (localhost, allowed.test...); names are never looked up on
// the host.
func (n *Net) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if !strings.HasPrefix(network, "unix") {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("fakenet: dial %s: %w", addr, err)
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			var ok bool
			if ip, ok = n.lookup(host); !ok {
				return nil, fmt.Errorf("fakenet: dial %s: %s is not in the fake zone", addr, host)
			}
		}
		addr = net.JoinHostPort(ip.String(), port)
	}
	var c net.Conn
	err := inNetns(nsPath(n.ServerNS), func() error {
		// No fast fallback: it would dial from another goroutine, on a
		// thread in the host's namespace.
		d := net.Dialer{FallbackDelay: -1}
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// inNetns runs fn on a thread of its own that joined the network namespace
// at path. The thread is never unlocked: it ends with the goroutine, so no
// other goroutine runs in that namespace. Sockets fn makes stay in it.
func inNetns(path string, fn func() error) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func nsPath(name string) string { return filepath.Join(netnsDir, name) }

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sweep deletes the namespaces of earlier runs whose process is gone.
func sweep(t testing.TB) {
	t.Helper()
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatalf("fakenet: %v", err)
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), serverPrefix)
		if !ok {
			if rest, ok = strings.CutPrefix(e.Name(), inetPrefix); !ok {
				continue
			}
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || unix.Kill(pid, 0) != unix.ESRCH {
			continue // not ours, or its process is alive
		}
		if err := ip("netns", "del", e.Name()); err != nil {
			t.Logf("fakenet: deleting a leftover namespace: %v", err)
		}
	}
}
