package securitytest

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// listeners are sockets on this machine that sandboxed code must not
// reach. Each counts what arrives.
type listeners struct {
	tcpLoopback net.Listener   // 127.0.0.1
	tcpAll      net.Listener   // every address of this machine
	tcp6        net.Listener   // ::1, when IPv6 is up
	udpAll      net.PacketConn // every address of this machine
	unixAbs     net.Listener   // abstract unix socket (per network namespace)
	unixName    string
	hits        atomic.Int64
	// Targets, all on this machine.
	hostIPs  []string // non-loopback interface addresses
	resolver []string // DNS servers from resolv.conf that are local addresses
}

func startListeners(t *testing.T) (*listeners, error) {
	l := &listeners{}
	var err error
	if l.tcpLoopback, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	if l.tcpAll, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
		return nil, err
	}
	l.tcp6, _ = net.Listen("tcp6", "[::1]:0") // optional
	if l.udpAll, err = net.ListenPacket("udp4", "0.0.0.0:0"); err != nil {
		return nil, err
	}
	l.unixName = "@vertal-securitytest-" + randHex(8)
	if l.unixAbs, err = net.Listen("unix", l.unixName); err != nil {
		return nil, err
	}
	for _, ln := range []net.Listener{l.tcpLoopback, l.tcpAll, l.tcp6, l.unixAbs} {
		if ln == nil {
			continue
		}
		go func(ln net.Listener) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				l.hits.Add(1)
				c.Close()
			}
		}(ln)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := l.udpAll.ReadFrom(buf); err != nil {
				return
			}
			l.hits.Add(1)
		}
	}()
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{l.tcpLoopback, l.tcpAll, l.udpAll, l.unixAbs} {
			c.Close()
		}
		if l.tcp6 != nil {
			l.tcp6.Close()
		}
	})

	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	local := map[string]bool{}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		local[ipn.IP.String()] = true
		if ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() || ipn.IP.To4() == nil {
			continue
		}
		// Includes the Docker bridge gateway (172.17.0.1) when docker0
		// exists on this machine.
		l.hostIPs = append(l.hostIPs, ipn.IP.String())
	}
	l.resolver = localResolvers(local)
	return l, nil
}

// localResolvers returns the nameservers of /etc/resolv.conf that are
// addresses of this machine (e.g. 127.0.0.53); remote ones are not tried.
func localResolvers(local map[string]bool) []string {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			ip := net.ParseIP(fs[1])
			if ip != nil && (ip.IsLoopback() || local[ip.String()]) {
				out = append(out, ip.String())
			}
		}
	}
	return out
}

func port(a net.Addr) int {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.Port
	case *net.UDPAddr:
		return a.Port
	}
	return 0
}

// networkProgram is a Python program that tries every way out of the
// sandbox this machine offers and prints a marker line (CONNECTED, SENT,
// RESOLVED, ANSWER, OPENED) for each one that works.
func (l *listeners) networkProgram() string {
	type target struct {
		host string
		port int
	}
	tcp := []target{{"127.0.0.1", port(l.tcpLoopback.Addr())}, {"127.0.0.1", port(l.tcpAll.Addr())}}
	if l.tcp6 != nil {
		tcp = append(tcp, target{"::1", port(l.tcp6.Addr())})
	}
	udp := []target{{"127.0.0.1", port(l.udpAll.LocalAddr())}}
	for _, ip := range l.hostIPs {
		tcp = append(tcp, target{ip, port(l.tcpAll.Addr())})
		udp = append(udp, target{ip, port(l.udpAll.LocalAddr())})
	}
	dns := append([]string{"127.0.0.1"}, l.resolver...)
	dns = append(dns, l.hostIPs...)
	enc := func(ts []target) string {
		var b strings.Builder
		b.WriteString("[")
		for i, t := range ts {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(" + strconv.Quote(t.host) + ", " + strconv.Itoa(t.port) + ")")
		}
		return b.String() + "]"
	}
	r := strings.NewReplacer("@TCP@", enc(tcp), "@UDP@", enc(udp), "@DNS@", quoteList(dns),
		"@UNIX@", strconv.Quote("\x00"+strings.TrimPrefix(l.unixName, "@")))
	return r.Replace(`
import socket, struct, os
def fam(h): return socket.AF_INET6 if ":" in h else socket.AF_INET
for h, p in @TCP@:
    s = socket.socket(fam(h), socket.SOCK_STREAM); s.settimeout(3)
    try:
        s.connect((h, p)); print("CONNECTED tcp", h, p)
    except OSError as e:
        print("blocked tcp", h, p, e.errno)
    s.close()
for h, p in @UDP@:
    s = socket.socket(fam(h), socket.SOCK_DGRAM)
    try:
        s.sendto(b"ping", (h, p)); print("udp sendto returned", h, p)
    except OSError as e:
        print("blocked udp", h, p, e.errno)
    s.close()
query = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x07example\x03com\x00\x00\x01\x00\x01"
for h in @DNS@:
    s = socket.socket(fam(h), socket.SOCK_DGRAM); s.settimeout(2)
    try:
        s.sendto(query, (h, 53)); data = s.recv(512); print("ANSWER dns", h, len(data))
    except OSError as e:
        print("blocked dns", h, e.errno)
    s.close()
try:
    print("RESOLVED", socket.getaddrinfo("example.com", 80))
except OSError as e:
    print("blocked getaddrinfo", e)
for f, t, p, name in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw icmp"),
                      (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP, "raw tcp"),
                      (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, "ping"),
                      (17, socket.SOCK_RAW, 0, "packet"),
                      (40, socket.SOCK_STREAM, 0, "vsock")]:
    try:
        s = socket.socket(f, t, p); print("OPENED", name); s.close()
    except OSError as e:
        print("blocked", name, e.errno)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(@UNIX@); print("CONNECTED abstract unix")
except OSError as e:
    print("blocked abstract unix", e.errno)
ifaces = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
print("interfaces", ifaces)
if ifaces != ["lo"]:
    print("CONNECTED interfaces beyond lo:", ifaces)
`)
}
