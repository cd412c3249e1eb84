package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
)

// Code contexts of a sandbox (sandboxes/contexts.go): interpreters that
// keep their state across cells, and POST …/run, which runs one cell.

// pathContext is the {cid} of a route; a malformed one is not found.
func pathContext(r *http.Request) (string, error) {
	cid := r.PathValue("cid")
	if !sandboxes.ValidContextID(cid) {
		return "", errorf(KindNotFound, "no code context %q", clip(cid, 80))
	}
	return cid, nil
}

func toWireContext(c sandboxes.CodeContext) wire.Context {
	return wire.Context{ID: c.ID, Language: c.Language, Cwd: c.Cwd, Default: c.Default, CreatedAt: c.CreatedAt.UTC().Truncate(time.Millisecond)}
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in wire.ContextRequest
	if err := s.decodeBody(w, r, smallBodyBytes, &in); err != nil {
		return err
	}
	var req sandboxes.ContextRequest
	if in.Language != nil {
		req.Language = *in.Language
	}
	if in.Cwd != nil {
		req.Cwd = *in.Cwd
	}
	cc, err := s.sbx.CreateContext(r.Context(), *c, id, req)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusCreated, toWireContext(cc))
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	list, err := s.sbx.Contexts(r.Context(), *c, id)
	if err != nil {
		return err
	}
	out := wire.ContextList{Contexts: make([]wire.Context, 0, len(list))}
	for _, cc := range list {
		out.Contexts = append(out.Contexts, toWireContext(cc))
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	cid, err := pathContext(r)
	if err != nil {
		return err
	}
	if err := s.sbx.DeleteContext(r.Context(), *c, id, cid); err != nil {
		return err
	}
	return s.ack(w, r)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	cid, err := pathContext(r)
	if err != nil {
		return err
	}
	if err := s.noBody(w, r); err != nil {
		return err
	}
	cc, err := s.sbx.RestartContext(r.Context(), *c, id, cid)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toWireContext(cc))
}

// runCode is POST …/run: the cell's outcome as JSON, or with Accept:
// text/event-stream its events as they come (stdout, stderr, result,
// error) and then an end event with the outcome.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var in wire.RunCodeRequest
	if err := s.decodeBody(w, r, s.maxBodyBytes(c.Plan), &in); err != nil {
		return err
	}
	if in.Code == nil {
		return errorf(KindInvalidRequest, "code is required")
	}
	req := sandboxes.RunCodeRequest{Code: *in.Code, Env: in.Env}
	if in.ContextID != nil {
		req.ContextID = *in.ContextID
	}
	if in.Language != nil {
		req.Language = *in.Language
	}
	var err error
	if req.TimeoutS, err = seconds(in.TimeoutS); err != nil {
		return err
	}
	if wantsEventStream(r) {
		return s.streamEvents(w, r, func(ctx context.Context, emit func(streamEvent) error) error {
			n := 0
			res, err := s.sbx.RunCode(ctx, *c, id, req, func(ev sandboxes.CodeEvent) {
				n++
				_ = emit(toCodeSSE(ev, n))
			})
			if err != nil {
				return err
			}
			return emit(streamEvent{id: "end", kind: "end", data: toWireRunCode(res, infoFrom(ctx).id)})
		})
	}
	res, err := s.sbx.RunCode(r.Context(), *c, id, req, nil)
	if err != nil {
		return err
	}
	return s.writeJSON(w, r, http.StatusOK, toWireRunCode(res, infoFrom(r.Context()).id))
}

func toCodeSSE(ev sandboxes.CodeEvent, n int) streamEvent {
	out := streamEvent{id: strconv.Itoa(n), kind: ev.Type}
	switch {
	case ev.Result != nil:
		out.data = toWireOutput(*ev.Result)
	case ev.Error != nil:
		out.data = toWireCodeError(ev.Error)
	default:
		out.data = wire.OutputEvent{Text: ev.Data}
	}
	return out
}

func toWireOutput(o sandboxes.CodeOutput) wire.CodeOutput {
	data := o.Data
	if data == nil {
		data = map[string]string{}
	}
	return wire.CodeOutput{Main: o.Main, Data: data}
}

func toWireCodeError(e *sandboxes.CodeError) *wire.CodeError {
	if e == nil {
		return nil
	}
	return &wire.CodeError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
}

func toWireRunCode(res sandboxes.CodeResult, requestID string) wire.RunCodeResult {
	out := wire.RunCodeResult{ContextID: res.ContextID, Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr,
		Results: make([]wire.CodeOutput, 0, len(res.Results)), Error: toWireCodeError(res.Error), ExecutionCount: res.ExecutionCount,
		DurationMS: res.DurationMS, Truncated: res.Truncated, Usage: wire.CommandUsage{CPUSeconds: round3(res.CPUSeconds)}, RequestID: requestID}
	for _, o := range res.Results {
		out.Results = append(out.Results, toWireOutput(o))
	}
	return out
}
