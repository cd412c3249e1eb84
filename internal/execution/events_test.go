package execution

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// TestEventLogChunks: chunks end on UTF-8 boundaries whatever the writes,
// ids are byte offsets including the chunk, and finish flushes what was
// held back and what the sink never saw, before the result.
func TestEventLogChunks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string // "o:..." or "e:..."
		stored [2]string
		want   []string
	}{
		{"two-byte split", []string{"o:a\xc3", "o:\xa9b"}, [2]string{"aéb", ""}, []string{"0-0 started", `1-0 stdout "a"`, `4-0 stdout "éb"`, "end result"}},
		{"four-byte split thrice", []string{"o:\xf0", "o:\x9f", "o:\x98", "o:\x80!"}, [2]string{"😀!", ""}, []string{"0-0 started", `5-0 stdout "😀!"`, "end result"}},
		{"streams apart", []string{"o:\xe6\x97", "e:x", "o:\xa5"}, [2]string{"日", "x"}, []string{"0-0 started", `0-1 stderr "x"`, `3-1 stdout "日"`, "end result"}},
		{"invalid byte is not held", []string{"o:\xff", "o:a"}, [2]string{"\xffa", ""}, []string{"0-0 started", "1-0 stdout \"\xff\"", `2-0 stdout "a"`, "end result"}},
		{"cut at the cap", []string{"o:ab\xc3"}, [2]string{"ab\xc3", ""}, []string{"0-0 started", `2-0 stdout "ab"`, "3-0 stdout \"\xc3\"", "end result"}},
		{"sink saw nothing", nil, [2]string{"out", "err"}, []string{"0-0 started", `3-0 stdout "out"`, `3-3 stderr "err"`, "end result"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newEventLog()
			exe := store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Language: "python", Status: "succeeded", Stdout: tc.stored[0], Stderr: tc.stored[1]}
			l.start(exe)
			for _, w := range tc.writes {
				s := engine.Stdout
				if w[0] == 'e' {
					s = engine.Stderr
				}
				l.output(s, []byte(w[2:]))
			}
			l.finish(exe, nil)
			evs, ended, _ := l.from(0)
			var got []string
			for _, ev := range evs {
				s := ev.ID + " " + ev.Kind
				if ev.Text != "" {
					s += " " + quote(ev.Text)
				}
				got = append(got, s)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || !ended {
				t.Errorf("events (-want +got), ended %v:\n%s", ended, diff)
			}
		})
	}
}

func quote(s string) string { return `"` + s + `"` }

// TestPositionResume: a Last-Event-ID means the same against a live log
// and against a stored replay.
func TestPositionResume(t *testing.T) {
	exe := store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Language: "python", Status: "succeeded", Stdout: "aéb", Stderr: "xy"}
	live := newEventLog()
	live.start(exe)
	live.output(engine.Stdout, []byte("a\xc3"))
	live.output(engine.Stderr, []byte("x"))
	live.output(engine.Stdout, []byte("\xa9b"))
	live.output(engine.Stderr, []byte("y"))
	live.finish(exe, nil)
	liveEvents, _, _ := live.from(0)
	stored := StoredEvents(exe, false)
	collect := func(evs []Event, last string) (out string) {
		p := ParsePosition(last)
		for _, ev := range evs {
			if ev, ok := p.next(ev); ok {
				if ev.Kind == EventStdout || ev.Kind == EventStderr {
					out += ev.Kind[3:] + "=" + ev.Text + " "
				} else {
					out += ev.Kind + " "
				}
			}
		}
		return out
	}
	for _, tc := range []struct{ last, want string }{
		{"", "started out=aéb err=xy result "},
		{"nonsense", "started out=aéb err=xy result "},
		{"0-0", "out=aéb err=xy result "},
		{"1-1", "out=éb err=y result "},
		{"4-1", "err=y result "},
		{"4-2", "result "},
		{"end", ""},
	} {
		// Outputs per stream in order; the live log interleaves them.
		l, s := sortStreams(collect(liveEvents, tc.last)), sortStreams(collect(stored, tc.last))
		if l != sortStreams(tc.want) || s != sortStreams(tc.want) {
			t.Errorf("Last-Event-ID %q: live %q, stored %q; want %q", tc.last, l, s, tc.want)
		}
	}
}

// sortStreams joins each stream's texts, so live and stored compare.
func sortStreams(s string) string {
	var out, err, other string
	for _, f := range splitFields(s) {
		switch {
		case len(f) > 4 && f[:4] == "out=":
			out += f[4:]
		case len(f) > 4 && f[:4] == "err=":
			err += f[4:]
		default:
			other += f + ","
		}
	}
	return "out=" + out + " err=" + err + " " + other
}

func splitFields(s string) []string {
	var out []string
	cur := ""
	for _, r := range s {
		if r == ' ' {
			if cur != "" {
				out = append(out, cur)
			}
			cur = ""
			continue
		}
		cur += string(r)
	}
	return out
}
