package fakenet

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Request is an HTTP request that one of the fake servers answered. It is
// recorded before the answer is written, so once a client has the answer,
// Requests has the request.
type Request struct {
	Scheme   string         // "http" or "https"
	Host     string         // the Host header, as sent
	SNI      string         // the TLS server name; "" over http
	Method   string         // "GET"...
	Path     string         // path and query, as sent: "/bytes?n=10"
	Local    netip.AddrPort // the server's address: 203.0.113.10:443
	Remote   netip.AddrPort // the client's address: 198.51.100.2:40312
	BytesIn  int64          // request body bytes read
	BytesOut int64          // response body bytes answered
}

// Conn is a TCP connection one of the fake servers accepted, whether or not
// a request (or a TLS handshake) followed.
type Conn struct {
	Local  netip.AddrPort // 203.0.113.10:80 or :443 (or the IPv6 ones)
	Remote netip.AddrPort
}

// Datagram is a UDP datagram the fake listener on port 53 or 9999 got.
type Datagram struct {
	Local  netip.AddrPort // 203.0.113.10:53, 203.0.113.10:9999 (or the IPv6 ones)
	Remote netip.AddrPort
	Data   []byte
}

// Requests returns the HTTP and HTTPS requests the fake servers answered,
// in order.
func (n *Net) Requests() []Request {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Request(nil), n.requests...)
}

// Conns returns the TCP connections the fake servers accepted, in order.
func (n *Net) Conns() []Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Conn(nil), n.conns...)
}

// UDPSeen returns the datagrams the fake UDP listeners got, in order. The
// listener on port 9999 echoes each one back; the one on 53 does not answer.
func (n *Net) UDPSeen() []Datagram {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Datagram, len(n.udp))
	for i, d := range n.udp {
		d.Data = bytes.Clone(d.Data)
		out[i] = d
	}
	return out
}

const (
	maxBytes = 1 << 30  // the largest /bytes?n=
	maxEcho  = 64 << 20 // the most /echo reads
)

// handler answers any host: /bytes?n=N with N bytes of 'x', /echo with the
// request body, anything else with "hello from <host> <path>\n".
func (n *Net) handler(scheme string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := Request{
			Scheme: scheme,
			Host:   r.Host,
			Method: r.Method,
			Path:   r.URL.RequestURI(),
		}
		if r.TLS != nil {
			rec.SNI = r.TLS.ServerName
		}
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			rec.Local = addrPort(a)
		}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			rec.Remote = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		}
		var body []byte
		switch r.URL.Path {
		case "/bytes":
			rec.BytesIn, _ = io.Copy(io.Discard, r.Body)
			size, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			if err != nil || size < 0 || size > maxBytes {
				body = []byte("n must be 0 to " + strconv.Itoa(maxBytes) + "\n")
				rec.BytesOut = int64(len(body))
				n.addRequest(rec)
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write(body)
				return
			}
			rec.BytesOut = size
			n.addRequest(rec)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			chunk := bytes.Repeat([]byte{'x'}, 32<<10)
			for size > 0 {
				k := min(size, int64(len(chunk)))
				if _, err := w.Write(chunk[:k]); err != nil {
					return
				}
				size -= k
			}
			return
		case "/echo":
			var err error
			body, err = io.ReadAll(io.LimitReader(r.Body, maxEcho))
			if err != nil {
				return
			}
			rec.BytesIn = int64(len(body))
		default:
			rec.BytesIn, _ = io.Copy(io.Discard, r.Body)
			body = []byte(fmt.Sprintf("hello from %s %s\n", r.Host, r.URL.Path))
		}
		rec.BytesOut = int64(len(body))
		n.addRequest(rec)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
}

func (n *Net) addRequest(r Request) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.requests = append(n.requests, r)
}

