package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"mime"
	"net/http"
	"net/url"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// CodeContext is an interpreter in a sandbox that keeps its state
// (variables, imports, open files) from one cell to the next. Default
// marks a language's default context, which RunCode uses when it names
// none.
type CodeContext struct {
	ID        string
	Language  string // python or javascript
	Cwd       string
	Default   bool
	CreatedAt time.Time
}

func toContext(w wire.Context) *CodeContext {
	return &CodeContext{ID: w.ID, Language: w.Language, Cwd: w.Cwd, Default: w.Default, CreatedAt: w.CreatedAt}
}

// Contexts manages the code contexts of one sandbox; safe for concurrent
// use.
type Contexts struct {
	c  *Client
	id string
}

func contextPath(id, cid, rest string) string {
	return sandboxPath(id, "/contexts/"+url.PathEscape(cid)+rest)
}

// Create starts a context for language (python or javascript; "" is
// python) with its working directory in cwd ("" is /home/user).
func (cs *Contexts) Create(ctx context.Context, language, cwd string) (*CodeContext, error) {
	body, err := json.Marshal(wire.ContextRequest{Language: nonEmpty(language), Cwd: nonEmpty(cwd)})
	if err != nil {
		return nil, err
	}
	var w wire.Context
	if _, err := cs.c.do(ctx, call{method: http.MethodPost, path: sandboxPath(cs.id, "/contexts"), body: body, retry: retryRateLimitOnly, decodes: &w}); err != nil {
		return nil, err
	}
	return toContext(w), nil
}

// List returns the sandbox's contexts, oldest first.
func (cs *Contexts) List(ctx context.Context) ([]CodeContext, error) {
	var w wire.ContextList
	if _, err := cs.c.do(ctx, call{method: http.MethodGet, path: sandboxPath(cs.id, "/contexts"), retry: retryAlways, decodes: &w}); err != nil {
		return nil, err
	}
	out := make([]CodeContext, 0, len(w.Contexts))
	for _, x := range w.Contexts {
		out = append(out, *toContext(x))
	}
	return out, nil
}

// Delete ends a context and its state.
func (cs *Contexts) Delete(ctx context.Context, id string) error {
	_, err := cs.c.do(ctx, call{method: http.MethodDelete, path: contextPath(cs.id, id, ""), retry: retryAlways, decodes: &wire.Ack{}})
	return err
}

// Restart starts a context's interpreter afresh, without its state.
func (cs *Contexts) Restart(ctx context.Context, id string) (*CodeContext, error) {
	var w wire.Context
	if _, err := cs.c.do(ctx, call{method: http.MethodPost, path: contextPath(cs.id, id, "/restart"), retry: retryRateLimitOnly, decodes: &w}); err != nil {
		return nil, err
	}
	return toContext(w), nil
}

// CodeOption configures RunCode and StreamCode.
type CodeOption func(*wire.RunCodeRequest)

// InContext runs the cell in the context id (from Contexts.Create, or a
// CodeResult's ContextID).
func InContext(id string) CodeOption {
	return func(r *wire.RunCodeRequest) { r.ContextID = nonEmpty(id) }
}

// WithCodeLanguage runs the cell in language's default context (python
// unless given).
func WithCodeLanguage(language string) CodeOption {
	return func(r *wire.RunCodeRequest) { r.Language = nonEmpty(language) }
}

// WithCodeEnv sets environment variables for this cell only.
func WithCodeEnv(env map[string]string) CodeOption {
	return func(r *wire.RunCodeRequest) { r.Env = env }
}

// WithCodeTimeout bounds the cell: at most the plan's max_timeout_s (more
// is refused with invalid_timeout), and 60 s or that maximum if lower when
// not given. Past it the cell is interrupted and the context stays. Whole
// seconds.
func WithCodeTimeout(d time.Duration) CodeOption {
	return func(r *wire.RunCodeRequest) { r.TimeoutS = wholeSeconds(d) }
}

// CodeOutput is one result of a cell, a MIME bundle: Data["text/plain"]
// always, and text/html, image/png (base64) and others when the value
// offers them. Main marks the value of the cell's last expression; the
// others are figures it displayed. The content is the cell's: untrusted.
type CodeOutput = wire.CodeOutput

// CodeError is what a cell raised or threw: Name is the exception's class,
// or ContextRestarted / ContextDied when the interpreter was lost with its
// state.
type CodeError = wire.CodeError

// CodeResult is a cell's outcome. A cell that raises or times out is a
// result (check Status and Error), not an error.
type CodeResult struct {
	ContextID      string       `json:"context_id"`
	Status         Status       `json:"status"` // succeeded, failed, timed_out
	Stdout         string       `json:"stdout"`
	Stderr         string       `json:"stderr"`
	Results        []CodeOutput `json:"results"`
	Error          *CodeError   `json:"error"`
	ExecutionCount int          `json:"execution_count"`
	DurationMS     int64        `json:"duration_ms"`
	Truncated      bool         `json:"truncated"`
	CPUSeconds     float64      `json:"cpu_seconds"`
	RequestID      string       `json:"request_id"`
}

