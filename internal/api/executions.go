package api

import (
	"bytes"
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

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// executionRequest is the body of POST /v1/executions. Pointers tell a
// missing field from a zero one.
type executionRequest struct {
	Image       *string           `json:"image"`
	Language    *string           `json:"language"`
	Code        *string           `json:"code"`
	TimeoutS    *float64          `json:"timeout_s"`
	Stdin       *string           `json:"stdin"`
	Files       []fileRequest     `json:"files"`
	Env         map[string]string `json:"env"`
	Args        []string          `json:"args"`
	ReturnFiles []string          `json:"return_files"`
	Async       *bool             `json:"async"`
	WebhookURL  *string           `json:"webhook_url"`
}

// fileRequest is one file of a request; the service checks path and
// encoding and decodes the content.
type fileRequest struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
}

// fileResponse is one returned file; content is always base64.
type fileResponse struct {
	Path     string `json:"path"`
	Size     int    `json:"size"`
	Encoding string `json:"encoding"`
	Content  []byte `json:"content"`
}

type usageJSON struct {
	SandboxSeconds  float64 `json:"sandbox_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
}

// executionResponse is one execution on the wire, for POST (run or
// replay), GET and cancel alike; GET may show it queued or running.
type executionResponse struct {
	ID               string         `json:"id"`
	Status           string         `json:"status"`
	Stdout           string         `json:"stdout"`
	Stderr           string         `json:"stderr"`
	ExitCode         int            `json:"exit_code"`
	DurationMS       int64          `json:"duration_ms"`
	Truncated        bool           `json:"truncated"`
	Usage            usageJSON      `json:"usage"`
	Language         string         `json:"language"`
	Image            *string        `json:"image"`
	ImageVersion     *string        `json:"image_version"`
	CreatedAt        int64          `json:"created_at"`
	StartedAt        *int64         `json:"started_at"`
	FinishedAt       *int64         `json:"finished_at"`
	Files            []fileResponse `json:"files"`
	FilesTruncated   bool           `json:"files_truncated"`
	Webhook          *webhookJSON   `json:"webhook"`
	Reason           *string        `json:"reason"`
	IdempotentReplay bool           `json:"idempotent_replay,omitempty"`
	OutputPurged     bool           `json:"output_purged,omitempty"`
	RequestID        string         `json:"request_id"`
}

// webhookJSON is an execution's webhook and its delivery state.
type webhookJSON struct {
	URL        string  `json:"url"`
	State      string  `json:"state"`
	Attempts   int     `json:"attempts"`
	LastStatus *int    `json:"last_status"`
	LastError  *string `json:"last_error"`
}

func toResponse(e store.Execution, requestID string) executionResponse {
	var hook *webhookJSON
	if w := e.Webhook; w != nil {
		hook = &webhookJSON{URL: w.URL, State: w.State, Attempts: w.Attempts}
		if w.LastStatus != 0 {
			hook.LastStatus = &w.LastStatus
		}
		if w.LastError != "" {
			hook.LastError = &w.LastError
		}
	}
	files := make([]fileResponse, 0, len(e.Files)) // [] when none, never null
	for _, f := range e.Files {
		files = append(files, fileResponse{Path: f.Path, Size: len(f.Content), Encoding: "base64", Content: f.Content})
	}
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

// executionFields are the body's fields, spelled exactly so.
var executionFields = []string{"image", "language", "code", "timeout_s", "stdin", "files", "env", "args", "return_files", "async", "webhook_url"}

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
	return decodeExecutionBody(body, c)
}

// readJSONBody reads a request's JSON body, at most limit bytes and at
// most decoded bytes once its escapes are decoded, within the server's body
// budget, and refuses what encoding/json would silently change. Call
// release once the body is decoded, also after an error.
func (s *Server) readJSONBody(w http.ResponseWriter, r *http.Request, limit, decoded int64) (body []byte, release func(), err error) {
	release = func() {}
	if err := checkJSONContentType(r); err != nil {
		return nil, release, err
	}
	body, release, err = s.readBody(w, r, limit)
	if err != nil {
		return nil, release, err
	}
	if n := decodedSize(body); n > decoded {
		return nil, release, errorf(KindPayloadTooLarge, "request body holds %d bytes once its escapes are decoded; the plan's caps allow %d", n, decoded)
	}
	body, err = checkJSONText(body)
	return body, release, err
}

// checkJSONText refuses what encoding/json would silently change.
func checkJSONText(body []byte) ([]byte, error) {
	// encoding/json would turn invalid bytes into U+FFFD, silently
	// changing the program.
	if i := invalidUTF8At(body); i >= 0 {
		return nil, errorf(KindInvalidJSON, "request body is not valid UTF-8 (at byte %d)", i)
	}
	// The same for an escaped surrogate without its pair ("\udc00"):
	// it has no UTF-8 form, so encoding/json would put U+FFFD in its place.
	if i := LoneSurrogateAt(body); i >= 0 {
		return nil, errorf(KindInvalidJSON, "request body has a lone surrogate escape (at byte %d); a string must be valid Unicode", i)
	}
	return body, nil
}

// decodeExecutionBody decodes one execution request strictly; the
// service checks the values. It also reports "async": true.
func decodeExecutionBody(body []byte, c *Caller) (execution.Input, bool, error) {
	var in executionRequest
	if err := decodeStrict(body, &in); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field == "timeout_s" && strings.HasPrefix(typ.Value, "number") {
			// A number too large for a float64.
			return execution.Input{}, false, execution.InvalidTimeout(*c)
		}
		return execution.Input{}, false, err
	}
	if err := checkFieldNames(body, executionFields); err != nil {
		return execution.Input{}, false, err
	}
	files := make([]execution.InputFile, len(in.Files))
	for i, f := range in.Files {
		files[i] = execution.InputFile{Path: f.Path, Content: f.Content, Encoding: f.Encoding}
	}
	return execution.Input{Image: in.Image, Language: in.Language, Code: in.Code, TimeoutS: in.TimeoutS, Stdin: in.Stdin,
		Files: files, Env: in.Env, Args: in.Args, ReturnFiles: in.ReturnFiles, WebhookURL: in.WebhookURL}, in.Async != nil && *in.Async, nil
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
		return errorf(KindInvalidRequest, "unknown field %s; allowed: %s (and path, content, encoding in a file)",
			strings.TrimPrefix(err.Error(), "json: unknown field "), strings.Join(executionFields, ", "))
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
// The objects inside "files" are held to the same rule.
func checkFieldNames(body []byte, allowed []string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	t, err := dec.Token()
	if err != nil {
		return nil // not JSON: decodeStrict says so
	}
	if t != json.Delim('{') {
		// decodeStrict refuses every other shape but null, which
		// encoding/json decodes into a struct as nothing at all.
		return errorf(KindInvalidRequest, "request body must be a JSON object")
	}
	return checkObjectFields(dec, "", allowed, func(name string) error {
		if name != "files" {
			return skipValue(dec)
		}
		return checkFilesFields(dec)
	})
}

// fileFields are the fields of one files entry, spelled exactly so.
var fileFields = []string{"path", "content", "encoding"}

// checkObjectFields reads the fields of the object whose '{' dec has just
// returned, up to its '}', refusing names outside allowed and names given
// twice; value reads each field's value. where prefixes the messages
// ("files[2]: ").
func checkObjectFields(dec *json.Decoder, where string, allowed []string, value func(name string) error) error {
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errorf(KindInvalidJSON, "request body is not valid JSON")
		}
		name, _ := t.(string)
		switch {
		case !slices.Contains(allowed, name):
			return errorf(KindInvalidRequest, "%sunknown field %q; allowed: %s (lower case)", where, clip(name, 40), strings.Join(allowed, ", "))
		case seen[name]:
			return errorf(KindInvalidRequest, "%sfield %s is given more than once", where, name)
		}
		seen[name] = true
		if err := value(name); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return errorf(KindInvalidJSON, "request body is not valid JSON")
	}
	return nil
}

// checkFilesFields checks the field names of every object in the files
// array that dec is about to read. Values of another shape are left to
// decodeStrict, which has already refused them.
func checkFilesFields(dec *json.Decoder) error {
	t, err := dec.Token()
	if err != nil {
		return errorf(KindInvalidJSON, "request body is not valid JSON")
	}
	if t != json.Delim('[') {
		return nil // null, or a wrong type decodeStrict named
	}
	for i := 0; dec.More(); i++ {
		t, err := dec.Token()
		if err != nil {
			return errorf(KindInvalidJSON, "request body is not valid JSON")
		}
		if t != json.Delim('{') {
			return nil
		}
		if err := checkObjectFields(dec, fmt.Sprintf("files[%d]: ", i), fileFields, func(string) error { return skipValue(dec) }); err != nil {
			return err
		}
	}
	_, err = dec.Token() // the closing ']'
	if err != nil {
		return errorf(KindInvalidJSON, "request body is not valid JSON")
	}
	return nil
}

// skipValue reads one JSON value and drops it.
func skipValue(dec *json.Decoder) error {
	if err := dec.Decode(&json.RawMessage{}); err != nil {
		return errorf(KindInvalidJSON, "request body is not valid JSON")
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
	case "map[string]string":
		return "an object of strings"
	}
	if strings.HasPrefix(goType, "[]") {
		return "an array"
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
