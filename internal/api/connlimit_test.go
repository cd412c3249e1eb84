package api

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLimitListener opens real TCP connections on loopback, from several
// source addresses (all of 127/8 is loopback on Linux), and checks which
// are served and which get the 503 in the error shape.
func TestLimitListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		// Long enough that no connection of this test closes by itself.
		IdleTimeout: time.Minute,
	}
	go srv.Serve(LimitListener(ln, ConnLimits{Max: 3, PerAddr: 2, Metrics: m}))
	t.Cleanup(func() { srv.Close() })

	var open []net.Conn
	t.Cleanup(func() {
		for _, c := range open {
			c.Close()
		}
	})
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("dial from %s: %v", from, err)
		}
		open = append(open, c)
		return c
	}
	for i, tc := range []struct {
		from    string
		close   int // index of an earlier connection to close first, or -1
		status  int
		message string
	}{
		{from: "127.0.0.1", close: -1, status: 200},
		{from: "127.0.0.1", close: -1, status: 200},
		{from: "127.0.0.1", close: -1, status: 503, message: "too many open connections from your address (at most 2)"},
		{from: "127.0.0.2", close: -1, status: 200},
		{from: "127.0.0.3", close: -1, status: 503, message: "too many open connections"},
		// A closed connection gives its place back.
		{from: "127.0.0.3", close: 0, status: 200},
		{from: "127.0.0.1", close: -1, status: 503, message: "too many open connections"},
	} {
		if tc.close >= 0 {
			open[tc.close].Close()
			waitFor(t, func() bool { return m.openConnections() == 2 })
		}
		c := dial(tc.from)
		status, body := get(t, c)
		if status != tc.status {
			t.Fatalf("connection %d from %s: status %d, want %d (%s)", i, tc.from, status, tc.status, body)
		}
		if tc.status != 503 {
			continue
		}
		var e struct {
			Error     struct{ Code, Message string }
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != "overloaded" ||
			!strings.Contains(e.Error.Message, tc.message) || !strings.HasPrefix(e.RequestID, "req_") {
			t.Errorf("connection %d: body %s (%v)", i, body, err)
		}
		// The server closed it.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("connection %d: still open after the 503 (%d, %v)", i, n, err)
		}
	}
	// The served connections are still usable (keep-alive).
	if status, _ := get(t, open[1]); status != 200 {
		t.Errorf("second request on a kept connection: %d", status)
	}
	if got := m.openConnections(); got != 3 {
		t.Errorf("open connections gauge %d, want 3", got)
	}
}

// TestLimitListenerIdleTimeout: a kept-alive connection that sits idle is
// closed by the server's idle timeout and gives its place back.
func TestLimitListenerIdleTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	srv := &http.Server{
		Handler:     http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		IdleTimeout: time.Second,
	}
	go srv.Serve(LimitListener(ln, ConnLimits{Max: 1, Metrics: m}))
	t.Cleanup(func() { srv.Close() })
	dial := func() net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	idle := dial()
	if status, _ := get(t, idle); status != 200 {
		t.Fatalf("first: %d", status)
	}
	if status, _ := get(t, dial()); status != 503 {
		t.Errorf("second while the first is open: %d, want 503", status)
	}
	waitFor(t, func() bool { return m.openConnections() == 0 })
	if status, _ := get(t, dial()); status != 200 {
		t.Errorf("after the idle one was closed: %d, want 200", status)
	}
	idle.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := idle.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the idle connection is still open")
	}
}

// get sends one GET on c and reads the answer.
func get(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (m *Metrics) openConnections() int { return int(testutil.ToFloat64(m.connsOpen)) }