// Text is the text/plain of the cell's main result (its last
// expression's value), or "" when it had none.
func (r *CodeResult) Text() string {
	for _, o := range r.Results {
		if o.Main {
			return o.Data["text/plain"]
		}
	}
	return ""
}

func toCodeResult(w wire.RunCodeResult) *CodeResult {
	return &CodeResult{ContextID: w.ContextID, Status: Status(w.Status), Stdout: w.Stdout, Stderr: w.Stderr, Results: w.Results,
		Error: w.Error, ExecutionCount: w.ExecutionCount, DurationMS: w.DurationMS, Truncated: w.Truncated,
		CPUSeconds: w.Usage.CPUSeconds, RequestID: w.RequestID}
}

func (sb *Sandbox) codeCall(code string, opts []CodeOption) (call, error) {
	req := wire.RunCodeRequest{Code: &code}
	for _, o := range opts {
		o(&req)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return call{}, fmt.Errorf("vertal: encoding request: %w", err)
	}
	// It runs something: only a refusal before it ran (429) is retried.
	return call{method: http.MethodPost, path: sandboxPath(sb.ID, "/run"), body: body, retry: retryRateLimitOnly}, nil
}

// RunCode runs one cell of code in a code context of the sandbox (the
// python default context unless an option says otherwise) and waits for
// it. State persists between cells of a context.
func (sb *Sandbox) RunCode(ctx context.Context, code string, opts ...CodeOption) (*CodeResult, error) {
	cl, err := sb.codeCall(code, opts)
	if err != nil {
		return nil, err
	}
	w, err := doDecode[wire.RunCodeResult](ctx, sb.c, cl)
	if err != nil {
		return nil, err
	}
	return toCodeResult(w), nil
}

// EventEnd is a cell stream's last event: it carries the whole outcome.
const EventEnd EventType = "end"

// CodeEvent is one event of a cell's stream: EventStdout and EventStderr
// carry Text, EventResult a Result, EventError the cell's CodeError (or,
// with Error set, the platform's failure, which ends the stream), and
// EventEnd the outcome in End.
type CodeEvent struct {
	Type      EventType
	Text      string
	Result    *CodeOutput
	CodeError *CodeError
	End       *CodeResult
	Error     *Error
}

// StreamCode runs a cell like RunCode and yields its events as they come,
// then EventEnd. A refusal before it ran is yielded as an *Error. The
// cell is not run again if the connection drops.
func (sb *Sandbox) StreamCode(ctx context.Context, code string, opts ...CodeOption) iter.Seq2[CodeEvent, error] {
	return func(yield func(CodeEvent, error) bool) {
		cl, err := sb.codeCall(code, opts)
		if err != nil {
			yield(CodeEvent{}, err)
			return
		}
		cl.accept = eventStreamType
		resp, err := sb.c.open(ctx, cl)
		if err != nil {
			yield(CodeEvent{}, err)
			return
		}
		if err := readCodeEvents(resp, yield); err != nil {
			yield(CodeEvent{}, err)
		}
	}
}

func readCodeEvents(resp *http.Response, yield func(CodeEvent, error) bool) error {
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != eventStreamType {
		return fmt.Errorf("vertal: event stream answered with Content-Type %q", resp.Header.Get("Content-Type"))
	}
	r := newSSEReader(resp.Body, maxResponseBytes, "")
	for {
		sev, err := r.next()
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return fmt.Errorf("vertal: reading event stream: %w", err)
		}
		ev := CodeEvent{Type: EventType(sev.event)}
		data := []byte(sev.data)
		switch ev.Type {
		case EventStdout, EventStderr:
			var d wire.OutputEvent
			err = json.Unmarshal(data, &d)
			ev.Text = d.Text
		case EventResult:
			ev.Result = &CodeOutput{}
			err = json.Unmarshal(data, ev.Result)
		case EventEnd:
			var d wire.RunCodeResult
			err = json.Unmarshal(data, &d)
			ev.End = toCodeResult(d)
		case EventError:
			if sev.id == "end" { // the platform failed; the stream ends
				var d wire.Error
				if err := json.Unmarshal(data, &d); err != nil {
					return fmt.Errorf("vertal: decoding %s event: %w", sev.event, err)
				}
				ev.Error = &Error{Code: d.Error.Code, Message: d.Error.Message, RequestID: cmp.Or(d.RequestID, resp.Header.Get("X-Request-ID"))}
				yield(ev, ev.Error)
				return nil
			}
			ev.CodeError = &CodeError{}
			err = json.Unmarshal(data, ev.CodeError)
		default:
			continue // an event this version does not know
		}
		if err != nil {
			return fmt.Errorf("vertal: decoding %s event: %w", sev.event, err)
		}
		if !yield(ev, nil) || ev.Type == EventEnd {
			return nil
		}
	}
}
