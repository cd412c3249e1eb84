package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// The code interpreter's half of the E2B data plane (what
// @e2b/code-interpreter calls on port 49999): POST /execute, answered as
// NDJSON, and /contexts. It rides on the sandbox's code contexts
// (docs/SANDBOXES.md): a context is one interpreter that keeps state.

// e2bExecuteBody is POST /execute.
type e2bExecuteBody struct {
	Code      *string           `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// e2bLanguage is our language for one the code interpreter names.
func e2bLanguage(l string) (string, error) {
	switch strings.ToLower(l) {
	case "", "python", "python3":
		return "python", nil
	case "js", "javascript", "node", "nodejs":
		return "javascript", nil
	}
	return "", errorf(KindUnsupportedLanguage, "language %q is not available in Vertal Run's code interpreter: use python or js", clip(l, 40))
}

// e2bMIME names a MIME type as the code interpreter's result does.
var e2bMIME = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
}

// e2bResultLine is one result as an NDJSON line's fields.
func e2bResultLine(o sandboxes.CodeOutput) map[string]any {
	line := map[string]any{"type": "result", "is_main_result": o.Main}
	for mt, v := range o.Data {
		name, ok := e2bMIME[mt]
		if !ok {
			continue
		}
		if name == "json" {
			var obj any
			if json.Unmarshal([]byte(v), &obj) == nil {
				line[name] = obj
				continue
			}
		}
		line[name] = v
	}
	return line
}

// e2bExecute runs a cell and streams its events as E2B's NDJSON: stdout
// and stderr lines, results, an error, the execution count, then
// end_of_execution. A failure before the first line is an ordinary error
// answer; after it, an error line named as the failure.
func (s *Server) e2bExecute(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var (
		mu      sync.Mutex // lines come from the cell's events and the keepalive
		started bool
		rc      = http.NewResponseController(w)
	)
	line := func(v any) {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if enc.Encode(v) == nil {
			_, _ = w.Write(buf.Bytes())
			_ = rc.Flush()
		}
	}
	err := s.e2bRunCell(w, r, c, id, line)
	if err == nil {
		return nil
	}
	e := asError(err)
	if !started && (e.Kind == KindNotFound || e2bDataStatus(e) >= 500) {
		return err // the SDK shows a 404's or a 502's message
	}
	// Any other refusal is an error line, named by its code: the SDK shows
	// only the status of a 400 or a 429, never its message. A cell cut
	// short after its first line ends the same way.
	name := "UnexpectedEndOfExecution"
	if !started {
		name = kindCode(e.Kind)
	}
	info := infoFrom(r.Context())
	info.err, info.errCode = e, kindCode(e.Kind)
	line(map[string]any{"type": "error", "name": name, "value": e.Msg, "traceback": ""})
	return nil
}

// e2bRunCell decodes an /execute request and runs it, sending each line
// through line.
func (s *Server) e2bRunCell(w http.ResponseWriter, r *http.Request, c *Caller, id string, line func(any)) error {
	var in e2bExecuteBody
	if err := s.decodeBody(w, r, s.maxBodyBytes(c.Plan), &in); err != nil {
		return err
	}
	if in.Code == nil {
		return errorf(KindInvalidRequest, "code is required")
	}
	req := sandboxes.RunCodeRequest{Code: *in.Code, Env: in.EnvVars}
	if in.ContextID != nil && *in.ContextID != "" {
		if in.Language != nil && *in.Language != "" {
			return errorf(KindInvalidRequest, "give context_id or language, not both")
		}
		req.ContextID = *in.ContextID
	} else if in.Language != nil {
		lang, err := e2bLanguage(*in.Language)
		if err != nil {
			return err
		}
		req.Language = lang
	}
	// A keepalive line every 30 s of a long cell, as E2B's server sends,
	// keeps idle-stream timeouts from cutting it; the SDK skips them.
	stop := keepalive(30*time.Second, func() { line(map[string]any{"type": "keepalive"}) })
	res, err := s.sbx.RunCode(r.Context(), *c, id, req, func(ev sandboxes.CodeEvent) {
		switch {
		case ev.Result != nil:
			line(e2bResultLine(*ev.Result))
		case ev.Error != nil:
			line(map[string]any{"type": "error", "name": ev.Error.Name, "value": ev.Error.Value, "traceback": ev.Error.Traceback})
		case ev.Type == "stdout" || ev.Type == "stderr":
			line(map[string]any{"type": ev.Type, "text": ev.Data})
		}
	})
	stop()
	if err != nil {
		return err
	}
	if res.Truncated {
		line(map[string]any{"type": "stderr", "text": "[vertal: the cell's output was cut at the plan's cap per stream]\n"})
	}
	if res.Status == "timed_out" {
		// The SDK keeps the last error: this one says why, where the
		// interpreter said only KeyboardInterrupt.
		line(map[string]any{"type": "error", "name": "TimeoutError", "traceback": "",
			"value": fmt.Sprintf("the cell ran past its timeout (at most the plan's max_timeout_s, %d s) and was interrupted; the context keeps its state", c.Plan.MaxTimeoutS)})
	}
	line(map[string]any{"type": "number_of_executions", "execution_count": res.ExecutionCount})
	line(map[string]any{"type": "end_of_execution"})
	return nil
}

// e2bContext is a context as the code interpreter shows it.
type e2bContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func toE2BContext(cc sandboxes.CodeContext) e2bContext {
	return e2bContext{ID: cc.ID, Language: cc.Language, Cwd: cc.Cwd}
}

func (s *Server) e2bCreateContext(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in struct {
		Language *string `json:"language"`
		Cwd      *string `json:"cwd"`
	}
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, smallBodyBytes, &in); err != nil {
			return err
		}
	}
	var req sandboxes.ContextRequest
	if in.Language != nil {
		lang, err := e2bLanguage(*in.Language)
		if err != nil {
			return err
		}
		req.Language = lang
	}
	if in.Cwd != nil {
		req.Cwd = *in.Cwd
	}
	cc, err := s.sbx.CreateContext(r.Context(), *c, id, req)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toE2BContext(cc))
}

func (s *Server) e2bListContexts(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	list, err := s.sbx.Contexts(r.Context(), *c, id)
	if err != nil {
		return err
	}
	out := make([]e2bContext, 0, len(list))
	for _, cc := range list {
		out = append(out, toE2BContext(cc))
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

func (s *Server) e2bDeleteContext(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	cid, err := pathContext(r)
	if err != nil {
		return err
	}
	if err := s.sbx.DeleteContext(r.Context(), *c, id, cid); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) e2bRestartContext(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	cid, err := pathContext(r)
	if err != nil {
		return err
	}
	if _, err := s.sbx.RestartContext(r.Context(), *c, id, cid); err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, nil)
}
