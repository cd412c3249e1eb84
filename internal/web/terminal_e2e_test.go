package web_test

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// TestTerminalOutput drives common.js's terminal() in Chromium: program
// output, given in chunks as a stream brings it, is drawn as a terminal
// would ("\r" redraws the line, SGR colours and bold), whatever the chunk
// boundaries, and nothing in it becomes markup or a class of its choosing.
func TestTerminalOutput(t *testing.T) {
	requireE2E(t)
	srv := httptest.NewServer(web.Handler(web.Options{OpenAPI: testOpenAPIDoc(t), Version: "test"}))
	defer srv.Close()
	b := newBrowser(t, 1024, 768)
	b.open(srv.URL + "/notebook")
	for _, tc := range []struct {
		name   string
		chunks []string
		text   string   // what the pre shows
		spans  []string // "class:text" of each styled span, in order
	}{
		{"plain", []string{"a\nb"}, "a\nb", nil},
		{"carriage return redraws", []string{"10%\r20%\r30%\n", "done"}, "30%\ndone", nil},
		{"a progress bar over chunks", []string{"\r 1/3", "\r 2/3", "\r 3/3", "\n"}, " 3/3\n", nil},
		{"trailing CR keeps the line", []string{"abc\r", "\n"}, "abc\n", nil},
		{"CRLF", []string{"one\r\ntwo\r\n"}, "one\ntwo\n", nil},
		{"colour and reset", []string{"\x1b[31mred\x1b[0m plain"}, "red plain", []string{"ansi-fg-1:red"}},
		{"bright and bold", []string{"\x1b[1;92mok\x1b[22m still green\x1b[39m"}, "ok still green", []string{"ansi-fg-10 ansi-bold:ok", "ansi-fg-10: still green"}},
		{"escape cut by a chunk", []string{"\x1b[3", "4mblue\x1b", "[0m."}, "blue.", []string{"ansi-fg-4:blue"}},
		{"colour across lines", []string{"\x1b[33mone\ntwo\x1b[m\nthree"}, "one\ntwo\nthree", []string{"ansi-fg-3:one", "ansi-fg-3:two"}},
		{"colour set in an overwritten segment", []string{"\x1b[35mwait\r", "done\x1b[0m\n"}, "done\n", []string{"ansi-fg-5:done"}},
		{"256 and true colour are not drawn", []string{"\x1b[38;5;196mx\x1b[38;2;1;2;3my\x1b[0m"}, "xy", nil},
		{"other sequences dropped", []string{"a\x1b[2Kb\x1b[1Ac\x1b]0;title\x07d"}, "abc0;title\\x07d", nil},
		{"markup stays text", []string{"\x1b[31m<img src=x onerror=alert(1)>\x1b[0m"}, "<img src=x onerror=alert(1)>", []string{"ansi-fg-1:<img src=x onerror=alert(1)>"}},
		{"bidi override marked", []string{"\u202eevil"}, "\\u202eevil", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks, _ := json.Marshal(tc.chunks)
			got := eval[string](b, `(() => {
				const pre = document.createElement('pre');
				const term = VertalCommon.terminal(pre);
				for (const c of `+string(chunks)+`) term.append(c);
				const spans = [...pre.querySelectorAll('span:not(.ctl)')].filter((s) => s.className).map((s) => s.className + ':' + s.textContent);
				return JSON.stringify({ text: pre.textContent, spans, imgs: pre.querySelectorAll('img').length });
			})()`)
			var r struct {
				Text  string
				Spans []string
				Imgs  int
			}
			if err := json.Unmarshal([]byte(got), &r); err != nil {
				t.Fatal(err)
			}
			if r.Text != tc.text || r.Imgs != 0 || !slices.Equal(r.Spans, tc.spans) {
				t.Errorf("chunks %q drew %q with spans %q (%d imgs), want %q with %q", tc.chunks, r.Text, r.Spans, r.Imgs, tc.text, tc.spans)
			}
		})
	}
}
