package api

import (
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// toResponse is one execution on the wire, for POST (run or replay), GET
// and cancel alike; GET may show it queued or running.
func toResponse(e store.Execution, requestID string) wire.Execution {
	var hook *wire.Webhook
	if w := e.Webhook; w != nil {
		hook = &wire.Webhook{URL: w.URL, State: w.State, Attempts: w.Attempts}
		if w.LastStatus != 0 {
			hook.LastStatus = &w.LastStatus
		}
		if w.LastError != "" {
			hook.LastError = &w.LastError
		}
	}
	files := make([]wire.ReturnedFile, 0, len(e.Files)) // [] when none, never null
	for _, f := range e.Files {
		files = append(files, wire.ReturnedFile{Path: f.Path, Size: int64(len(f.Content)), Encoding: "base64", Content: base64.StdEncoding.EncodeToString(f.Content)})
	}
	usage := wire.ExecutionUsage{
		SandboxSeconds:  round3(e.SandboxSeconds),
		CPUSeconds:      round3(e.CPUSeconds),
		PeakMemoryBytes: e.PeakMemoryBytes,
	}
	network := toNetwork(e, &usage)
	return wire.Execution{
		ID:             e.ID,
		Status:         e.Status,
		Stdout:         e.Stdout,
		Stderr:         e.Stderr,
		ExitCode:       e.ExitCode,
		DurationMS:     e.DurationMS,
		Truncated:      e.Truncated,
		Usage:          usage,
		Language:       e.Language,
		Image:          nilIfEmpty(e.Image),
		ImageVersion:   nilIfEmpty(e.ImageVersion),
		CreatedAt:      e.CreatedAt.Unix(),
		StartedAt:      unixOrNil(e.StartedAt),
		FinishedAt:     unixOrNil(e.FinishedAt),
		Files:          files,
		FilesTruncated: e.FilesTruncated,
		Webhook:        hook,
		Reason:         nilIfEmpty(e.Reason),
		OutputPurged:   e.Purged,
		RequestID:      requestID,
		Network:        network,
	}
}

// nilIfEmpty is s, or null when it was not recorded.
func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// unixOrNil is t in Unix seconds, or null when it has not happened.
func unixOrNil(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	u := t.Unix()
	return &u
}

// round3 keeps milliseconds, so sums of floats do not print 2.6350000001.
func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// setQuotaHeaders tells the client where its daily quota stands.
func setQuotaHeaders(h http.Header, q execution.Quota) {
	h.Set("X-Quota-Limit", strconv.FormatInt(q.Limit, 10))
	h.Set("X-Quota-Remaining", strconv.FormatInt(q.Remaining, 10))
	h.Set("X-Quota-Reset", strconv.FormatInt(q.Reset.Unix(), 10))
}

// createExecution translates POST /v1/executions to the execution service
// and its outcome back.
func (s *Server) createExecution(w http.ResponseWriter, r *http.Request, c *Caller) error {
	idemKey, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	in, async, err := s.decodeExecution(w, r, c)
	if err != nil {
		return err
	}
	req := runRequest(w, r, idemKey, in)
	if async || prefersAsync(r) {
		out, err := s.exec.Submit(r.Context(), *c, req)
		if err != nil {
			return err
		}
		resp := toResponse(out.Execution, infoFrom(r.Context()).id)
		resp.IdempotentReplay = out.Replay
		w.Header().Set("Location", apiPrefix(r)+"/v1/executions/"+out.Execution.ID)
		w.Header().Set("Preference-Applied", "respond-async")
		return s.writeJSON(w, r, http.StatusAccepted, resp)
	}
	if wantsEventStream(r) {
		return s.streamExecution(w, r, c, req)
	}
	out, err := s.exec.Run(r.Context(), *c, req)
	if err != nil {
		return err
	}
	info := infoFrom(r.Context())
	resp := toResponse(out.Execution, info.id)
	resp.IdempotentReplay = out.Replay
	return s.writeJSON(w, r, http.StatusOK, resp)
}

// runRequest is the service request of a POST: its execution id goes to
// the access log, its quota to the headers.
func runRequest(w http.ResponseWriter, r *http.Request, idemKey string, in execution.Input) execution.Request {
	info := infoFrom(r.Context())
	h := w.Header()
	return execution.Request{
		Input:          in,
		IdempotencyKey: idemKey,
		RequestID:      info.id,
		Accepted:       func(id string) { info.executionID = id },
		Quota:          func(q execution.Quota) { setQuotaHeaders(h, q) },
	}
}

func (s *Server) getExecution(w http.ResponseWriter, r *http.Request, c *Caller) error {
	e, err := s.exec.Get(r.Context(), *c, r.PathValue("id"))
	if err != nil {
		return err
	}
	info := infoFrom(r.Context())
	info.executionID = e.ID
	return s.writeJSON(w, r, http.StatusOK, toResponse(e, info.id))
}

func (s *Server) cancelExecution(w http.ResponseWriter, r *http.Request, c *Caller) error {
	info := infoFrom(r.Context())
	if id := r.PathValue("id"); execution.ValidID(id) {
		info.executionID = id
	}
	e, err := s.exec.Cancel(r.Context(), *c, r.PathValue("id"))
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toResponse(e, info.id))
}

