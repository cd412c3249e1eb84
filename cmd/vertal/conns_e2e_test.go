package main

// End-to-end test of the connection caps: a flood of connections that
// never finish their request header, from many loopback addresses, must
// not keep an authenticated caller out of a real 2-slot server.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConnFloodE2E: 17 source addresses × 64 connections holding an
// unfinished request header, without a key, reconnecting whenever the
// server closes one; meanwhile a tenant makes 40 executions, each on a new
// connection. At least 90% of them are served. All of 127/8 is loopback
// on Linux, so the sources can be one /24 (127.0.0.2..18, the tenant's
// own) or 17 distinct /24s (127.0.1.2, 127.0.2.2, …). IPv6 loopback is
// the one address ::1, which the server does not listen on by default:
// the /64 grouping is covered by the api package's unit tests.
func TestConnFloodE2E(t *testing.T) {
	needE2E(t)
	p := startServer(t, t.TempDir(), nil, "--max-concurrent", "2")
	key := tenantKey(t, p, "tenant", "pro")
	addr := strings.TrimPrefix(p.url, "http://")
	for _, tc := range []struct {
		name    string
		sources func(i int) string
	}{
		{name: "one /24", sources: func(i int) string { return fmt.Sprintf("127.0.0.%d", 2+i) }},
		{name: "17 /24s", sources: func(i int) string { return fmt.Sprintf("127.0.%d.2", 1+i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sources []string
			for i := range 17 {
				sources = append(sources, tc.sources(i))
			}
			connects, stop := halfOpenFlood(addr, sources, 64)
			defer stop()
			waitFor(t, func() bool { return connects.Load() >= 17*64 })

			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
			const n = 40
			served := 0
			outcomes := map[string]int{}
			for range n {
				status, body, err := execute(client, p.url+"/api/v1/executions", key)
				switch {
				case err != nil:
					outcomes["transport error"]++
				case status == 200 && body["stdout"] == "1\n":
					served++
					outcomes["200"]++
				default:
					outcomes[fmt.Sprint(status)]++
				}
			}
			t.Logf("%s: tenant served %d of %d (%v); the flood connected %d times", tc.name, served, n, outcomes, connects.Load())
			if served*10 < n*9 {
				t.Errorf("tenant served %d of %d under the connection flood, want at least 90%%", served, n)
			}
		})
	}
}

// halfOpenFlood holds per connections from each source address, each
// with a request header that never ends, and opens a new one shortly
// after the server closes one. It returns the count of connections made
// and a function that ends the flood.
func halfOpenFlood(addr string, sources []string, per int) (*atomic.Int64, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var connects atomic.Int64
	for _, src := range sources {
		for range per {
			wg.Go(func() {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
				for ctx.Err() == nil {
					if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
						connects.Add(1)
						stop := context.AfterFunc(ctx, func() { c.Close() })
						if _, err := io.WriteString(c, "POST /api/v1/executions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"); err == nil {
							_, _ = io.Copy(io.Discard, c) // until the server closes it
						}
						stop()
						c.Close()
					}
					select {
					case <-ctx.Done():
					case <-time.After(250 * time.Millisecond):
					}
				}
			})
		}
	}
	return &connects, func() { cancel(); wg.Wait() }
}

// execute runs echo 1 for key on a new connection; a refused connection
// is an error, not a failure of the test.
func execute(client *http.Client, u, key string) (int, map[string]any, error) {
	body := strings.NewReader(`{"language":"bash","code":"echo 1"}`)
	req, err := http.NewRequest("POST", u, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	var m map[string]any
	err = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m, err
}
