package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"mime"
	"net/http"
	"net/url"
	"strconv"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// EventType names the events of an execution's stream.
type EventType string

// The events of a stream, in the order they come: one EventStarted, any
// number of EventStdout and EventStderr, then EventResult, or EventError
// when the platform failed after the start.
const (
	EventStarted EventType = "started"
	EventStdout  EventType = "stdout"
	EventStderr  EventType = "stderr"
	EventResult  EventType = "result"
	EventError   EventType = "error"
)

// Event is one event of an execution's stream.
type Event struct {
	Type EventType
	// ID is the event's id: "0-0" for started, "<stdout bytes>-<stderr
	// bytes>" sent so far for output, "end" for result and error. Pass it
	// to Attach to resume after this event.
	ID string
	// ExecutionID is the execution's id ("exe_..."), known from the
	// started event on; Language is set on the started event.
	ExecutionID string
	Language    string
	// Text is the chunk of a stdout or stderr event. Chunks are split on
	// UTF-8 boundaries, so each one is whole text.
	Text string
	// Execution is the finished execution of a result event, exactly what
	// Run returns.
	Execution *Execution
	// Error is the failure of an error event; its StatusCode is 0, since
	// the HTTP status was already 200.
	Error *Error
}

const eventStreamType = "text/event-stream"

// Stream runs code like Run, but hands over the program's output while it
// runs. It sends the request with Accept: text/event-stream and yields
// the events as they arrive:
//
//	for ev, err := range c.Stream(ctx, code) {
//		if err != nil {
//			return err
//		}
//		switch ev.Type {
//		case client.EventStdout:
//			os.Stdout.WriteString(ev.Text)
//		case client.EventResult:
//			fmt.Println(ev.Execution.Status)
//		}
//	}
//
// A refusal before the run starts (key, validation, rate, quota, busy) is
// yielded as an *Error, after the same retries as Run. An error event is
// yielded with its *Error as both Event.Error and the error. If the
// connection drops, Stream reattaches (GET /v1/executions/{id}/events with
// Last-Event-ID), so no output is lost or repeated; before the started
// event it sends the request again under the same idempotency key, which
// never runs the code twice. Breaking out of the loop closes the
// connection; the run goes on and its result is stored.
//
// A server that does not stream answers with JSON; Stream then yields
// the same events from that answer (started, the whole stdout and stderr,
// result).
func (c *Client) Stream(ctx context.Context, code string, opts ...RunOption) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		cl, err := c.runCall(code, opts)
		if err != nil {
			yield(Event{}, err)
			return
		}
		cl.accept = eventStreamType
		c.stream(ctx, cl, &streamState{}, yield)
	}
}

// Attach follows an execution of this key's tenant, queued, running or
// finished, with GET /v1/executions/{id}/events. With lastEventID empty
// it replays the stream from the start; with an Event.ID it resumes after
// that event (after "end" there is nothing more). It yields events like
// Stream.
func (c *Client) Attach(ctx context.Context, id, lastEventID string) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		if id == "" {
			yield(Event{}, errors.New("vertal: empty execution id"))
			return
		}
		c.stream(ctx, eventsCall(id, lastEventID), &streamState{execID: id, lastID: lastEventID}, yield)
	}
}

func eventsCall(id, lastEventID string) call {
	h := http.Header{}
	if lastEventID != "" {
		h.Set("Last-Event-ID", lastEventID)
	}
	return call{
		method: http.MethodGet,
		path:   "/v1/executions/" + url.PathEscape(id) + "/events",
		header: h,
		retry:  retryAlways,
		accept: eventStreamType,
	}
}

// streamState is what a stream knows across reconnections.
type streamState struct {
	execID string // from the started event (or Attach's id)
	lastID string // the last event id received
}

// stream opens cl and yields its events, reconnecting when the connection
// breaks before the last event.
func (c *Client) stream(ctx context.Context, cl call, st *streamState, yield func(Event, error) bool) {
	for reconnects := 0; ; reconnects++ {
		resp, err := c.open(ctx, cl)
		if err != nil {
			yield(Event{}, err)
			return
		}
		done, err := c.readEvents(resp, st, yield)
		if done {
			return
		}
		if ctx.Err() != nil {
			yield(Event{}, fmt.Errorf("vertal: reading event stream: %w", ctx.Err()))
			return
		}
		if reconnects >= c.maxRetries {
			yield(Event{}, err)
			return
		}
		if err := c.sleep(ctx, c.backoff(reconnects)); err != nil {
			yield(Event{}, err)
			return
		}
		if st.execID != "" {
			cl = eventsCall(st.execID, st.lastID)
		} // else: the same POST again, under the same Idempotency-Key
	}
}

