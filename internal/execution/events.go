package execution

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// The kinds of Event, as they go on the wire.
const (
	EventStarted = "started"
	EventStdout  = "stdout"
	EventStderr  = "stderr"
	EventResult  = "result"
	EventError   = "error"
)

// EventIDEnd is the id of the last event (result or error).
const EventIDEnd = "end"

// Event is one step of an execution as a client follows it: started, a
// chunk of stdout or stderr, then result (or error when the platform
// failed). IDs are positions that mean the same live and replayed from
// the store, on any node: "0-0" for started, "<stdout bytes>-<stderr
// bytes>" sent so far including the chunk, "end" for the last event.
type Event struct {
	ID   string
	Kind string
	// Text is a chunk of output (stdout, stderr) as the program wrote it;
	// it never ends inside a multi-byte UTF-8 sequence that later output
	// completes. Invalid bytes are kept: the wire encoding replaces them
	// as it does for the JSON result.
	Text string
	// Execution is the execution: only ID and Language for started, the
	// finished execution for result.
	Execution store.Execution
	// Replay marks the result of an idempotent replay.
	Replay bool
	// Err is the failure of an error event.
	Err *Error
}

// Position is how far a client has followed an execution: what a
// Last-Event-ID says.
type Position struct {
	Started        bool // the started event was seen
	Stdout, Stderr int  // output bytes seen
	End            bool // the last event was seen
}

// ParsePosition reads a Last-Event-ID; "" or anything unparsable means
// from the start.
func ParsePosition(id string) Position {
	if id == EventIDEnd {
		return Position{Started: true, End: true}
	}
	o, e, ok := strings.Cut(id, "-")
	if !ok {
		return Position{}
	}
	no, err1 := strconv.Atoi(o)
	ne, err2 := strconv.Atoi(e)
	if err1 != nil || err2 != nil || no < 0 || ne < 0 {
		return Position{}
	}
	return Position{Started: true, Stdout: no, Stderr: ne}
}

func chunkID(stdout, stderr int) string { return strconv.Itoa(stdout) + "-" + strconv.Itoa(stderr) }

// next returns ev as a client at p should get it, and whether it should
// get it at all, and moves p past it. An output chunk partly seen is cut
// to its unseen part (its id, its end, stays).
func (p *Position) next(ev Event) (Event, bool) {
	if p.End {
		return Event{}, false
	}
	switch ev.Kind {
	case EventStarted:
		if p.Started {
			return Event{}, false
		}
		p.Started = true
	case EventStdout, EventStderr:
		seen := &p.Stdout
		if ev.Kind == EventStderr {
			seen = &p.Stderr
		}
		end := chunkEnd(ev)
		start := end - len(ev.Text)
		if end <= *seen {
			return Event{}, false
		}
		if start < *seen {
			ev.Text = ev.Text[*seen-start:]
		}
		*seen = end
	default:
		p.End = true
	}
	return ev, true
}

// chunkEnd is the offset an output chunk's id gives for its own stream.
func chunkEnd(ev Event) int {
	o, e, _ := strings.Cut(ev.ID, "-")
	s := o
	if ev.Kind == EventStderr {
		s = e
	}
	n, _ := strconv.Atoi(s)
	return n
}

// StoredEvents are the events of a finished execution as the store has
// it: started, its stdout, its stderr, result. They carry the same ids a
// live stream would have reached, so a client may resume across both.
func StoredEvents(e store.Execution, replay bool) []Event {
	evs := []Event{{ID: chunkID(0, 0), Kind: EventStarted, Execution: store.Execution{ID: e.ID, Language: e.Language}}}
	o, er := len(e.Stdout), len(e.Stderr)
	if o > 0 {
		evs = append(evs, Event{ID: chunkID(o, 0), Kind: EventStdout, Text: e.Stdout})
	}
	if er > 0 {
		evs = append(evs, Event{ID: chunkID(o, er), Kind: EventStderr, Text: e.Stderr})
	}
	return append(evs, Event{ID: EventIDEnd, Kind: EventResult, Execution: e, Replay: replay})
}

// utf8Complete returns how much of b can be sent without cutting a
// multi-byte sequence that the next bytes may complete. Invalid bytes
// count as complete: nothing would make them valid.
func utf8Complete(b []byte) int {
	for i := len(b) - 1; i >= 0 && i > len(b)-utf8.UTFMax; i-- {
		c := b[i]
		if c < utf8.RuneSelf {
			return len(b)
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// eventLog is the event stream of one execution running on this node:
// fed by the sandbox's output (engine.Spec.Output), read by any number of
// subscribers. It holds at most the capped output, and lives only while
// the execution is active; a later attach replays from the store.
type eventLog struct {
	mu      sync.Mutex
	events  []Event
	changed chan struct{} // closed (and replaced) when events grow
	ended   bool
	sent    [3]int    // output bytes in events, by engine.Stream
	pending [3][]byte // an incomplete UTF-8 sequence held back, by stream
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{})} }

// appendLocked adds ev and wakes the subscribers.
func (l *eventLog) appendLocked(ev Event) {
	l.events = append(l.events, ev)
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *eventLog) start(exe store.Execution) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.startLocked(exe)
}

