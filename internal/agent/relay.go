package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"
)

// The relay of a one-shot sandbox (`vertal-agent relay`, engine.RelayArgv):
// no agent serves there, so a process of its own relays the egress port
// to the host's socket, as the egress op does in a live sandbox, for as
// long as the sandbox lives.

// ListenRelay listens on 127.0.0.1:port for Relay and, if the sandbox
// has ::1, on [::1]:port too (a failure there is ignored: a program that
// reaches the proxy as localhost may try either).
func ListenRelay(port int) ([]*net.TCPListener, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("port %d: %w", port, ErrInvalid)
	}
	p := strconv.Itoa(port)
	ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", p))
	if err != nil {
		return nil, err
	}
	lns := []*net.TCPListener{ln.(*net.TCPListener)}
	if ln6, err := net.Listen("tcp6", net.JoinHostPort("::1", p)); err == nil {
		lns = append(lns, ln6.(*net.TCPListener))
	}
	return lns, nil
}

// Relay relays each connection lns accept to the unix socket at path,
// one unix connection for each (dialled anew: the socket need not exist
// yet; a connection it cannot take is closed), at most maxRelays at once.
// It returns once ctx ended, which closes lns and the relays in progress,
// or every listener failed. logf, if not nil, logs what goes wrong.
func Relay(ctx context.Context, lns []*net.TCPListener, path string, logf func(string, ...any)) {
	stop := context.AfterFunc(ctx, func() {
		for _, ln := range lns {
			ln.Close()
		}
	})
	defer stop()
	relayLoop(ctx, lns, path, logf)
}