// readEvents yields the events of one response and closes it. done is
// false when the stream broke before its end; err then says how.
func (c *Client) readEvents(resp *http.Response, st *streamState, yield func(Event, error) bool) (done bool, err error) {
	defer resp.Body.Close()
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch mt {
	case eventStreamType:
	case "application/json":
		c.yieldBuffered(resp, yield)
		return true, nil
	default:
		yield(Event{}, fmt.Errorf("vertal: event stream answered with Content-Type %q", resp.Header.Get("Content-Type")))
		return true, nil
	}
	r := newSSEReader(resp.Body, maxResponseBytes, st.lastID)
	for {
		sev, err := r.next()
		st.lastID = r.lastID
		if errors.Is(err, io.EOF) {
			if st.lastID == "end" {
				return true, nil // attached after the end: nothing more
			}
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return false, fmt.Errorf("vertal: reading event stream: %w", err)
		}
		ev, ok, err := decodeEvent(sev, resp.Header.Get("X-Request-ID"))
		if err != nil {
			yield(Event{}, err)
			return true, nil
		}
		if !ok {
			continue // an event type this version does not know
		}
		if ev.Type == EventStarted {
			st.execID = ev.ExecutionID
		}
		ev.ExecutionID = st.execID
		switch ev.Type {
		case EventError:
			yield(ev, ev.Error)
			return true, nil
		case EventResult:
			yield(ev, nil)
			return true, nil
		}
		if !yield(ev, nil) {
			return true, nil
		}
	}
}

// decodeEvent turns an SSE event into an Event; ok is false for a type
// this version does not know.
func decodeEvent(sev sseEvent, requestID string) (ev Event, ok bool, err error) {
	ev = Event{Type: EventType(sev.event), ID: sev.id}
	data := []byte(sev.data)
	switch ev.Type {
	case EventStarted:
		var d wire.StartedEvent
		err = json.Unmarshal(data, &d)
		ev.ExecutionID, ev.Language = d.ID, d.Language
	case EventStdout, EventStderr:
		var d wire.OutputEvent
		err = json.Unmarshal(data, &d)
		ev.Text = d.Text
	case EventResult:
		var ex Execution
		err = json.Unmarshal(data, &ex)
		ev.Execution = &ex
	case EventError:
		var d wire.Error
		err = json.Unmarshal(data, &d)
		ev.Error = &Error{Code: d.Error.Code, Message: d.Error.Message, RequestID: d.RequestID}
		if ev.Error.Code == "" {
			ev.Error.Code = "stream_error"
		}
		if ev.Error.RequestID == "" {
			ev.Error.RequestID = requestID
		}
	default:
		return Event{}, false, nil
	}
	if err != nil {
		return Event{}, false, fmt.Errorf("vertal: decoding %s event: %w", sev.event, err)
	}
	return ev, true, nil
}

// yieldBuffered turns a whole JSON execution, from a server that does not
// stream, into the events a streaming one would have sent.
func (c *Client) yieldBuffered(resp *http.Response, yield func(Event, error) bool) {
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		yield(Event{}, fmt.Errorf("vertal: reading response: %w", err))
		return
	}
	var ex Execution
	if err := json.Unmarshal(raw, &ex); err != nil {
		yield(Event{}, fmt.Errorf("vertal: decoding response: %w", err))
		return
	}
	out, errOut := strconv.Itoa(len(ex.Stdout)), strconv.Itoa(len(ex.Stderr))
	events := []Event{{Type: EventStarted, ID: "0-0", Language: ex.Language}}
	if ex.Stdout != "" {
		events = append(events, Event{Type: EventStdout, ID: out + "-0", Text: ex.Stdout})
	}
	if ex.Stderr != "" {
		events = append(events, Event{Type: EventStderr, ID: out + "-" + errOut, Text: ex.Stderr})
	}
	events = append(events, Event{Type: EventResult, ID: "end", Execution: &ex})
	for _, ev := range events {
		ev.ExecutionID = ex.ID
		if !yield(ev, nil) {
			return
		}
	}
}
