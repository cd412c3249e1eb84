package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// notebookCells are the cells the notebook test runs, in order, in one
// Python context. The hostile one returns HTML that would set a flag in
// the page if it ever ran there.
var notebookCells = []string{
	"import sys\nx = 41\nprint('hello from cell 1')\nprint('a warning', file=sys.stderr)",
	"x + 1",
	"import pandas as pd\ndf = pd.DataFrame({'name': ['ada', 'alan', 'grace'], 'score': [36, 41, 85]})\ndf",
	"class Evil:\n    def _repr_html_(self):\n        return ('<b id=\"bold\">bold</b><script>top.__pwned = 1; parent.document.title = \"pwned\"</script>'\n                '<img src=\"x\" onerror=\"top.__pwned = 2\"><a href=\"javascript:top.__pwned=3\">link</a>')\nEvil()",
	"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()",
	// Last: Run all stops at a cell that fails, as a notebook's does.
	"def boom():\n    return 1 / 0\nboom()",
}

// TestNotebookWithRealServer drives the notebook in Chromium against
// `vertal serve --dev` with the real oci driver and the data-science
// image: cells keep state in one context, a value, stderr, an error with
// its traceback, a DataFrame in a sandboxed frame that cannot reach the
// page, hostile HTML that runs nowhere, a chart as an image, a restart
// that loses the state and an end that deletes the sandbox. Screenshots
// at laptop and phone widths go to VERTAL_SCREENSHOTS when set.
func TestNotebookWithRealServer(t *testing.T) {
	requireServerE2E(t)
	datasci := e2etest.DatasciDir()
	if _, err := os.Stat(datasci); err != nil {
		t.Fatalf("the notebook test needs the datasci image (scripts/setup.sh test builds it): %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "vertal")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kuboprotocol/vertal2kubo/cmd/vertal").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	agent := exec.Command("go", "build", "-o", filepath.Join(dir, "vertal-agent"), "github.com/kuboprotocol/vertal2kubo/cmd/vertal-agent")
	agent.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := agent.CombinedOutput(); err != nil {
		t.Fatalf("go build vertal-agent: %v\n%s", err, out)
	}
	args := []string{"serve", "--dev", "--host", "127.0.0.1", "--port", "0", "--data-dir", filepath.Join(dir, "data"), "--image", "datasci=" + datasci}
	if rootfs := os.Getenv("VERTAL_ROOTFS"); rootfs != "" {
		args = append(args, "--image-dir", filepath.Dir(rootfs))
	}
	srv := startServer(t, bin, args)
	defer func() {
		if t.Failed() {
			t.Logf("server log:\n%s", srv.log())
		}
	}()
	shots := os.Getenv("VERTAL_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}

	b := newBrowser(t, 1366, 768)
	h := b.open(srv.url + "/notebook")
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-src blob:") || !strings.Contains(csp, "script-src 'self';") {
		t.Errorf("the notebook's CSP is %q", csp)
	}
	nb := openNotebook(b, srv.url, srv.key, "datasci")
	nb.setCells(notebookCells)
	got := nb.runAll()
	for i, c := range got {
		t.Logf("cell %d: %s %s %q", i+1, c.Status, c.Count, c.Text)
	}
	want := []struct {
		status string
		text   []string
	}{
		{"succeeded", []string{"hello from cell 1", "a warning"}},
		{"succeeded", []string{"42"}},
		{"succeeded", nil},
		{"succeeded", nil},
		{"succeeded", nil},
		{"failed", []string{"ZeroDivisionError", "division by zero", "boom"}},
	}
	for i, w := range want {
		if got[i].Status != w.status {
			t.Errorf("cell %d: status %q, want %q", i+1, got[i].Status, w.status)
		}
		for _, s := range w.text {
			if !strings.Contains(got[i].Text, s) {
				t.Errorf("cell %d: output %q lacks %q", i+1, got[i].Text, s)
			}
		}
	}
	if got[0].Stderr != "a warning\n" {
		t.Errorf("cell 1: stderr shown as %q, want its own block", got[0].Stderr)
	}
	if !strings.Contains(got[5].Traceback, "line 2") {
		t.Errorf("cell 6: the traceback %q does not show the line", got[5].Traceback)
	}
	// The counts go up one per cell run in the context.
	for i := 1; i < len(got); i++ {
		if got[i].Count == "[ ]" || got[i].Count == got[i-1].Count {
			t.Errorf("cell %d: execution count %q after %q", i+1, got[i].Count, got[i-1].Count)
		}
	}
	// The DataFrame: in a sandboxed frame whose document the page cannot
	// reach, with its text also offered as text.
	if f := got[2]; f.Frames != 1 || f.FrameSandbox != "" || f.FrameReadable || !f.FrameBlob || !strings.Contains(f.AsText, "grace") {
		t.Errorf("cell 3: DataFrame frames=%d sandbox=%q readable=%v blob=%v as text %q", f.Frames, f.FrameSandbox, f.FrameReadable, f.FrameBlob, f.AsText)
	}
	// The frame's own stylesheet (frame.css, allowed by its hash) applies:
	// the DataFrame's rows are striped. Without it, the table is bare black
	// on white. Frames draw lazily, so it is scrolled to first.
	b.do(chromedp.ScrollIntoView(chromedp.CSS(`#cells .nb-cell:nth-child(3) iframe`)))
	time.Sleep(300 * time.Millisecond)
	if n := pixelsOf(t, b, `#cells .nb-cell:nth-child(3) iframe`, color.RGBA{0xf7, 0xf8, 0xfa, 0xff}); n < 200 {
		t.Errorf("the DataFrame's frame has %d pixels of frame.css's row stripe: its stylesheet did not apply", n)
	}
	// The hostile HTML: shown in a frame, and nothing of it ran anywhere.
	time.Sleep(500 * time.Millisecond) // time for an onerror to fire, if it could
	if f := got[3]; f.Frames != 1 || f.FrameSandbox != "" || f.FrameReadable {
		t.Errorf("cell 4: hostile HTML frames=%d sandbox=%q readable=%v", f.Frames, f.FrameSandbox, f.FrameReadable)
	}
	if pwned := eval[string](b, `String(window.__pwned) + ' ' + document.title`); pwned != "undefined Notebook · Vertal Run" {
		t.Errorf("the hostile HTML reached the page: %q", pwned)
	}
	if n := eval[int](b, `document.querySelectorAll('#cells script, #cells [onerror], #cells a[href^="javascript"]').length`); n != 0 {
		t.Errorf("the hostile HTML put %d elements into the page itself", n)
	}
	// The chart: a PNG, decoded, as an image.
	if c := got[4]; c.Images != 1 || c.ImageWidth < 100 {
		t.Errorf("cell 5: the chart shows as %d images, %d px wide", c.Images, c.ImageWidth)
	}
	b.do(chromedp.ScrollIntoView(chromedp.CSS(`#cells .nb-cell:nth-child(3)`)))
	saveShot(t, b, filepath.Join(shots, "laptop-notebook.png"), 1366, 768, false)
	// Frames out of view are not painted in a full-page capture (Chrome
	// draws out-of-process frames lazily), so the hostile one gets its own.
	b.do(chromedp.ScrollIntoView(chromedp.CSS(`#cells .nb-cell:nth-child(4)`)))
	saveShot(t, b, filepath.Join(shots, "laptop-notebook-html.png"), 1366, 768, false)
	saveShot(t, b, filepath.Join(shots, "laptop-notebook-full.png"), 1366, 768, true, ".site-header", "#key", "#run-all", "#cells .nb-cell")

	// Run all stopped at the failing cell: a cell after it is not run.
	nb.setCells([]string{"1 / 0", "x"})
	if stop := nb.runAll(); stop[0].Status != "failed" || stop[1].Status != "not run" {
		t.Errorf("Run all past a failing cell: %q then %q, want failed then not run", stop[0].Status, stop[1].Status)
	}
	// A flood of results (the kernel's own _send, reachable from the
	// cell) draws at most 10 frames and says how many it left out.
	nb.setCells([]string{"import __main__ as k\nfor i in range(300):\n    k._send({'t': 'result', 'main': False, 'data': {'text/plain': 'x', 'text/html': '<b>%d</b>' % i}})"})
	if flood := nb.runAll()[0]; flood.Frames != 10 || !strings.Contains(flood.Text, "290 more results not shown") {
		t.Errorf("a flood of 300 HTML results drew %d frames; the cell shows %q", flood.Frames, clipText(flood.Text, 300))
	}
	// Output as a terminal draws it: a progress bar redraws its line and an
	// ANSI colour shows as one. An image whose bytes do not decode shows as
	// a note and its text, not a broken-image icon.
	nb.setCells([]string{
		"import time\nfor i in range(3):\n    print(f'\\r{i}/2', end='', flush=True)\n    time.sleep(0.2)\nprint('\\n\\x1b[32mok\\x1b[0m')",
		"class Bad:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n' + b'not a png' * 4\n    def __repr__(self):\n        return 'bad image'\nBad()",
	})
	tty := nb.runAll()
	if c := tty[0]; c.Status != "succeeded" || !strings.Contains(c.Text, "2/2\nok") || strings.Contains(c.Text, "1/2") || strings.Contains(c.Text, "\\") {
		t.Errorf("a progress bar and a colour drew %q %q", c.Status, c.Text)
	}
	if green := eval[string](b, `[...document.querySelectorAll('#cells .nb-cell:nth-child(1) .ansi-fg-2')].map((s) => s.textContent).join()`); green != "ok" {
		t.Errorf("the green text is %q, want ok", green)
	}
	if c := tty[1]; c.Images != 0 || !strings.Contains(c.Text, "could not be drawn") || !strings.Contains(c.Text, "bad image") {
		t.Errorf("an image that does not decode: %d images, text %q", c.Images, c.Text)
	}
	nb.setCells(notebookCells)
	// Re-running a cell: a new count, the same state.
	before := eval[string](b, `document.querySelector('#cells .nb-cell:nth-child(2) .nb-count').textContent`)
	b.do(chromedp.Click(chromedp.CSS(`#cells .nb-cell:nth-child(2) .nb-run`)))
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.querySelector('#cells .nb-cell:nth-child(2) .nb-count').textContent !== `+jsString(before), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Errorf("re-running cell 2 left its count at %s: %v", before, err)
	}
	if txt := eval[string](b, `document.querySelector('#cells .nb-cell:nth-child(2) .nb-output').innerText`); !strings.Contains(txt, "42") {
		t.Errorf("cell 2 run again shows %q", txt)
	}
	// Stop: a cell that sleeps is interrupted, and the context keeps x.
	nb.setCells([]string{"import time\nprint('sleeping', flush=True)\ntime.sleep(60)", "x * 2"})
	b.do(chromedp.Click(chromedp.CSS(`#cells .nb-cell:nth-child(1) .nb-run`)))
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.querySelector('#cells .nb-cell:nth-child(1) .nb-output').innerText.includes('sleeping')`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the sleeping cell showed nothing: %v", err)
	}
	b.do(chromedp.Click(chromedp.CSS(`#cells .nb-cell:nth-child(1) .nb-stop`)))
	stoppedAt := time.Now()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.querySelector('#cells .nb-cell:nth-child(1) .nb-status').textContent === 'stopped'`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Errorf("the stopped cell does not say so: %v", err)
	}
	b.do(chromedp.Click(chromedp.CSS(`#cells .nb-cell:nth-child(2) .nb-run`)))
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`!['not run', 'queued', 'running…'].includes(document.querySelector('#cells .nb-cell:nth-child(2) .nb-status').textContent)`, chromedp.WithPollingTimeout(90*time.Second))); err != nil {
		t.Fatalf("the cell after a stopped one did not end: %v", err)
	}
	if txt := eval[string](b, `document.querySelector('#cells .nb-cell:nth-child(2) .nb-output').innerText`); !strings.Contains(txt, "82") {
		t.Errorf("after Stop, x * 2 shows %q (the context should keep x)", txt)
	}
	// The server interrupts the cell when the page stops reading: the next
	// one does not wait out the sleep.
	if d := time.Since(stoppedAt); d > 30*time.Second {
		t.Errorf("the cell after a stopped one answered %s later: the stopped cell kept running", d)
	}
	nb.setCells(notebookCells)

	// Outputs survive a reload: text, a DataFrame's frame and an error come
	// back with their status and count. A cell whose code changed after it
	// ran gets none.
	kept := []string{"print('kept across a reload')\nx", "df", "y = 1\ny", "1 / 0"}
	nb.setCells(kept)
	ran := nb.runAll()
	nb.setCells([]string{kept[0], kept[1], "y = 2\ny", kept[3]})

	// State survives a reload of the page: the session is kept in the tab.
	sandboxID := eval[string](b, `JSON.parse(sessionStorage.getItem('vertal.nb.session')).sandbox`)
	nb = openNotebook(b, srv.url, "", "datasci")
	back := nb.cells()
	for _, i := range []int{0, 1, 3} {
		if r, g := ran[i], back[i]; g.Text != r.Text || g.Status != r.Status || g.Count != r.Count || g.Traceback != r.Traceback || g.Frames != r.Frames || r.Status == "not run" {
			t.Errorf("cell %d after a reload: %q %q %q (%d frames), before it %q %q %q (%d frames)", i+1, g.Status, g.Count, g.Text, g.Frames, r.Status, r.Count, r.Text, r.Frames)
		}
	}
	if ran[2].Text == "" || back[2].Text != "" || back[2].Status != "not run" {
		t.Errorf("the edited cell: %q before the reload, %q %q after (want no output)", ran[2].Text, back[2].Status, back[2].Text)
	}
	if !strings.Contains(back[0].Text, "kept across a reload") || back[1].Frames != 1 || !strings.Contains(back[3].Traceback, "ZeroDivisionError") {
		t.Errorf("after a reload: %q, %d frames, %q", back[0].Text, back[1].Frames, back[3].Traceback)
	}
	nb.setCells([]string{"x + 2"})
	if c := nb.runAll()[0]; c.Status != "succeeded" || !strings.Contains(c.Text, "43") {
		t.Errorf("after a reload, x + 2 shows %q %q", c.Status, c.Text)
	}
	// Restart: the variable is gone, the sandbox is the same.
	b.do(chromedp.Click(chromedp.ID("restart")))
	nb.waitNotice("Kernel restarted")
	if c := nb.runAll()[0]; c.Status != "failed" || !strings.Contains(c.Text, "NameError") {
		t.Errorf("after a restart, x + 2 shows %q %q, want a NameError", c.Status, c.Text)
	}
	if id := eval[string](b, `JSON.parse(sessionStorage.getItem('vertal.nb.session')).sandbox`); id != sandboxID {
		t.Errorf("the restart changed the sandbox from %s to %s", sandboxID, id)
	}
	// End during a run: the running cell stops, the queued one is not run
	// (not in a new sandbox either), and the language stays fixed while
	// cells are pending.
	nb.setCells([]string{"import time\nprint('start', flush=True)\ntime.sleep(30)", "x"})
	b.do(chromedp.Click(chromedp.ID("run-all")))
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.querySelector('#cells .nb-cell:nth-child(1) .nb-output').innerText.includes('start')`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the sleeping cell showed nothing: %v", err)
	}
	if !eval[bool](b, `document.getElementById('language').disabled`) {
		t.Errorf("the language can be switched while cells run")
	}
	b.do(chromedp.Click(chromedp.ID("end")))
	nb.waitNotice("Session ended")
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`[...document.querySelectorAll('#cells .nb-status')].map((s) => s.textContent).join() === 'stopped,not run'`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Errorf("after End during a run the cells show %q, want stopped and not run", eval[string](b, `[...document.querySelectorAll('#cells .nb-status')].map((s) => s.textContent).join()`))
	}
	if st := eval[string](b, `String(sessionStorage.getItem('vertal.nb.session'))`); st != "null" {
		t.Errorf("after End during a run a session is kept: %s", st)
	}
	if eval[bool](b, `document.getElementById('language').disabled`) {
		t.Errorf("the language stays fixed after the cells ended")
	}
	if st := sandboxStatus(t, srv, sandboxID); st != "ended" && st != "404" {
		t.Errorf("after End session the sandbox is %s", st)
	}
	// JavaScript: its own context in a new sandbox (the last one ended),
	// with let kept across cells and top-level await.
	b.setLanguage("javascript")
	nb.setCells([]string{"let n = 20", "await Promise.resolve(n + 22)", "console.error('to stderr'); n.nope()"})
	js := nb.runAll()
	if js[0].Status != "succeeded" || js[1].Status != "succeeded" || !strings.Contains(js[1].Text, "42") {
		t.Errorf("JavaScript cells show %+v", js)
	}
	if js[2].Status != "failed" || !strings.Contains(js[2].Text, "TypeError") || js[2].Stderr != "to stderr\n" {
		t.Errorf("a failing JavaScript cell shows %q %q (stderr %q)", js[2].Status, js[2].Text, js[2].Stderr)
	}
	if id := eval[string](b, `JSON.parse(sessionStorage.getItem('vertal.nb.session')).sandbox`); id == sandboxID || id == "" {
		t.Errorf("after End session, JavaScript ran in sandbox %q (the ended one was %s)", id, sandboxID)
	}
	b.do(chromedp.Click(chromedp.ID("end")))
	nb.waitNotice("Session ended")
	b.checkClean()

	// A phone: the same notebook, its own sandbox, nothing sideways.
	p := newBrowser(t, 390, 844)
	pnb := openNotebook(p, srv.url, srv.key, "datasci")
	pnb.setCells(notebookCells[:4])
	if got := pnb.runAll(); got[1].Status != "succeeded" || !strings.Contains(got[1].Text, "42") || got[3].Frames != 1 {
		t.Errorf("phone: cells show %+v", got)
	}
	p.do(chromedp.ScrollIntoView(chromedp.CSS(`#cells .nb-cell:nth-child(3)`)))
	saveShot(t, p, filepath.Join(shots, "phone-notebook.png"), 390, 844, false)
	saveShot(t, p, filepath.Join(shots, "phone-notebook-full.png"), 390, 844, true, ".site-header", "#key", "#run-all", "#cells .nb-cell")
	p.do(chromedp.Click(chromedp.ID("end")))
	pnb.waitNotice("Session ended")
	p.checkClean()
}

