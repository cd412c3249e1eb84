package client

import (
	"bufio"
	"bytes"
	"io"
	"strconv"
	"strings"
)

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	id    string // the last event ID after this event, as the spec keeps it
	event string // "message" when the event had no event: field
	data  string
}

// sseReader parses a text/event-stream as the WHATWG HTML standard
// ("Server-sent events", "Interpreting an event stream") describes it:
// lines end in CRLF, LF or CR; a blank line dispatches the event; lines
// starting with ':' are comments; data: lines are joined with '\n'; an id
// containing NUL is ignored; an event not ended by a blank line before
// EOF is discarded. retry: is parsed but unused: the client reconnects on
// its own schedule.
type sseReader struct {
	sc *bufio.Scanner
	// lastID is the stream's last event ID, committed at each blank line
	// (even one that dispatches nothing); idBuf is the id: field seen
	// since. A reconnect sends lastID as Last-Event-ID.
	lastID, idBuf string
	first         bool
}

// newSSEReader reads r; lastID is the id a reconnection starts from.
func newSSEReader(r io.Reader, maxLine int, lastID string) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, min(4096, maxLine)), maxLine)
	sc.Split(scanSSELines)
	return &sseReader{sc: sc, lastID: lastID, idBuf: lastID, first: true}
}

// next returns the next event, io.EOF at a clean end of the stream, or
// the read error (bufio.ErrTooLong for a line over the limit).
func (r *sseReader) next() (sseEvent, error) {
	var (
		data      strings.Builder
		hasData   bool
		eventType string
	)
	for r.sc.Scan() {
		line := r.sc.Text()
		if r.first {
			line = strings.TrimPrefix(line, "\uFEFF")
			r.first = false
		}
		if line == "" {
			r.lastID = r.idBuf
			if !hasData {
				eventType = ""
				continue
			}
			ev := sseEvent{id: r.lastID, event: eventType, data: strings.TrimSuffix(data.String(), "\n")}
			if ev.event == "" {
				ev.event = "message"
			}
			return ev, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "event":
			eventType = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
			hasData = true
		case "id":
			if !strings.ContainsRune(value, 0) {
				r.idBuf = value
			}
		case "retry":
			_, _ = strconv.ParseUint(value, 10, 64) // reconnection time: unused
		}
	}
	if err := r.sc.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}

// scanSSELines is a bufio.SplitFunc for the three line endings of the
// event stream format. A CR at the end of the buffer waits for more
// input, since it may be the first half of a CRLF.
func scanSSELines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		if i+1 < len(data) {
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		}
		if atEOF {
			return i + 1, data[:i], nil
		}
		return 0, nil, nil // a lone CR at the end: wait for the next byte
	}
	if atEOF {
		return len(data), data, nil // last line without an ending
	}
	return 0, nil, nil
}
