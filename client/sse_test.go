package client

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func readAllSSE(t *testing.T, r io.Reader, maxLine int) ([]sseEvent, string, error) {
	t.Helper()
	sr := newSSEReader(r, maxLine, "")
	var evs []sseEvent
	for {
		ev, err := sr.next()
		if errors.Is(err, io.EOF) {
			return evs, sr.lastID, nil
		}
		if err != nil {
			return evs, sr.lastID, err
		}
		evs = append(evs, ev)
	}
}

func TestSSEReader(t *testing.T) {
	for _, tc := range []struct {
		name       string
		in         string
		want       []sseEvent
		wantLastID string
	}{
		{
			name: "the API's events",
			in:   "id: 0-0\nevent: started\ndata: {\"id\":\"exe_1\"}\n\n: heartbeat\n\nid: 3-0\nevent: stdout\ndata: {\"text\":\"hi\\n\"}\n\n",
			want: []sseEvent{
				{id: "0-0", event: "started", data: `{"id":"exe_1"}`},
				{id: "3-0", event: "stdout", data: `{"text":"hi\n"}`},
			},
			wantLastID: "3-0",
		},
		{
			name: "CRLF, CR and LF line endings",
			in:   "event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\rdata: 3\n\n",
			want: []sseEvent{{event: "a", data: "1"}, {event: "b", data: "2"}, {event: "message", data: "3"}},
		},
		{
			name: "data lines are joined with newlines",
			in:   "data: one\ndata:two\ndata:  three\ndata\n\n",
			want: []sseEvent{{event: "message", data: "one\ntwo\n three\n"}},
		},
		{
			name: "comments and unknown fields are ignored",
			in:   ": hello\nfoo: bar\nretry: 3000\ndata: x\n:another\n\n",
			want: []sseEvent{{event: "message", data: "x"}},
		},
		{
			name:       "an event without data dispatches nothing but keeps its id",
			in:         "id: 7\nevent: stdout\n\ndata: y\n\n",
			want:       []sseEvent{{id: "7", event: "message", data: "y"}},
			wantLastID: "7",
		},
		{
			name:       "an id with NUL is ignored; an empty id resets",
			in:         "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\nid\ndata: c\n\n",
			want:       []sseEvent{{id: "1", event: "message", data: "a"}, {id: "1", event: "message", data: "b"}, {id: "", event: "message", data: "c"}},
			wantLastID: "",
		},
		{
			name: "a byte order mark is skipped; a field without a colon",
			in:   "\uFEFFdata\nevent:x\n\n",
			want: []sseEvent{{event: "x", data: ""}},
		},
		{
			name: "an event cut off by EOF is discarded",
			in:   "data: whole\n\ndata: cut",
			want: []sseEvent{{event: "message", data: "whole"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One byte at a time too, so a CRLF split across reads is
			// still one line ending.
			for _, r := range []io.Reader{strings.NewReader(tc.in), iotest.OneByteReader(strings.NewReader(tc.in))} {
				got, lastID, err := readAllSSE(t, r, 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(sseEvent{})); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
				if lastID != tc.wantLastID {
					t.Errorf("last event id = %q, want %q", lastID, tc.wantLastID)
				}
			}
		})
	}
}

func TestSSEReaderLineLimit(t *testing.T) {
	_, _, err := readAllSSE(t, strings.NewReader("data: "+strings.Repeat("x", 100)+"\n\n"), 64)
	if !errors.Is(err, bufio.ErrTooLong) {
		t.Errorf("err = %v, want bufio.ErrTooLong", err)
	}
}
