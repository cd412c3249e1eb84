package probes

import (
	"bufio"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
)

// Env is what the probes need to know about the host. HostEnv fills it
// in; tests of the judgements fill in what they need by hand.
type Env struct {
	// Net are sockets on this machine that the network probe aims at and
	// that count whatever reaches them. Nil: the probe aims at HostAddrs
	// (port 22) and counts a refused connection as reached.
	Net *Listeners
	// HostAddrs are the host's own non-loopback IPv4 addresses (including
	// the Docker bridge gateway when docker0 exists).
	HostAddrs []string
	// Internet makes the network probe also try addresses beyond this
	// machine (1.1.1.1, 8.8.8.8, a DNS name). The doctor does; the suite
	// aims only at this machine.
	Internet bool
	// HostNamespaces maps a namespace (pid, net, …) to this process's
	// /proc/self/ns link, which the sandbox's must differ from.
	HostNamespaces map[string]string
	// Hostname of the host, which the sandbox must not have.
	Hostname string
	// CanaryName and CanaryValue are an environment variable set in this
	// process: the sandbox must see neither.
	CanaryName, CanaryValue string
	// ProcRoot is the host's /proc, searched for processes that outlive
	// their sandbox. Default /proc.
	ProcRoot string
	// CPUs on the host; the CPU quota cannot be observed with fewer than 2.
	CPUs int
	// Arch is the GOARCH: syscall numbers and the dynamic loader's path
	// depend on it. Default runtime.GOARCH.
	Arch string
}

// HostEnv gathers Env from this machine: it starts the listeners and
// plants a canary variable (canaryPrefix plus a random suffix, so suites
// may run side by side) in this process's environment. Close undoes both.
// On an error the Env is still usable, without Net.
func HostEnv(canaryPrefix string) (Env, error) {
	env := Env{ProcRoot: "/proc", CPUs: runtime.NumCPU(), Arch: runtime.GOARCH, HostNamespaces: map[string]string{}}
	env.Hostname, _ = os.Hostname()
	env.CanaryName = canaryPrefix + "_" + strings.ToUpper(randHex(4))
	env.CanaryValue = "vertal-canary-" + randHex(12)
	os.Setenv(env.CanaryName, env.CanaryValue)
	for _, ns := range namespaces {
		if v, err := os.Readlink("/proc/self/ns/" + ns); err == nil {
			env.HostNamespaces[ns] = v
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return env, err
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
		env.HostAddrs = append(env.HostAddrs, ipn.IP.String())
	}
	env.Net, err = startListeners(localResolvers(local))
	return env, err
}

// Close removes the canary and closes the listeners.
func (e Env) Close() {
	if e.CanaryName != "" {
		os.Unsetenv(e.CanaryName)
	}
	if e.Net != nil {
		e.Net.Close()
	}
}

var namespaces = []string{"pid", "ipc", "uts", "mnt", "net", "cgroup"}

// Listeners are sockets on this machine that sandboxed code must not
// reach. Each counts what arrives.
type Listeners struct {
	tcpLoopback net.Listener   // 127.0.0.1
	tcpAll      net.Listener   // every address of this machine
	tcp6        net.Listener   // ::1, when IPv6 is up
	udpAll      net.PacketConn // every address of this machine
	unixAbs     net.Listener   // abstract unix socket (per network namespace)
	unixName    string
	hits        atomic.Int64
	// Resolvers are the DNS servers of resolv.conf that are addresses of
	// this machine (e.g. 127.0.0.53); remote ones are not tried.
	Resolvers []string
}

func startListeners(resolvers []string) (*Listeners, error) {
	l := &Listeners{Resolvers: resolvers}
	var err error
	fail := func(e error) (*Listeners, error) {
		l.Close()
		return nil, errors.Join(errors.New("probes: host listeners"), e)
	}
	if l.tcpLoopback, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
		return fail(err)
	}
	if l.tcpAll, err = net.Listen("tcp4", "0.0.0.0:0"); err != nil {
		return fail(err)
	}
	l.tcp6, _ = net.Listen("tcp6", "[::1]:0") // optional
	if l.udpAll, err = net.ListenPacket("udp4", "0.0.0.0:0"); err != nil {
		return fail(err)
	}
	l.unixName = "@vertal-probe-" + randHex(8)
	if l.unixAbs, err = net.Listen("unix", l.unixName); err != nil {
		return fail(err)
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
	return l, nil
}

// Hits counts the connections and datagrams that reached the listeners.
func (l *Listeners) Hits() int64 { return l.hits.Load() }

// Close stops the listeners.
func (l *Listeners) Close() {
	for _, ln := range []net.Listener{l.tcpLoopback, l.tcpAll, l.tcp6, l.unixAbs} {
		if ln != nil {
			ln.Close()
		}
	}
	if l.udpAll != nil {
		l.udpAll.Close()
	}
}

// localResolvers returns the nameservers of /etc/resolv.conf that are
// addresses of this machine.
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

// FindProcesses lists the processes under procRoot (the host's /proc)
// whose command line contains any of needles, as "pid: command".
func FindProcesses(procRoot string, needles ...string) []string {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		for _, n := range needles {
			if n != "" && strings.Contains(cmd, n) {
				found = append(found, e.Name()+": "+OneLine(cmd, 80))
				break
			}
		}
	}
	return found
}