// serve opens the fake servers' sockets in InetNS and serves them from
// ordinary goroutines until t's cleanup.
func (n *Net) serve(t testing.TB, cert tls.Certificate) error {
	type tcpSpec struct {
		addr   string
		scheme string
	}
	tcps := []tcpSpec{{n.HTTPAddr, "http"}, {n.HTTPSAddr, "https"}}
	udps := []string{n.DNSAddr, n.UDPAddr}
	if n.IPv6 {
		n.HTTPAddr6 = net.JoinHostPort(InetIP6, "80")
		n.HTTPSAddr6 = net.JoinHostPort(InetIP6, "443")
		n.DNSAddr6 = net.JoinHostPort(InetIP6, "53")
		n.UDPAddr6 = net.JoinHostPort(InetIP6, "9999")
		tcps = append(tcps, tcpSpec{n.HTTPAddr6, "http"}, tcpSpec{n.HTTPSAddr6, "https"})
		udps = append(udps, n.DNSAddr6, n.UDPAddr6)
	}

	var (
		lns  []net.Listener
		pcs  []*net.UDPConn
		wg   sync.WaitGroup
		srvs []*http.Server
		stop = func() {
			for _, s := range srvs {
				_ = s.Close()
			}
			for _, l := range lns {
				_ = l.Close()
			}
			for _, pc := range pcs {
				_ = pc.Close()
			}
			wg.Wait()
		}
	)
	t.Cleanup(stop)
	err := inNetns(nsPath(n.InetNS), func() error {
		for _, s := range tcps {
			l, err := net.Listen("tcp", s.addr)
			if err != nil {
				return err
			}
			lns = append(lns, l)
		}
		for _, a := range udps {
			pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(a)))
			if err != nil {
				return err
			}
			pcs = append(pcs, pc)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listening in %s: %w", n.InetNS, err)
	}

	tlsConf := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	for i, s := range tcps {
		var l net.Listener = recListener{lns[i], n}
		if s.scheme == "https" {
			l = tls.NewListener(l, tlsConf)
		}
		srv := &http.Server{
			Handler:           n.handler(s.scheme),
			ReadHeaderTimeout: 30 * time.Second,
			// A client that refuses the certificate is a normal event in
			// an egress test; say nothing of it.
			ErrorLog: log.New(io.Discard, "", 0),
		}
		srvs = append(srvs, srv)
		wg.Go(func() { _ = srv.Serve(l) })
	}
	for i, pc := range pcs {
		echo := udps[i] == n.UDPAddr || udps[i] == n.UDPAddr6
		dns := udps[i] == n.DNSAddr || udps[i] == n.DNSAddr6
		wg.Go(func() { n.serveUDP(pc, echo, dns) })
	}
	return nil
}

func (n *Net) serveUDP(pc *net.UDPConn, echo, dns bool) {
	local := addrPort(pc.LocalAddr())
	buf := make([]byte, 64<<10)
	for {
		k, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		n.mu.Lock()
		n.udp = append(n.udp, Datagram{Local: local, Remote: from, Data: bytes.Clone(buf[:k])})
		n.mu.Unlock()
		if echo {
			_, _ = pc.WriteToUDPAddrPort(buf[:k], from)
		}
		if dns {
			if a := n.answerDNS(buf[:k]); a != nil {
				_, _ = pc.WriteToUDPAddrPort(a, from)
			}
		}
	}
}

// recListener records each connection it accepts.
type recListener struct {
	net.Listener
	n *Net
}

func (l recListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.mu.Lock()
		l.n.conns = append(l.n.conns, Conn{Local: addrPort(c.LocalAddr()), Remote: addrPort(c.RemoteAddr())})
		l.n.mu.Unlock()
	}
	return c, err
}

func addrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		ap, _ = netip.ParseAddrPort(a.String())
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// newCert makes a CA and, signed by it, a certificate for allowed.test,
// other.test, v6only.test, 203.0.113.10 and 2001:db8::10. It returns the
// CA as PEM.
func newCert() (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, fmt.Errorf("generating the CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vertal fakenet test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, fmt.Errorf("making the CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, cert, fmt.Errorf("parsing the CA certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, fmt.Errorf("generating the server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "allowed.test"},
		DNSNames:     []string{"allowed.test", "other.test", "v6only.test"},
		IPAddresses:  []net.IP{net.ParseIP(InetIP4), net.ParseIP(InetIP6)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, fmt.Errorf("making the server certificate: %w", err)
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}, nil
}
