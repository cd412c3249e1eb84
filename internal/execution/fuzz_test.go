package execution

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Fuzz targets for what a request or a reconnecting client hands the
// service: file paths, return_files globs, Last-Event-ID, and the output
// the event stream cuts into chunks. Seeds are the f.Add calls and the
// files under testdata/fuzz/<Name>/.

// FuzzParsePosition: a Last-Event-ID never panics and never gives a
// negative offset; an id the server writes reads back as itself; and
// resuming a stored execution from any id gives exactly the output after
// that position, on each stream.
func FuzzParsePosition(f *testing.F) {
	for _, seed := range []string{"", "0-0", "3-1", "end", "END", "-1-0", "1--1", "+1-0", "01-2", "9223372036854775807-0",
		"99999999999999999999-0", "1-2-3", " 1-2", "x"} {
		f.Add(seed, "aé😀b\xff", "err")
	}
	f.Fuzz(func(t *testing.T, id, stdout, stderr string) {
		p := ParsePosition(id)
		if p.Stdout < 0 || p.Stderr < 0 || (p.End && !p.Started) {
			t.Fatalf("ParsePosition(%q) = %+v", id, p)
		}
		if !p.Started && p != (Position{}) {
			t.Fatalf("ParsePosition(%q) = %+v: offsets without started", id, p)
		}
		if p.Started && !p.End {
			if q := ParsePosition(chunkID(p.Stdout, p.Stderr)); q != p {
				t.Fatalf("ParsePosition(%q) = %+v, but its canonical id %q reads %+v", id, p, chunkID(p.Stdout, p.Stderr), q)
			}
		}
		if id == EventIDEnd {
			if !p.End {
				t.Fatalf("%q is not the end", id)
			}
			return
		}
		var out, errOut strings.Builder
		kinds := ""
		from := p // next moves p on
		for _, ev := range StoredEvents(store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Stdout: stdout, Stderr: stderr}, false) {
			ev, ok := p.next(ev)
			if !ok {
				continue
			}
			kinds += ev.Kind + " "
			switch ev.Kind {
			case EventStdout:
				out.WriteString(ev.Text)
			case EventStderr:
				errOut.WriteString(ev.Text)
			}
		}
		if got, want := out.String(), stdout[min(from.Stdout, len(stdout)):]; got != want {
			t.Errorf("from %q: stdout %q, want %q", id, got, want)
		}
		if got, want := errOut.String(), stderr[min(from.Stderr, len(stderr)):]; got != want {
			t.Errorf("from %q: stderr %q, want %q", id, got, want)
		}
		if !strings.HasSuffix(kinds, EventResult+" ") || strings.HasPrefix(kinds, EventStarted) == from.Started {
			t.Errorf("from %q: events %q", id, kinds)
		}
	})
}

// FuzzEventLogChunks: whatever writes the sandbox makes on stdout and
// stderr, the live event log's chunks of a stream join up to what was
// written; no chunk is empty; each chunk's id gives the bytes sent so far
// on both streams; no chunk boundary falls inside a valid multi-byte UTF-8
// sequence (so a valid stream gives valid chunks); and resuming after any
// event gives the rest of both streams.
//
// sched drives the writes: each byte picks a stream (low bit) and how many
// bytes of it the next write takes (the rest, 0 to 127).
func FuzzEventLogChunks(f *testing.F) {
	f.Add([]byte("a\xc3\xa9b"), []byte("x"), []byte{2, 1, 4})
	f.Add([]byte("😀!"), []byte("日本"), []byte{2, 3, 2, 4, 2, 2})
	f.Add([]byte("\xff\xf0\x9f\x98a\xed\xa0\x80"), []byte("\xe6\x97"), []byte{2, 2, 2, 2, 1})
	f.Add([]byte(strings.Repeat("é", 100)), []byte(strings.Repeat("😀", 50)), []byte{255, 254, 7, 9, 11, 13})
	f.Fuzz(func(t *testing.T, stdout, stderr, sched []byte) {
		exe := store.Execution{ID: "exe_0123456789abcdef0123456789abcdef", Language: "python", Stdout: string(stdout), Stderr: string(stderr)}
		l := newEventLog()
		l.start(exe)
		rest := [2][]byte{stdout, stderr}
		streams := [2]engine.Stream{engine.Stdout, engine.Stderr}
		for _, b := range sched {
			s := b & 1
			n := min(int(b>>1), len(rest[s]))
			l.output(streams[s], rest[s][:n])
			rest[s] = rest[s][n:]
		}
		l.output(engine.Stdout, rest[0])
		l.output(engine.Stderr, rest[1])
		l.finish(exe, nil)
		evs, ended, _ := l.from(0)
		if !ended || len(evs) < 2 || evs[0].Kind != EventStarted || evs[len(evs)-1].Kind != EventResult {
			t.Fatalf("events %+v", evs)
		}
		var joined [2][]byte
		var cuts [2][]int
		for _, ev := range evs[1 : len(evs)-1] {
			s := 0
			if ev.Kind == EventStderr {
				s = 1
			}
			if ev.Text == "" {
				t.Fatalf("empty chunk %+v", ev)
			}
			joined[s] = append(joined[s], ev.Text...)
			cuts[s] = append(cuts[s], len(joined[s]))
			if want := chunkID(len(joined[0]), len(joined[1])); ev.ID != want {
				t.Fatalf("chunk id %q, want %q", ev.ID, want)
			}
		}
		for s, want := range [2][]byte{stdout, stderr} {
			if !bytes.Equal(joined[s], want) {
				t.Fatalf("stream %d: chunks join to %q, want %q", s, joined[s], want)
			}
			inside := insideRune(want)
			for _, c := range cuts[s] {
				if inside[c] {
					t.Fatalf("stream %d %q: a chunk ends at %d, inside a UTF-8 sequence (cuts %v)", s, want, c, cuts[s])
				}
			}
		}
		for i, ev := range evs {
			p := ParsePosition(ev.ID)
			var got [2]string
			for _, later := range evs[i+1:] {
				later, ok := p.next(later)
				switch {
				case !ok:
				case later.Kind == EventStdout:
					got[0] += later.Text
				case later.Kind == EventStderr:
					got[1] += later.Text
				}
			}
			if ev.Kind == EventResult {
				continue
			}
			o, e := ParsePosition(ev.ID).Stdout, ParsePosition(ev.ID).Stderr
			if got[0] != string(stdout[o:]) || got[1] != string(stderr[e:]) {
				t.Fatalf("after %q: got %q, want %q and %q", ev.ID, got, stdout[o:], stderr[e:])
			}
		}
	})
}

