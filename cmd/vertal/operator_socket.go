package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

// The operator socket: a running server answers on a Unix socket in its
// data directory, mode 0600, with the settings it runs with, so that
// `vertal status` prints the server's settings and not its own flags.
// Whoever can open the socket can read the server's store as well, so the
// file's permissions are the authentication, as with Docker's socket and
// tailscaled's local API. Nothing is served on a TCP port: anonymous
// callers see no more than /health shows.

// operatorSocketName is the socket's file name in the data directory.
const operatorSocketName = "vertal.sock"

func operatorSocket(dataDir string) string { return filepath.Join(dataDir, operatorSocketName) }

// serverSettings are the effective settings of a running server: what it
// resolved (the runtime it picked, its node id), not what a flag asked for.
// Never a secret: the edge secret is only said to be set.
type serverSettings struct {
	Driver        string `json:"driver"`
	Runtime       string `json:"runtime"` // "auto": the best installed, when not resolved
	MaxConcurrent int    `json:"max_concurrent"`
	MaxQueue      int    `json:"max_queue"`
	PoolMin       int    `json:"pool_min"`
	PoolMax       int    `json:"pool_max"`
	PoolMemoryMB  int    `json:"pool_memory_mb"`
	MetricsAddr   string `json:"metrics_addr,omitempty"`
	EdgeSecret    bool   `json:"edge_secret"`
	NodeID        string `json:"node_id,omitempty"`
	AsyncWorkers  int    `json:"async_workers,omitempty"`
}

// newServerSettings describes cfg as run by a driver named driverName
// ("oci/crun", "docker/runsc", or the configuration's own "oci/" when no
// driver has resolved the runtime).
func newServerSettings(cfg config.Config, driverName, nodeID string, asyncWorkers int) serverSettings {
	driver, runtime, _ := strings.Cut(driverName, "/")
	switch {
	case runtime == "" && driver == "docker":
		runtime = "docker's default"
	case runtime == "":
		runtime = "auto"
	}
	return serverSettings{
		Driver: driver, Runtime: runtime,
		MaxConcurrent: cfg.MaxConcurrent, MaxQueue: cfg.MaxQueue,
		PoolMin: cfg.PoolMin, PoolMax: cfg.PoolMax, PoolMemoryMB: cfg.PoolMemoryMB,
		MetricsAddr: cfg.MetricsAddr, EdgeSecret: cfg.EdgeSecret != "",
		NodeID: nodeID, AsyncWorkers: asyncWorkers,
	}
}

// serveOperatorSocket answers GET /settings on the data directory's
// socket until the returned func is called. The API runs without it if
// the socket cannot be made; a socket another live server answers on is
// left alone.
func serveOperatorSocket(dataDir string, set serverSettings, logger *slog.Logger) (stop func()) {
	path := operatorSocket(dataDir)
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		logger.Warn("another server answers on the operator socket; vertal status will ask that one", "socket", path)
		return func() {}
	}
	ln, err := listenOperatorSocket(path)
	if err != nil {
		logger.Warn("no operator socket; vertal status will show its own settings", "socket", path, "error", err)
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /settings", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(set)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() } // closing the listener removes the file
}

func listenOperatorSocket(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	// Nobody answers on it (checked above): a crashed server's socket.
	// Anything else at that path is not ours to remove.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; not replacing it", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	// The socket is bound in a fresh directory only its owner can enter,
	// made 0600 there, and only then renamed into place: at no moment can
	// another local user connect to it (a chmod after Listen at path would
	// leave a window).
	priv, err := os.MkdirTemp(filepath.Dir(path), ".vertal-sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(priv)
	tmp := filepath.Join(priv, "s")
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, err
	}
	return &unlinkOnClose{UnixListener: ul, path: path}, nil
}

// unlinkOnClose removes the socket's final path when the listener closes
// (net's own unlinking knows only the path it was bound at).
type unlinkOnClose struct {
	*net.UnixListener
	path string
}

func (l *unlinkOnClose) Close() error {
	err := l.UnixListener.Close()
	_ = os.Remove(l.path)
	return err
}

// askServer reads the settings of the server running on dataDir.
func askServer(ctx context.Context, dataDir string, timeout time.Duration) (serverSettings, error) {
	path := operatorSocket(dataDir)
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	defer hc.CloseIdleConnections()
	var set serverSettings
	res, err := get(ctx, hc, "http://vertal/settings")
	if errors.Is(err, os.ErrNotExist) {
		return set, fmt.Errorf("no server socket at %s (is the server running, with this --data-dir?)", path)
	}
	if err != nil {
		return set, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return set, fmt.Errorf("GET /settings on %s: %s", path, res.Status)
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 64<<10)).Decode(&set); err != nil {
		return set, fmt.Errorf("reading the settings on %s: %w", path, err)
	}
	return set, nil
}