func (l *eventLog) startLocked(exe store.Execution) {
	if len(l.events) == 0 && !l.ended {
		l.appendLocked(Event{ID: chunkID(0, 0), Kind: EventStarted, Execution: store.Execution{ID: exe.ID, Language: exe.Language}})
	}
}

// output is the engine.Spec.Output sink.
func (l *eventLog) output(s engine.Stream, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || len(p) == 0 {
		return
	}
	b := append(l.pending[s], p...)
	n := utf8Complete(b)
	l.pending[s] = append([]byte(nil), b[n:]...)
	l.chunkLocked(s, b[:n])
}

func (l *eventLog) chunkLocked(s engine.Stream, b []byte) {
	if len(b) == 0 {
		return
	}
	l.sent[s] += len(b)
	kind := EventStdout
	if s == engine.Stderr {
		kind = EventStderr
	}
	l.appendLocked(Event{ID: chunkID(l.sent[engine.Stdout], l.sent[engine.Stderr]), Kind: kind, Text: string(b)})
}

// finish ends the log with the stored execution's result, or with err.
// Output held back or never passed to the sink (the stored result is
// what counts) is sent first, so the live stream ends where a replay
// from the store would.
func (l *eventLog) finish(exe store.Execution, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Kind: KindNotFound, Msg: "the execution was withdrawn before it started (its client left the queue)", Err: err}
		}
		l.appendLocked(Event{ID: EventIDEnd, Kind: EventError, Err: e})
		l.ended = true
		return
	}
	l.startLocked(exe)
	for _, s := range []engine.Stream{engine.Stdout, engine.Stderr} {
		l.chunkLocked(s, l.pending[s])
		l.pending[s] = nil
		stored := exe.Stdout
		if s == engine.Stderr {
			stored = exe.Stderr
		}
		if l.sent[s] < len(stored) {
			l.chunkLocked(s, []byte(stored[l.sent[s]:]))
		}
	}
	l.appendLocked(Event{ID: EventIDEnd, Kind: EventResult, Execution: exe})
	l.ended = true
}

// from returns the events from index i on, whether the log has ended,
// and a channel closed when there is more.
func (l *eventLog) from(i int) ([]Event, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events[i:], l.ended, l.changed
}

// Attach follows tenant's execution id from position p (see
// ParsePosition): live from this node's log while it runs here, else
// from the store, which is polled every CancelPoll until the execution
// is final (with PostgreSQL it may run on another node; its output then
// arrives with the result). The channel is closed after the last event,
// or when ctx ends. An unknown id (or another tenant's) is KindNotFound.
func (s *Service) Attach(ctx context.Context, c Caller, id string, p Position) (<-chan Event, error) {
	if !ValidID(id) {
		return nil, Errorf(KindNotFound, "execution not found")
	}
	tenant := c.Key.Tenant
	a := s.lookup(id)
	if a == nil || a.tenant != tenant {
		a = nil
		if _, err := s.Get(ctx, c, id); err != nil {
			return nil, err
		}
	}
	out := make(chan Event)
	go func() {
		defer close(out)
		send := func(ev Event) bool {
			ev, ok := p.next(ev)
			if !ok {
				return true
			}
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for !p.End {
			if a == nil {
				a = s.lookup(id)
				if a != nil && a.tenant != tenant {
					a = nil
				}
			}
			if a != nil {
				s.follow(ctx, a.events, send)
				return
			}
			e, err := s.store.Execution(ctx, tenant, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
				send(Event{ID: EventIDEnd, Kind: EventError, Err: Errorf(KindNotFound, "the execution was withdrawn before it started")})
				return
			case err == nil && store.Final(e.Status):
				for _, ev := range StoredEvents(e, false) {
					if !send(ev) {
						return
					}
				}
				return
			}
			t := time.NewTimer(s.opts.CancelPoll)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
	return out, nil
}

// follow sends l's events as they come until the log ends.
func (s *Service) follow(ctx context.Context, l *eventLog, send func(Event) bool) {
	for i := 0; ; {
		evs, ended, changed := l.from(i)
		for _, ev := range evs {
			if !send(ev) {
				return
			}
		}
		i += len(evs)
		if ended {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// String is for test failures.
func (ev Event) String() string { return fmt.Sprintf("%s %s %q", ev.ID, ev.Kind, ev.Text) }
