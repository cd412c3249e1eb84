package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// executionRequest is the body of POST /v1/executions. Pointers tell a
// missing field from a zero one.
type executionRequest struct {
	Language *string  `json:"language"`
	Code     *string  `json:"code"`
	TimeoutS *float64 `json:"timeout_s"`
	Stdin    *string  `json:"stdin"`
}

// runRequest is a validated execution request.
type runRequest struct {
	lang     engine.Language
	code     string
	stdin    string
	timeoutS float64
	// hash identifies the request for Idempotency-Key: the canonical
	// language, code, stdin and effective timeout, so "py" and "python"
	// (or an omitted and an explicit default timeout) are the same request.
	hash string
}

type usageJSON struct {
	SandboxSeconds  float64 `json:"sandbox_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
}

// executionResponse is one finished execution on the wire, for POST (run
// or replay) and GET alike.
type executionResponse struct {
	ID               string    `json:"id"`
	Status           string    `json:"status"`
	Stdout           string    `json:"stdout"`
	Stderr           string    `json:"stderr"`
	ExitCode         int       `json:"exit_code"`
	DurationMS       int64     `json:"duration_ms"`
	Truncated        bool      `json:"truncated"`
	Usage            usageJSON `json:"usage"`
	Language         string    `json:"language"`
	CreatedAt        int64     `json:"created_at"`
	IdempotentReplay bool      `json:"idempotent_replay,omitempty"`
	OutputPurged     bool      `json:"output_purged,omitempty"`
	RequestID        string    `json:"request_id"`
}

func toResponse(e store.Execution, requestID string) executionResponse {
	return executionResponse{
		ID:         e.ID,
		Status:     e.Status,
		Stdout:     e.Stdout,
		Stderr:     e.Stderr,
		ExitCode:   e.ExitCode,
		DurationMS: e.DurationMS,
		Truncated:  e.Truncated,
		Usage: usageJSON{
			SandboxSeconds:  round3(e.SandboxSeconds),
			CPUSeconds:      round3(e.CPUSeconds),
			PeakMemoryBytes: e.PeakMemoryBytes,
		},
		Language:     e.Language,
		CreatedAt:    e.CreatedAt.Unix(),
		OutputPurged: e.Purged,
		RequestID:    requestID,
	}
}

// round3 keeps milliseconds, so sums of floats do not print 2.6350000001.
func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// runMargin is added to an execution's timeout to bound the whole run,
// including sandbox creation and teardown, when the client has gone.
const runMargin = 60 * time.Second

func (s *Server) createExecution(w http.ResponseWriter, r *http.Request, c *Caller) error {
	ctx := r.Context()
	info := infoFrom(ctx)
	idemKey, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	req, err := s.decodeExecution(w, r, c)
	if err != nil {
		return err
	}

	if idemKey != "" {
		replay, err := s.claimIdempotency(ctx, c, idemKey, req.hash)
		if err != nil {
			return err
		}
		if replay != nil {
			s.metrics.observeReplay()
			info.executionID = replay.ID
			resp := toResponse(*replay, info.id)
			resp.IdempotentReplay = true
			return s.writeJSON(w, r, http.StatusOK, resp)
		}
	}
	// From here on this request owns the claim: unless an execution is
	// attached to it, it is released so that a retry may run.
	completed := false
	if idemKey != "" {
		defer func() {
			if !completed {
				if err := s.store.ReleaseIdempotency(context.WithoutCancel(ctx), c.Key.Tenant, idemKey); err != nil {
					s.log.Error("releasing idempotency key", "request_id", info.id, "error", err)
				}
			}
		}()
	}

	release, err := s.engine.Acquire(ctx)
	if errors.Is(err, engine.ErrBusy) {
		e := errorf(KindOverloaded, "every sandbox is busy; retry shortly")
		e.RetryAfter = 1
		return e
	}
	if err != nil {
		return err // the client left the queue
	}
	defer release()

	now := s.now().UTC()
	day := now.Format(time.DateOnly)
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	limit := c.Plan.ExecutionsPerDay
	used, err := s.store.ReserveExecution(ctx, c.Key.Tenant, day, limit)
	h := w.Header()
	h.Set("X-Quota-Limit", strconv.FormatInt(limit, 10))
	h.Set("X-Quota-Reset", strconv.FormatInt(midnight.Unix(), 10))
	if errors.Is(err, store.ErrQuotaExceeded) {
		h.Set("X-Quota-Remaining", "0")
		e := errorf(KindQuotaExceeded, "daily quota of %d executions reached", limit)
		e.RetryAfter = secondsUntil(now, midnight)
		return e
	}
	if err != nil {
		return internal(err)
	}
	h.Set("X-Quota-Remaining", strconv.FormatInt(max(0, limit-used), 10))

	// The run does not stop when the client hangs up: the quota is spent,
	// and the result is stored so that GET or an idempotent retry gets it.
	timeout := time.Duration(req.timeoutS * float64(time.Second))
	runCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout+runMargin)
	defer cancel()
	spec := engine.Spec{
		ID:       newExecutionID(),
		Language: req.lang,
		Code:     req.code,
		Stdin:    req.stdin,
		Timeout:  timeout,
		Limits:   engine.Limits{MemoryBytes: c.Plan.MemoryBytes()},
	}
	info.executionID = spec.ID
	res, runErr := s.engine.Execute(runCtx, spec)
	release()
	if runErr == nil && res.Status == engine.StatusError {
		runErr = errors.New("driver reported a platform error")
	}
	if runErr != nil {
		s.metrics.observeExecution(req.lang.Name, string(engine.StatusError), 0)
		if err := s.store.RefundExecution(runCtx, c.Key.Tenant, day); err != nil {
			s.log.Error("refunding quota", "request_id", info.id, "error", err)
		}
		return &Error{Kind: KindSandboxError, Msg: "the sandbox failed to run the code; it was not counted against your quota", Err: fmt.Errorf("running %s: %w", spec.ID, runErr)}
	}
	s.metrics.observeExecution(req.lang.Name, string(res.Status), res.Duration)

	exe := store.Execution{
		ID:              spec.ID,
		Tenant:          c.Key.Tenant,
		KeyID:           c.Key.ID,
		RequestID:       info.id,
		Language:        req.lang.Name,
		Status:          string(res.Status),
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		ExitCode:        res.ExitCode,
		DurationMS:      res.Duration.Milliseconds(),
		Truncated:       res.Truncated,
		SandboxSeconds:  res.Usage.SandboxSeconds,
		CPUSeconds:      res.Usage.CPUSeconds,
		PeakMemoryBytes: res.Usage.PeakMemoryBytes,
		CreatedAt:       now,
	}
	if err := s.store.SaveExecution(runCtx, exe); err != nil {
		// The code ran and the client should see its result. The claim
		// stays open (a retry waits, then gets 409) rather than being
		// released, because releasing it would let the code run twice.
		completed = true
		s.log.Error("saving execution", "request_id", info.id, "execution_id", exe.ID, "error", err)
	} else if idemKey != "" {
		if err := s.store.CompleteIdempotency(runCtx, c.Key.Tenant, idemKey, exe.ID); err != nil {
			s.log.Error("completing idempotency key", "request_id", info.id, "error", err)
		}
		completed = true
	}
	return s.writeJSON(w, r, http.StatusOK, toResponse(exe, info.id))
}

func (s *Server) getExecution(w http.ResponseWriter, r *http.Request, c *Caller) error {
	id := r.PathValue("id")
	if !executionIDPattern.MatchString(id) {
		return errorf(KindNotFound, "execution not found")
	}
	e, err := s.store.Execution(r.Context(), c.Key.Tenant, id)
	if errors.Is(err, store.ErrNotFound) {
		return errorf(KindNotFound, "execution not found")
	}
	if err != nil {
		return internal(err)
	}
	info := infoFrom(r.Context())
	info.executionID = e.ID
	return s.writeJSON(w, r, http.StatusOK, toResponse(e, info.id))
}

// maxBodyBytes leaves room for the worst JSON escaping of the largest code
// and stdin (a control character such as \u0001 takes six bytes for one),
// so a request within the documented limits is never refused for its
// encoding. Only authenticated callers get this far.
func (s *Server) maxBodyBytes() int64 {
	return int64(6*(s.opts.MaxCodeBytes+s.opts.MaxStdinBytes)) + 64<<10
}

// executionFields are the body's fields, spelled exactly so.
var executionFields = []string{"language", "code", "timeout_s", "stdin"}

// decodeExecution reads and checks the body. Every problem is named, so a
// client (or an agent) can fix its request without guessing.
func (s *Server) decodeExecution(w http.ResponseWriter, r *http.Request, c *Caller) (runRequest, error) {
	if err := checkJSONContentType(r); err != nil {
		return runRequest{}, err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBodyBytes()))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return runRequest{}, errorf(KindPayloadTooLarge, "request body is over %d bytes", tooLarge.Limit)
	}
	if err != nil {
		return runRequest{}, errorf(KindInvalidRequest, "could not read the request body")
	}
	// encoding/json would turn invalid bytes into U+FFFD, silently
	// changing the program.
	if i := invalidUTF8At(body); i >= 0 {
		return runRequest{}, errorf(KindInvalidJSON, "request body is not valid UTF-8 (at byte %d)", i)
	}
	// The same for an escaped surrogate without its pair ("\udc00"):
	// it has no UTF-8 form, so encoding/json would put U+FFFD in its place.
	if i := LoneSurrogateAt(body); i >= 0 {
		return runRequest{}, errorf(KindInvalidJSON, "request body has a lone surrogate escape (at byte %d); a string must be valid Unicode", i)
	}
	var in executionRequest
	if err := decodeStrict(body, &in); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field == "timeout_s" && strings.HasPrefix(typ.Value, "number") {
			// A number too large for a float64.
			return runRequest{}, errorf(KindInvalidTimeout, "timeout_s must be between 1 and %d seconds on plan %s", c.Plan.MaxTimeoutS, c.Key.Plan)
		}
		return runRequest{}, err
	}
	if err := checkFieldNames(body, executionFields); err != nil {
		return runRequest{}, err
	}

	var req runRequest
	switch {
	case in.Language == nil:
		return req, errorf(KindInvalidRequest, "language is required (one of %s)", s.langs.names())
	case in.Code == nil:
		return req, errorf(KindInvalidRequest, "code is required")
	}
	lang, ok := s.langs.lookup(*in.Language)
	if !ok {
		return req, errorf(KindUnsupportedLanguage, "language %q is not supported; use one of %s (see /v1/languages)", clip(*in.Language, 40), s.langs.names())
	}
	req.lang, req.code = lang, *in.Code
	if req.code == "" {
		return req, errorf(KindInvalidRequest, "code must not be empty")
	}
	if len(req.code) > s.opts.MaxCodeBytes {
		return req, errorf(KindPayloadTooLarge, "code is %d bytes; the limit is %d bytes", len(req.code), s.opts.MaxCodeBytes)
	}
	if in.Stdin != nil {
		req.stdin = *in.Stdin
	}
	if len(req.stdin) > s.opts.MaxStdinBytes {
		return req, errorf(KindPayloadTooLarge, "stdin is %d bytes; the limit is %d bytes", len(req.stdin), s.opts.MaxStdinBytes)
	}
	maxT := c.Plan.MaxTimeoutS
	req.timeoutS = c.Plan.DefaultTimeout()
	if in.TimeoutS != nil {
		t := *in.TimeoutS
		if math.IsNaN(t) || t < 1 || t > float64(maxT) {
			return req, errorf(KindInvalidTimeout, "timeout_s must be between 1 and %d seconds on plan %s", maxT, c.Key.Plan)
		}
		req.timeoutS = t
	}
	canon, _ := json.Marshal(struct {
		Language string  `json:"language"`
		Code     string  `json:"code"`
		Stdin    string  `json:"stdin"`
		TimeoutS float64 `json:"timeout_s"`
	}{lang.Name, req.code, req.stdin, req.timeoutS})
	sum := sha256.Sum256(canon)
	req.hash = hex.EncodeToString(sum[:])
	return req, nil
}

func checkJSONContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return errorf(KindInvalidContentType, "Content-Type must be application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return errorf(KindInvalidContentType, "Content-Type must be application/json, not %q", clip(ct, 60))
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return errorf(KindInvalidContentType, "the body must be UTF-8 JSON")
	}
	return nil
}

// decodeStrict decodes exactly one JSON object into v, refusing unknown
// fields and trailing data.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errorf(KindInvalidJSON, "request body is empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
	case errors.As(err, &syntax):
		return errorf(KindInvalidJSON, "request body is not valid JSON (at byte %d)", syntax.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorf(KindInvalidJSON, "request body is not valid JSON (it ends too early)")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return errorf(KindInvalidRequest, "request body must be a JSON object")
		}
		return &Error{Kind: KindInvalidRequest, Msg: fmt.Sprintf("field %s must be %s, not %s", typ.Field, jsonTypeName(typ.Type.String()), typ.Value), Err: err}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errorf(KindInvalidRequest, "unknown field %s; allowed: language, code, timeout_s, stdin", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return errorf(KindInvalidJSON, "request body is not valid JSON")
	}
	if err := dec.Decode(&json.RawMessage{}); err != io.EOF {
		return errorf(KindInvalidJSON, "request body has data after the JSON object")
	}
	return nil
}

// checkFieldNames refuses what encoding/json lets through in a valid
// object: a field named in another case ("Language") and a field given
// twice, of which it silently keeps the last. A proxy or log that reads
// the first "code" must not see another program than the one that runs.
func checkFieldNames(body []byte, allowed []string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: decodeStrict has said so
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errorf(KindInvalidJSON, "request body is not valid JSON")
		}
		name, _ := t.(string)
		switch {
		case !slices.Contains(allowed, name):
			return errorf(KindInvalidRequest, "unknown field %q; allowed: %s (lower case)", clip(name, 40), strings.Join(allowed, ", "))
		case seen[name]:
			return errorf(KindInvalidRequest, "field %s is given more than once", name)
		}
		seen[name] = true
		if err := dec.Decode(&json.RawMessage{}); err != nil {
			return errorf(KindInvalidJSON, "request body is not valid JSON")
		}
	}
	return nil
}

// invalidUTF8At returns the offset of the first byte that is not valid
// UTF-8, or -1.
func invalidUTF8At(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return -1
}

// LoneSurrogateAt returns the offset of the first \u escape in a JSON
// string of b that is a UTF-16 surrogate without its pair (a high one not
// followed by a low one, or a low one alone), or -1. b need not be valid
// JSON; the decoder reports that.
func LoneSurrogateAt(b []byte) int {
	if !bytes.Contains(b, []byte(`\u`)) {
		return -1
	}
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c != '\\':
		case i+1 < len(b) && b[i+1] != 'u':
			i++ // a one-character escape such as \\ or \"
		default:
			r, ok := hex4(b, i+2)
			if !ok {
				i++
				continue
			}
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return i
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := hex4(b, i+8)
				if !ok || i+7 >= len(b) || b[i+6] != '\\' || b[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
					return i
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return -1
}

// hex4 decodes the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func jsonTypeName(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string":
		return "a string"
	case "float64", "int", "int64":
		return "a number"
	case "bool":
		return "a boolean"
	}
	return "of another type"
}

// clip shortens client input echoed in a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
