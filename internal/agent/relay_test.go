package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

func TestListenRelayRefuses(t *testing.T) {
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		port int
		want error
	}{
		{0, ErrInvalid},
		{-1, ErrInvalid},
		{65536, ErrInvalid},
		{taken.Addr().(*net.TCPAddr).Port, syscall.EADDRINUSE},
	} {
		if lns, err := ListenRelay(tc.port); !errors.Is(err, tc.want) {
			for _, ln := range lns {
				ln.Close()
			}
			t.Errorf("ListenRelay(%d): %v, want %v", tc.port, err, tc.want)
		}
	}
}

// TestRelay: Relay serves 127.0.0.1 and, where there is ::1, [::1] on
// the same port, each connection to the unix socket, until ctx ends.
func TestRelay(t *testing.T) {
	sock, _ := egressServer(t, false)
	port := e2etest.FreePort(t)
	lns, err := ListenRelay(port)
	if err != nil {
		t.Fatal(err)
	}
	hosts := []string{"127.0.0.1"}
	if ln, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		ln.Close()
		hosts = append(hosts, "::1")
	}
	if len(lns) != len(hosts) {
		t.Fatalf("%d listeners, want %d (%v)", len(lns), len(hosts), hosts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		Relay(ctx, lns, sock, t.Logf)
		close(done)
	}()
	for _, host := range hosts {
		conn, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(conn, "x")
		conn.(*net.TCPConn).CloseWrite()
		if b, err := io.ReadAll(conn); string(b) != "hi\ngot x" || err != nil {
			t.Errorf("through %s: %q, %v; want %q", host, b, err, "hi\ngot x")
		}
		conn.Close()
	}
	// A relay in progress ends with ctx too.
	open, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	open.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(open, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Relay did not return after ctx ended")
	}
	if b, err := io.ReadAll(open); len(b) != 0 || err != nil {
		t.Errorf("the relay in progress: %q, %v; want its end", b, err)
	}
	for _, host := range hosts {
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), 5*time.Second); err == nil {
			conn.Close()
			t.Errorf("%s:%d still accepts after Relay returned", host, port)
		}
	}
}