type notebook struct{ b *browser }

// openNotebook loads /notebook with a fresh tab state, types the key
// (none: keep the tab's) and picks the image.
func openNotebook(b *browser, url, key, image string) notebook {
	b.t.Helper()
	b.open(url + "/notebook")
	b.do(chromedp.WaitReady(chromedp.CSS(`body[data-ready="true"]`)))
	if key != "" {
		b.typeKey(key)
		// The image list comes with the key check.
		if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`[...document.querySelectorAll('#image option')].some((o) => o.value === `+jsString(image)+`)`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			b.t.Fatalf("the notebook offers no %s image: %v", image, err)
		}
		b.do(chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById('image'); s.value = ` + jsString(image) + `; s.dispatchEvent(new Event('change')); })()`))
	}
	return notebook{b}
}

// setCells makes the notebook hold exactly these cells.
func (n notebook) setCells(codes []string) {
	n.b.t.Helper()
	js := `((codes) => {
	  const cells = () => document.querySelectorAll('#cells .nb-cell');
	  while (cells().length < codes.length) document.getElementById('add').click();
	  while (cells().length > codes.length) cells()[cells().length - 1].querySelector('.nb-delete').click();
	  cells().forEach((c, i) => { const ta = c.querySelector('.nb-code'); ta.value = codes[i]; ta.dispatchEvent(new Event('input')); });
	  return cells().length;
	})(` + mustJSON(n.b.t, codes) + `)`
	if got := eval[int](n.b, js); got != len(codes) {
		n.b.t.Fatalf("the notebook holds %d cells, want %d", got, len(codes))
	}
}

type cellView struct {
	Status, Count, Text, Stderr, Traceback, AsText, FrameSandbox string
	Frames, Images, ImageWidth                                   int
	FrameReadable, FrameBlob                                     bool
}

// runAll clicks Run all and waits until every cell has an outcome.
func (n notebook) runAll() []cellView {
	n.b.t.Helper()
	n.b.do(chromedp.Click(chromedp.ID("run-all")))
	done := `[...document.querySelectorAll('#cells .nb-status')].every((s) => !['queued', 'running…'].includes(s.textContent))`
	if _, err := chromedp.Run(n.b.ctx, chromedp.Poll[bool](done, chromedp.WithPollingTimeout(2*time.Minute))); err != nil {
		n.b.t.Fatalf("the cells did not all end: %v", err)
	}
	return n.cells()
}

// cells reads what every cell shows.
func (n notebook) cells() []cellView {
	n.b.t.Helper()
	// Let images decode and frames load.
	_, _ = chromedp.Run(n.b.ctx, chromedp.Poll[bool](`[...document.querySelectorAll('#cells img')].every((i) => i.complete)`, chromedp.WithPollingTimeout(5*time.Second)))
	js := `[...document.querySelectorAll('#cells .nb-cell')].map((c) => {
	  const frames = [...c.querySelectorAll('iframe')];
	  const imgs = [...c.querySelectorAll('img')];
	  const q = (s) => { const e = c.querySelector(s); return e ? e.textContent : ''; };
	  let readable = false;
	  for (const f of frames) { try { if (f.contentDocument !== null || f.contentWindow.document) readable = true; } catch (e) {} }
	  return {
	    Status: q('.nb-status'), Count: q('.nb-count'), Text: c.querySelector('.nb-output').innerText,
	    Stderr: q('.nb-stderr'), Traceback: q('.nb-traceback'), AsText: q('.nb-as-text pre'),
	    FrameSandbox: frames.length ? String(frames[0].getAttribute('sandbox')) : 'none',
	    Frames: frames.length, Images: imgs.length, ImageWidth: imgs.length ? imgs[0].naturalWidth : 0,
	    FrameReadable: readable, FrameBlob: frames.length > 0 && frames[0].src.startsWith('blob:'),
	  };
	})`
	out := eval[[]cellView](n.b, js)
	return out
}

func (n notebook) waitNotice(text string) {
	n.b.t.Helper()
	if _, err := chromedp.Run(n.b.ctx, chromedp.Poll[bool](`document.getElementById('notice').textContent.includes(`+jsString(text)+`)`, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		n.b.t.Fatalf("no notice %q: %v (notice: %q)", text, err, eval[string](n.b, `document.getElementById('notice').textContent`))
	}
}

// sandboxStatus asks the API for the sandbox's status, or "404".
func sandboxStatus(t *testing.T, srv *server, id string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), "GET", srv.url+"/api/v1/sandboxes/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+srv.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == 404 {
		return "404"
	}
	var v struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v.Status
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// pixelsOf counts the pixels of exactly colour c in a screenshot of the
// element sel.
func pixelsOf(t *testing.T, b *browser, sel string, c color.RGBA) int {
	t.Helper()
	shot, err := chromedp.Run(b.ctx, chromedp.Screenshot(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("screenshot of %s: %v", sel, err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot of %s: %v", sel, err)
	}
	n := 0
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			if color.RGBAModel.Convert(img.At(x, y)) == c {
				n++
			}
		}
	}
	return n
}
