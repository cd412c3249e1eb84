package api

import (
	"bytes"
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// DefaultHeartbeat is how often an idle event stream gets a comment, so
// that proxies and clients can tell a quiet program from a dead link.
const DefaultHeartbeat = 15 * time.Second

// wantsEventStream reports whether the client asked for server-sent
// events (Accept: text/event-stream).
func wantsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// streamExecution is POST /v1/executions with Accept: text/event-stream.
// Refusals decided before the sandbox starts are the usual JSON errors;
// from the start on, the answer is a 200 event stream. A client that
// leaves does not stop the run: it was started with the request's
// context only for the wait in the queue, and is stored as usual.
func (s *Server) streamExecution(w http.ResponseWriter, r *http.Request, c *Caller, req execution.Request) error {
	ctx := r.Context()
	type attached struct {
		events <-chan execution.Event
		err    error
	}
	type ran struct {
		out execution.Outcome
		err error
	}
	started := make(chan attached, 1)
	done := make(chan ran, 1)
	go func() {
		req.Started = func(id string) {
			// Attached before the sandbox runs, so nothing is missed.
			events, err := s.exec.Attach(ctx, *c, id, execution.Position{})
			started <- attached{events, err}
		}
		out, err := s.exec.Run(ctx, *c, req)
		done <- ran{out, err}
	}()
	var a attached
	select {
	case a = <-started:
	case d := <-done:
		select {
		case a = <-started: // it started, then ended: its events are in the stream
		default:
			if d.err != nil {
				return d.err
			}
			// A replay, or canceled before it started: the stored execution.
			st := s.startStream(w, r)
			for _, ev := range execution.StoredEvents(d.out.Execution, d.out.Replay) {
				if err := st.event(ev); err != nil {
					return err
				}
			}
			return nil
		}
	}
	if a.err != nil {
		return a.err
	}
	return s.startStream(w, r).follow(ctx, a.events)
}

// executionEvents is GET /v1/executions/{id}/events: the event stream of
// a queued, running or finished execution, resumed after Last-Event-ID.
func (s *Server) executionEvents(w http.ResponseWriter, r *http.Request, c *Caller) error {
	ctx := r.Context()
	id := r.PathValue("id")
	events, err := s.exec.Attach(ctx, *c, id, execution.ParsePosition(r.Header.Get("Last-Event-ID")))
	if err != nil {
		return err
	}
	infoFrom(ctx).executionID = id
	return s.startStream(w, r).follow(ctx, events)
}

// eventStream writes server-sent events.
type eventStream struct {
	s  *Server
	w  http.ResponseWriter
	r  *http.Request
	rc *http.ResponseController
}

func (s *Server) startStream(w http.ResponseWriter, r *http.Request) *eventStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: pass events on as they come
	h.Del("Content-Length")
	st := &eventStream{s: s, w: w, r: r, rc: http.NewResponseController(w)}
	st.extend()
	w.WriteHeader(http.StatusOK)
	_ = st.rc.Flush()
	return st
}

// extend moves the write deadline on before each write: the server's
// WriteTimeout fits the longest run, but a stream attached to a queued
// execution, or resumed later, may outlast it while it is still making
// progress. A link that stops taking writes still times out.
func (st *eventStream) extend() {
	_ = st.rc.SetWriteDeadline(time.Now().Add(2*st.s.heartbeat + 30*time.Second))
}

func (st *eventStream) write(b []byte) error {
	st.extend()
	if _, err := st.w.Write(b); err != nil {
		return err
	}
	return st.rc.Flush()
}

// follow writes the events until the last one, with a heartbeat comment
// when nothing else was sent for a while. It returns when the client
// leaves; the execution goes on.
func (st *eventStream) follow(ctx context.Context, events <-chan execution.Event) error {
	t := time.NewTicker(st.s.heartbeat)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return ctx.Err() // nil after the last event
			}
			if err := st.event(ev); err != nil {
				return err
			}
			t.Reset(st.s.heartbeat)
		case <-t.C:
			if err := st.write([]byte(": heartbeat\n\n")); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// event writes one event of an execution.
func (st *eventStream) event(ev execution.Event) error {
	info := infoFrom(st.r.Context())
	var data any
	switch ev.Kind {
	case execution.EventStarted:
		data = wire.StartedEvent{ID: ev.Execution.ID, Language: ev.Execution.Language}
	case execution.EventStdout, execution.EventStderr:
		data = wire.OutputEvent{Text: ev.Text}
	case execution.EventResult:
		resp := toResponse(ev.Execution, info.id)
		resp.IdempotentReplay = ev.Replay
		data = resp
	default:
		e := ev.Err
		if e == nil {
			e = internal(nil)
		}
		data = st.errorData(e)
	}
	return st.send(ev.ID, ev.Kind, data)
}

// errorData is the data of an error event, noted for the access log and
// metrics as an error answer would be.
func (st *eventStream) errorData(e *Error) wire.Error {
	info := infoFrom(st.r.Context())
	info.errCode, info.err = kindCode(e.Kind), e
	st.s.metrics.observeError(kindCode(e.Kind))
	return wire.Error{Error: wire.ErrorDetail{Code: kindCode(e.Kind), Message: e.Msg}, RequestID: info.id}
}

// send writes one event: its id, its kind and one line of JSON.
func (st *eventStream) send(id, kind string, data any) error {
	var buf bytes.Buffer
	buf.WriteString("id: " + id + "\nevent: " + kind + "\ndata: ")
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(data); err != nil { // one line: JSON has no raw newline
		return internal(err)
	}
	buf.WriteString("\n")
	return st.write(buf.Bytes())
}
