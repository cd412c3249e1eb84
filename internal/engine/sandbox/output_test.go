package sandbox

import (
	"strings"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

func TestCappedBuffer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		max       int
		writes    []string
		want      string
		truncated bool
	}{
		{"empty", 4, nil, "", false},
		{"under", 4, []string{"ab"}, "ab", false},
		{"exactly", 4, []string{"ab", "cd"}, "abcd", false},
		{"split write over", 4, []string{"abc", "def"}, "abcd", true},
		{"after full", 4, []string{"abcd", "e"}, "abcd", true},
		{"empty write after full is not truncation", 2, []string{"ab", ""}, "ab", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &CappedBuffer{Max: tc.max}
			for _, w := range tc.writes {
				n, err := b.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
			}
			if got := b.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			if got := b.Truncated(); got != tc.truncated {
				t.Errorf("Truncated() = %v, want %v", got, tc.truncated)
			}
		})
	}
}

func TestCappedBufferFloodKeepsCap(t *testing.T) {
	b := &CappedBuffer{Max: engine.DefaultOutputBytes}
	chunk := []byte(strings.Repeat("x", 32<<10))
	for range 3200 { // 100 MiB
		b.Write(chunk)
	}
	if len(b.String()) != engine.DefaultOutputBytes || !b.Truncated() {
		t.Fatalf("kept %d bytes, truncated=%v; want %d, true", len(b.String()), b.Truncated(), engine.DefaultOutputBytes)
	}
	if c := cap(b.buf); c > 2*engine.DefaultOutputBytes {
		t.Fatalf("buffer grew to %d bytes of capacity", c)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		exit          int
		timedOut, oom bool
		want          engine.Status
	}{
		{0, false, false, engine.StatusSucceeded},
		{1, false, false, engine.StatusFailed},
		{137, false, false, engine.StatusFailed},
		{137, false, true, engine.StatusMemoryExceeded},
		{137, true, false, engine.StatusTimedOut},
		{137, true, true, engine.StatusTimedOut}, // the deadline decides first
	} {
		if got := Classify(tc.exit, tc.timedOut, tc.oom); got != tc.want {
			t.Errorf("Classify(%d, %v, %v) = %s, want %s", tc.exit, tc.timedOut, tc.oom, got, tc.want)
		}
	}
}
