package egress

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzProxy writes what a sandbox could write to its proxy (request
// lines, CONNECT authorities, headers, tunnels, garbage) and checks that
// whatever it is, no plain HTTP request reaches a site under a name the
// policy does not allow: other.example.test resolves to the same
// loopback site as the allowed names, so only the proxy's decision keeps
// it out. {HTTP} and {TLS} in an input stand for the sites' ports.
func FuzzProxy(f *testing.F) {
	for _, s := range []string{
		"GET http://api.example.test:{HTTP}/hello HTTP/1.1\r\nHost: api.example.test:{HTTP}\r\n\r\n",
		"GET http://api.example.test:{HTTP}/hello HTTP/1.1\r\nHost: other.example.test:{HTTP}\r\n\r\n",
		"GET http://other.example.test:{HTTP}/hello HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
		"CONNECT api.example.test:{HTTP} HTTP/1.1\r\nHost: api.example.test:{HTTP}\r\n\r\nGET /hello HTTP/1.1\r\nHost: other.example.test:{HTTP}\r\n\r\n",
		"CONNECT api.example.test:{HTTP} HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\nHost: api.example.test:{HTTP}\r\n\r\nGET /b HTTP/1.1\r\nHost: other.example.test:{HTTP}\r\n\r\n",
		"CONNECT api.example.test:{TLS} HTTP/1.1\r\n\r\nGET /hello HTTP/1.1\r\nHost: other.example.test\r\n\r\n",
		"CONNECT [::1]:{HTTP} HTTP/1.1\r\n\r\n",
		"CONNECT other.example.test.:{HTTP} HTTP/1.1\r\n\r\n",
		"GET http://API.EXAMPLE.TEST.:{HTTP}/ HTTP/1.0\r\n\r\n",
		"POST http://a.wild.example.test:{HTTP}/hello HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\nGET http://other.example.test:{HTTP}/ HTTP/1.1\r\n\r\n",
		"\x16\x03\x01\x00\x05hello",
	} {
		f.Add(s)
	}
	w := newWorld(f, 1<<20)
	var mu sync.Mutex
	var hosts []string
	site := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go site.Serve(ln)
	f.Cleanup(func() { site.Close() })
	// The sites' HTTP port is this recording server's from here on.
	sitePort := ln.Addr().(*net.TCPAddr).Port
	w.proxy.opts.HTTPPorts = []int{sitePort}
	f.Fuzz(func(t *testing.T, in string) {
		in = strings.NewReplacer("{HTTP}", strconv.Itoa(sitePort), "{TLS}", strconv.Itoa(w.tlsPort)).Replace(in)
		c, err := net.Dial("tcp", w.proxyURL.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Write([]byte(in)); err == nil {
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, h := range hosts {
			name, _, err := net.SplitHostPort(h)
			if err != nil {
				name = h
			}
			if name = strings.TrimSuffix(strings.ToLower(name), "."); name != "api.example.test" && name != "a.wild.example.test" {
				t.Fatalf("a request for %q reached the site from input %q", h, in)
			}
		}
		hosts = hosts[:0]
	})
}