// insideRune marks the offsets of b (0 to len(b)) that fall strictly
// inside a valid multi-byte UTF-8 sequence, reading b from the start.
func insideRune(b []byte) []bool {
	in := make([]bool, len(b)+1)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			for k := i + 1; k < i+n; k++ {
				in[k] = true
			}
		}
		i += n
	}
	return in
}

// FuzzFilePaths: a files path that validation accepts stays beneath the
// working directory when joined to it, is already clean, has no NUL or
// backslash, is within the documented length and depth, and the engine's
// own check agrees; and two accepted files never make one path a
// directory of another or of the code file.
func FuzzFilePaths(f *testing.F) {
	for _, seed := range [][2]string{{"a.txt", "in/data.csv"}, {"main.py/x", "b"}, {"a", "a/b"}, {"../x", "a/../b"}, {"./a", "a//b"},
		{"/etc/passwd", "a\\b"}, {"a\x00", "a/"}, {strings.Repeat("d/", 16) + "f", strings.Repeat("x", 256)}, {"..", "..."}, {"a", "a"}} {
		f.Add(seed[0], seed[1])
	}
	lang := engine.Language{Name: "python", File: "main.py"}
	c := Caller{Plan: config.DefaultPlans()["pro"]}
	root := filepath.Join(string(filepath.Separator), "work", "code")
	f.Fuzz(func(t *testing.T, p, q string) {
		msg := badPath(p)
		if engErr := sandbox.CheckFilePath(p); (msg == "") != (engErr == nil) {
			t.Fatalf("%q: validation says %q, the engine says %v", p, msg, engErr)
		}
		if msg == "" {
			joined := filepath.Join(root, p)
			if !filepath.IsLocal(p) || filepath.Clean(p) != p || !strings.HasPrefix(joined, root+string(filepath.Separator)) ||
				strings.ContainsAny(p, "\x00\\") || len(p) > MaxPathBytes || strings.Count(p, "/") >= MaxPathDepth {
				t.Fatalf("path %q accepted (joined: %q)", p, joined)
			}
		}
		files, err := checkFiles(c, lang, []InputFile{{Path: p, Content: "1"}, {Path: q, Content: "2"}})
		if err != nil {
			return
		}
		if len(files) != 2 || badPath(p) != "" || badPath(q) != "" || p == q || p == lang.File || q == lang.File {
			t.Fatalf("files %q and %q accepted: %+v", p, q, files)
		}
		for _, pair := range [][2]string{{p, q}, {q, p}, {lang.File, p}, {lang.File, q}} {
			if strings.HasPrefix(pair[1], pair[0]+"/") {
				t.Fatalf("files %q and %q accepted: %q would be a directory", p, q, pair[0])
			}
		}
	})
}

// FuzzReturnFiles: a return_files glob that validation accepts is a
// valid doublestar pattern, and collecting with it from a working
// directory that holds a symlink out, a FIFO and a nested tree returns
// only regular files beneath it, each matching the glob, each with a path
// the files check would accept.
func FuzzReturnFiles(f *testing.F) {
	for _, seed := range []string{"*", "**", "out/**", "*.png", "{a,b}/*", "[a-z]*", "../x", "/etc/*", "a/../../*", "[", "**/*.{csv,txt}", "link/*", "\\*", ".*"} {
		f.Add(seed)
	}
	dir := f.TempDir()
	outside := filepath.Join(dir, "outside")
	work := filepath.Join(dir, "work")
	for _, p := range []string{"outside/secret", "work/a.txt", "work/out/b.png", "work/out/deep/c.csv", "work/.hidden", "work/b/x"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(work, "link")); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(work, "secret")); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, g string) {
		if checkReturnFiles([]string{g}) != nil {
			return
		}
		if !doublestar.ValidatePattern(g) || strings.HasPrefix(g, "/") || len(g) > MaxGlobBytes {
			t.Fatalf("glob %q accepted", g)
		}
		files, _, err := sandbox.CollectFiles(work, []string{g}, engine.Limits{})
		if err != nil {
			t.Fatalf("collecting %q: %v", g, err)
		}
		for _, file := range files {
			ok, err := doublestar.Match(g, file.Path)
			if msg := badPath(file.Path); msg != "" || !ok || err != nil || !bytes.HasPrefix(file.Content, []byte("work/")) ||
				string(file.Content) != "work/"+file.Path {
				t.Fatalf("glob %q returned %q (%q): %s", g, file.Path, file.Content, msg)
			}
		}
	})
}