// maxBodyBytes leaves room for the worst JSON escaping of the largest code,
// stdin, files, env and args the caller's plan allows (a control character
// such as \u0001 takes six bytes for one; base64 takes 4/3, less than
// that), so a request within the documented limits is never refused for
// its encoding. Only authenticated callers get this far, and the bound is
// the plan's: a free key cannot make the server read a large body.
func (s *Server) maxBodyBytes(p config.Plan) int64 {
	const esc = 6 // the worst JSON escaping, in bytes per byte
	n := int64(esc * (s.exec.MaxCodeBytes() + s.exec.MaxStdinBytes()))
	n += esc * p.FilesBytes()
	// Each file's path and the JSON around it.
	n += int64(p.FilesLimit()) * (esc*execution.MaxPathBytes + 64)
	n += esc*execution.MaxEnvBytes + execution.MaxEnv*16
	n += esc*execution.MaxArgsBytes + execution.MaxArgs*8
	n += execution.MaxReturnGlobs * (esc*execution.MaxGlobBytes + 8)
	return n + 64<<10
}

// decodeExecution reads the body strictly; the service checks the values.
// Every problem is named, so a client (or an agent) can fix its request
// without guessing.
func (s *Server) decodeExecution(w http.ResponseWriter, r *http.Request, c *Caller) (execution.Input, bool, error) {
	body, release, err := s.readJSONBody(w, r, s.maxBodyBytes(c.Plan), s.maxDecodedBytes(c.Plan))
	defer release()
	if err != nil {
		return execution.Input{}, false, err
	}
	// The files' decoded size is known before anything is expanded.
	if limit := c.Plan.FilesBytes(); limit > 0 {
		if n, ok := filesDecodedSize(body, limit); ok && n > limit {
			return execution.Input{}, false, errorf(KindPayloadTooLarge, "files are over %d bytes in all once decoded, which plan %s allows", limit, c.Key.Plan)
		}
	}
	var in wire.ExecutionRequest
	if err := decodeRequest(body, &in, execution.InvalidTimeout(*c)); err != nil {
		return execution.Input{}, false, err
	}
	return toInput(in), in.Async != nil && *in.Async, nil
}

// toInput is a decoded request as the service takes it.
func toInput(in wire.ExecutionRequest) execution.Input {
	files := make([]execution.InputFile, len(in.Files))
	for i, f := range in.Files {
		files[i] = execution.InputFile{Path: f.Path, Content: f.Content, Encoding: f.Encoding}
	}
	return execution.Input{Image: in.Image, Language: in.Language, Code: in.Code, TimeoutS: in.TimeoutS, Stdin: in.Stdin,
		Files: files, Env: in.Env, Args: in.Args, ReturnFiles: in.ReturnFiles, WebhookURL: in.WebhookURL,
		Network: (*execution.NetworkRequest)(in.Network)}
}

// toNetwork is an execution's stored network record as its "network"
// shows it, with its bytes in its usage; nil for one without (or a record
// that cannot be read, which is logged nowhere: it is only the view).
func toNetwork(e store.Execution, u *wire.ExecutionUsage) *wire.ExecutionNetwork {
	if e.Network == "" {
		return nil
	}
	var rec execution.NetworkRecord
	if err := json.Unmarshal([]byte(e.Network), &rec); err != nil {
		return nil
	}
	n := &wire.ExecutionNetwork{Allow: rec.Allow, BytesIn: rec.BytesIn, BytesOut: rec.BytesOut, Connections: rec.Connections, Refused: rec.Refused,
		Attempts: make([]wire.NetworkAttempt, 0, len(rec.Attempts))}
	if n.Allow == nil {
		n.Allow = []string{}
	}
	for _, a := range rec.Attempts {
		n.Attempts = append(n.Attempts, wire.NetworkAttempt(a))
	}
	u.NetworkBytesIn, u.NetworkBytesOut = &n.BytesIn, &n.BytesOut
	return n
}

// prefersAsync reports the header Prefer: respond-async (RFC 7240).
func prefersAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for _, p := range strings.Split(v, ",") {
			if name, _, _ := strings.Cut(strings.TrimSpace(p), ";"); strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// apiPrefix is "/api" for a request that came in under it, else "".
func apiPrefix(r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		return "/api"
	}
	return ""
}

// clip shortens client input echoed in a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
