package api

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

func TestE2BKeepaliveInterval(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"", 50 * time.Second},
		{"50", 50 * time.Second},
		{"1", 5 * time.Second},
		{"100000", 300 * time.Second},
		{"-3", 50 * time.Second},
		{"soon", 50 * time.Second},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Keepalive-Ping-Interval", tc.header)
		}
		if got := e2bKeepalive(h); got != tc.want {
			t.Errorf("Keepalive-Ping-Interval %q: %v, want %v", tc.header, got, tc.want)
		}
	}
}

// TestKeepalivePingsUntilStopped: pings come while the stream is open and
// none after stop returns.
func TestKeepalivePingsUntilStopped(t *testing.T) {
	var n atomic.Int32
	stop := keepalive(10*time.Millisecond, func() { n.Add(1) })
	for deadline := time.Now().Add(5 * time.Second); n.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	got := n.Load()
	if got < 3 {
		t.Fatalf("%d pings, want at least 3", got)
	}
	time.Sleep(50 * time.Millisecond)
	if after := n.Load(); after != got {
		t.Errorf("%d pings after stop", after-got)
	}
}
