package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// requestInfo is what the access log needs to know about a request; the
// handlers fill it in as they learn it.
type requestInfo struct {
	id          string
	start       time.Time
	route       string
	tenant      string
	keyID       string
	executionID string
	sandboxID   string
	errCode     string
	err         error
	clientGone  bool
	// abort: the answer started and then failed; the connection is cut
	// after the log line (http.ErrAbortHandler), so the client sees a
	// broken body rather than a short one that looks whole.
	abort bool
	// forwardedTo is the node a sandbox call was proxied to (forward.go).
	forwardedTo string
}

type infoKey struct{}

// infoFrom never returns nil, so handlers tested without ServeHTTP work.
func infoFrom(ctx context.Context) *requestInfo {
	if i, ok := ctx.Value(infoKey{}).(*requestInfo); ok {
		return i
	}
	return &requestInfo{}
}

// RequestID returns the id of the request ctx belongs to ("" outside one).
func RequestID(ctx context.Context) string { return infoFrom(ctx).id }

// statusWriter remembers what was written for the access log.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Flush lets streaming handlers (MCP's server-sent events) flush through.
func (w *statusWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeJSON writes v with status. HTML is not escaped: the content type is
// JSON and nosniff is set, and program output stays readable in curl.
func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return internal(err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
	return nil
}

// writeError writes err in the error shape and notes it for the log.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	info := infoFrom(r.Context())
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client hung up; there is nobody to answer.
		info.clientGone, info.err = true, err
		return
	}
	e := asError(err)
	info.errCode, info.err = kindCode(e.Kind), e
	s.metrics.observeError(kindCode(e.Kind))
	if sw, ok := w.(*statusWriter); ok && sw.wrote {
		return // too late for a status; the log has it
	}
	writeErrorHeaders(e, w.Header())
	if isE2BPath(r.URL.Path) {
		s.writeE2BError(w, r, e)
		return
	}
	if e.Kind == KindUnauthorized && isMCPPath(r.URL.Path) {
		w.Header().Set("WWW-Authenticate", s.mcpChallenge(r, e.Msg))
	}
	_ = s.writeJSON(w, r, kindStatus(e.Kind), wire.Error{
		Error:     wire.ErrorDetail{Code: kindCode(e.Kind), Message: e.Msg},
		RequestID: info.id,
	})
}

// EdgeSecretHeader carries the shared secret from the edge proxy.
const EdgeSecretHeader = "X-Vertal-Edge-Secret"

// edgeAllowed compares hashes in constant time, so neither the secret's
// bytes nor its length leak through timing.
func (s *Server) edgeAllowed(r *http.Request) bool {
	if s.edgeSecret == nil || r.URL.Path == "/health" || r.URL.Path == "/api/health" {
		return true
	}
	got := sha256.Sum256([]byte(r.Header.Get(EdgeSecretHeader)))
	if subtle.ConstantTimeCompare(got[:], s.edgeSecret[:]) != 1 {
		return false
	}
	// Only the edge knows the secret: its connection carries many
	// clients, so it is never taken for an unauthenticated one.
	authenticatedConn(r.Context())
	return true
}

func stack() string { return string(debug.Stack()) }
