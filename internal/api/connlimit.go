package api

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// ConnLimits bound the connections the API listener keeps open. Without
// them, idle keep-alive connections that never send a key can use up the
// server's file descriptors.
type ConnLimits struct {
	// Max is the most connections open at once, from all clients.
	Max int
	// PerAddr is the most open at once from one client IP address; 0
	// means no per-address cap (behind a proxy every client has its
	// address).
	PerAddr int
	// Logger receives one line per burst of refusals; nil discards.
	Logger *slog.Logger
	// Metrics counts refusals and open connections; may be nil.
	Metrics *Metrics
}

// maxRefusing bounds the goroutines that answer refused connections;
// beyond it a refused connection is closed without an answer.
const maxRefusing = 64

// LimitListener wraps ln so that a connection over the limits is answered
// with a 503 in the API's error shape and closed, instead of being
// served. Accepted connections count until they are closed.
func LimitListener(ln net.Listener, o ConnLimits) net.Listener {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: ln, o: o, byAddr: map[string]int{}, refusing: make(chan struct{}, maxRefusing)}
}

type limitListener struct {
	net.Listener
	o        ConnLimits
	refusing chan struct{}

	mu         sync.Mutex
	open       int
	byAddr     map[string]int
	refused    int       // since the last log line
	lastLogged time.Time // of a refusal
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteIP(c)
		if why := l.admit(addr); why != "" {
			l.refuse(c, why)
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(addr) }}, nil
	}
}

// admit counts a new connection from addr, or says why it is refused.
func (l *limitListener) admit(addr string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var why string
	switch {
	case l.open >= l.o.Max:
		why = "total"
	case l.o.PerAddr > 0 && l.byAddr[addr] >= l.o.PerAddr:
		why = "per_address"
	default:
		l.open++
		l.byAddr[addr]++
		l.o.Metrics.setOpenConnections(l.open)
		return ""
	}
	l.refused++
	if now := time.Now(); now.Sub(l.lastLogged) >= 10*time.Second {
		l.o.Logger.Warn("refusing connections over the limit", "refused", l.refused, "reason", why,
			"open", l.open, "max_conns", l.o.Max, "max_conns_per_ip", l.o.PerAddr)
		l.refused, l.lastLogged = 0, now
	}
	l.o.Metrics.observeRefusedConnection(why)
	return why
}

func (l *limitListener) release(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
		delete(l.byAddr, addr)
	}
	l.o.Metrics.setOpenConnections(l.open)
}

// refuse answers c with a 503 and closes it, off the accept loop. The
// request is read briefly after the answer so that closing does not reset
// the connection before the client has read it.
func (l *limitListener) refuse(c net.Conn, why string) {
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		msg := "the server has too many open connections; try again shortly"
		if why == "per_address" {
			msg = fmt.Sprintf("too many open connections from your address (at most %d); reuse or close them", l.o.PerAddr)
		}
		if _, err := io.WriteString(c, overloadedResponse(msg)); err != nil {
			return
		}
		if tc, ok := c.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// overloadedResponse is a whole HTTP/1.1 503 answer in the error shape.
func overloadedResponse(msg string) string {
	id := newRequestID()
	body, _ := json.Marshal(wire.Error{Error: wire.ErrorDetail{Code: kinds[KindOverloaded].code, Message: msg}, RequestID: id})
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Request-ID: %s\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s\n",
		http.StatusServiceUnavailable, http.StatusText(http.StatusServiceUnavailable), id, len(body)+1, body)
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// limitedConn gives its place back once, on the first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
