package probes

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

type target struct {
	host string
	port int
}

func pyTargets(ts []target) string {
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

// networkCode tries every way out of the sandbox and prints a marker line
// (CONNECTED, ANSWER, RESOLVED, OPENED) for each one that works. A TCP
// connection refused by an address other than loopback counts as reached:
// the packet got to a host.
const networkCode = `
import socket, struct
def fam(h): return socket.AF_INET6 if ":" in h else socket.AF_INET
def local(h): return h in ("127.0.0.1", "::1")
for h, p in @TCP@:
    s = socket.socket(fam(h), socket.SOCK_STREAM); s.settimeout(3)
    try:
        s.connect((h, p)); print("CONNECTED tcp", h, p)
    except ConnectionRefusedError as e:
        print("blocked tcp", h, p, e.errno) if local(h) else print("CONNECTED tcp", h, p, "refused (so routable)")
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
for name in @NAMES@:
    try:
        print("RESOLVED", name, socket.getaddrinfo(name, 443)[0][4])
    except OSError as e:
        print("blocked getaddrinfo", name, e)
for f, t, p, name in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, "raw icmp"),
                      (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP, "raw tcp"),
                      (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP, "ping"),
                      (17, socket.SOCK_RAW, 0, "packet"),
                      (40, socket.SOCK_STREAM, 0, "vsock")]:
    try:
        s = socket.socket(f, t, p); print("OPENED", name); s.close()
    except OSError as e:
        print("blocked", name, e.errno)
if @UNIX@:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(@UNIX@); print("CONNECTED abstract unix")
    except OSError as e:
        print("blocked abstract unix", e.errno)
ifaces = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
print("interfaces", " ".join(ifaces))
if ifaces != ["lo"]:
    print("CONNECTED interfaces beyond lo:", ifaces)
`

// networkProbe aims at the host's listeners (or, without them, its SSH
// port), its addresses, local resolvers and, for the doctor, the
// internet; the listeners must count nothing.
func networkProbe(env Env) Probe {
	var tcp, udp []target
	dns := []string{"127.0.0.1"}
	unix := `""`
	var names []string
	what := "the host's addresses"
	if l := env.Net; l != nil {
		tcp = append(tcp, target{"127.0.0.1", port(l.tcpLoopback.Addr())}, target{"127.0.0.1", port(l.tcpAll.Addr())})
		if l.tcp6 != nil {
			tcp = append(tcp, target{"::1", port(l.tcp6.Addr())})
		}
		udp = append(udp, target{"127.0.0.1", port(l.udpAll.LocalAddr())})
		for _, ip := range env.HostAddrs {
			tcp = append(tcp, target{ip, port(l.tcpAll.Addr())})
			udp = append(udp, target{ip, port(l.udpAll.LocalAddr())})
		}
		dns = append(dns, l.Resolvers...)
		unix = strconv.Quote("\x00" + strings.TrimPrefix(l.unixName, "@"))
		what = "listeners on the host (loopback, its addresses, an abstract unix socket)"
	} else {
		for _, ip := range env.HostAddrs {
			tcp = append(tcp, target{ip, 22})
		}
	}
	dns = append(dns, env.HostAddrs...)
	if env.Internet {
		tcp = append(tcp, target{"1.1.1.1", 443}, target{"8.8.8.8", 53})
		dns = append(dns, "8.8.8.8")
		names = append(names, "deb.debian.org")
		what = "the internet and " + what
	} else {
		names = append(names, "example.com")
	}
	r := strings.NewReplacer("@TCP@", pyTargets(tcp), "@UDP@", pyTargets(udp), "@DNS@", pyList(dns),
		"@NAMES@", pyList(names), "@UNIX@", unix)
	return Probe{
		Name: "no_network", Protection: sandbox.ProtNetwork, Essential: true, Language: "python",
		Code: r.Replace(networkCode), Timeout: 60e9,
		Evaluate: func(r engine.Result) (bool, string) {
			if err := finished(r, "interfaces"); err != nil {
				return false, err.Error()
			}
			ifaces := ""
			for _, line := range strings.Split(r.Stdout, "\n") {
				if s, ok := strings.CutPrefix(line, "interfaces "); ok {
					ifaces = s
				}
			}
			if reached := markers(r, "CONNECTED", "ANSWER", "RESOLVED", "OPENED"); len(reached) > 0 {
				return false, "reached: " + strings.Join(reached, "; ")
			}
			if env.Net != nil {
				if n := env.Net.Hits(); n != 0 {
					return false, fmt.Sprintf("the host's listeners received %d connections or datagrams from the sandbox", n)
				}
			}
			return true, fmt.Sprintf("interfaces: %s; %d attempts blocked (tcp, udp, dns to %s; raw, packet, vsock sockets)",
				ifaces, countLines(r, "blocked"), what)
		},
		Fix: "give every sandbox its own network namespace with loopback only (OCI 'network' namespace; docker NetworkMode none); do not serve untrusted code until this passes",
	}
}
