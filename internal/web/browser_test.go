package web_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// The browser tests drive Debian's chromium through chromedp. They need
// VERTAL_E2E=1 (CI sets it) and /usr/bin/chromium (or VERTAL_CHROMIUM).

func requireE2E(t *testing.T) { e2etest.Require(t, "chromium") }

// watchScript runs before any page script: it records Content-Security-
// Policy violations, so a test fails if the page ever tries something the
// policy blocks.
const watchScript = `
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__csp.push(e.violatedDirective + ' ' + e.blockedURI);
});`

type browser struct {
	t   *testing.T
	ctx context.Context

	mu         sync.Mutex
	exceptions []string
}

func newBrowser(t *testing.T, width, height int64) *browser {
	t.Helper()
	exe := os.Getenv("VERTAL_CHROMIUM")
	if exe == "" {
		exe = "/usr/bin/chromium"
	}
	if _, err := os.Stat(exe); err != nil {
		t.Fatalf("chromium not found at %s (apt-get install chromium): %v", exe, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(int(width), int(height)),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	b := &browser{t: t, ctx: ctx}
	if err := chromedp.Do(ctx); err != nil { // starts the browser and opens the tab
		t.Fatalf("starting chromium: %v", err)
	}
	exceptions := chromedp.Events(ctx, runtime.ExceptionThrown)
	go func() {
		for ev, err := range exceptions {
			if err != nil {
				return
			}
			text := ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				text += " " + ev.ExceptionDetails.Exception.Description
			}
			b.mu.Lock()
			b.exceptions = append(b.exceptions, text)
			b.mu.Unlock()
		}
	}()
	b.do(
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: watchScript})
			return err
		}),
		chromedp.EmulateViewport(width, height),
	)
	return b
}

func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

func eval[T any](b *browser, js string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.t.Fatalf("evaluating %q: %v", js, err)
	}
	return v
}

// open loads a page and waits until the playground script has started.
func (b *browser) open(url string) http.Header {
	b.t.Helper()
	resp, err := chromedp.Run(b.ctx, chromedp.NavigateResponse(url))
	if err != nil {
		b.t.Fatalf("navigating to %s: %v", url, err)
	}
	h := http.Header{}
	for k, v := range resp.Headers {
		h.Set(k, fmt.Sprint(v))
	}
	if strings.HasSuffix(url, "/") && !strings.Contains(url, "/docs/") {
		b.do(chromedp.WaitReady(chromedp.CSS(`body[data-ready="true"]`)))
	}
	return h
}

// checkClean fails the test if the page threw or violated its policy.
func (b *browser) checkClean() {
	b.t.Helper()
	if v := eval[[]string](b, `window.__csp || []`); len(v) > 0 {
		b.t.Errorf("Content-Security-Policy violations: %q", v)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.exceptions) > 0 {
		b.t.Errorf("uncaught exceptions in the page: %q", b.exceptions)
	}
}

func jsString(s string) string {
	out, _ := json.Marshal(s)
	return string(out)
}

func (b *browser) typeKey(key string) {
	b.t.Helper()
	// Select what is there, then type, as a user would.
	b.do(
		chromedp.Focus(chromedp.ID("key")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('key').select()`),
		chromedp.SendKeys(chromedp.ID("key"), key),
	)
}

func (b *browser) setLanguage(lang string) {
	b.t.Helper()
	b.do(chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById('language'); s.value = ` + jsString(lang) + `; s.dispatchEvent(new Event('change')); })()`))
}

// setCode replaces the editor's content; typing it would go through the
// editor's auto-indent.
func (b *browser) setCode(code string) {
	b.t.Helper()
	b.do(chromedp.Evaluate[chromedp.Void](`(() => { const c = document.getElementById('code'); c.value = ` + jsString(code) + `; c.dispatchEvent(new Event('input')); })()`))
}

// pressEnter presses Enter the way a keyboard does: one keyDown carrying
// the text, so a handler that prevents the keydown also prevents the
// newline. (KeyEvent sends a separate char event, which a page cannot stop.)
func pressEnter() chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13, Text: "\r", UnmodifiedText: "\r"}
		if _, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, down); err != nil {
			return err
		}
		up := down
		up.Type, up.Text, up.UnmodifiedText = input.DispatchKeyEventTypeKeyUp, "", ""
		_, err := cdp.Call(ctx, tg, input.DispatchKeyEvent, up)
		return err
	})
}

// view is what the result panel shows.
type view struct {
	Status, ExitCode, Duration, Truncated string
	Stdout, Stderr                        string
	StdoutElements, StderrElements        int // other than the page's own control-character marks
	StdoutMarks                           int
	ErrorShown                            bool
	ErrorStatus, ErrorCode, ErrorMessage  string
	ErrorHint                             string
	ExecutionID, RequestID                string
	KeyStatus                             string
}

const readView = `(() => {
  const $ = (id) => document.getElementById(id);
  return {
    Status: $('status').textContent, ExitCode: $('exit-code').textContent, Duration: $('duration').textContent,
    Truncated: $('truncated').textContent, Stdout: $('stdout').textContent, Stderr: $('stderr').textContent,
    StdoutElements: $('stdout').querySelectorAll(':scope *:not(span.ctl), span.ctl *').length,
    StderrElements: $('stderr').querySelectorAll(':scope *:not(span.ctl), span.ctl *').length,
    StdoutMarks: $('stdout').querySelectorAll(':scope > span.ctl').length,
    ErrorShown: !$('error').hidden, ErrorStatus: $('error-status').textContent, ErrorCode: $('error-code').textContent,
    ErrorMessage: $('error-message').textContent, ErrorHint: $('error-hint').hidden ? '' : $('error-hint').textContent,
    ExecutionID: $('execution-id').textContent, RequestID: $('request-id').textContent,
    KeyStatus: $('key-status').textContent,
  };
})()`

// waitResult waits for the run started just before to finish.
func (b *browser) waitResult() view {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](
		`document.getElementById('run').getAttribute('aria-busy') !== 'true' && document.getElementById('status').textContent !== 'running…'`,
		chromedp.WithPollingTimeout(90*time.Second))); err != nil {
		b.t.Fatalf("waiting for the result: %v", err)
	}
	return eval[view](b, readView)
}

func (b *browser) clickRun() view {
	b.t.Helper()
	b.do(chromedp.Click(chromedp.ID("run")))
	return b.waitResult()
}

// counts of elements a payload would add if output were parsed as HTML.
const countElements = `({img: document.getElementsByTagName('img').length, script: document.getElementsByTagName('script').length,
  svg: document.getElementsByTagName('svg').length, b: document.getElementsByTagName('b').length,
  iframe: document.getElementsByTagName('iframe').length, all: document.querySelectorAll('*:not(span.ctl)').length})`

// program is a test program and what the result panel must show for it.
type program struct {
	name, language, code string
	stdout, stderr       string // as displayed (control characters made visible)
	exitCode             int
	// rawStdout/rawStderr are what the interpreter writes, for the fake API.
	rawStdout, rawStderr string
}

var xssPython = strings.Join([]string{
	`import sys`,
	`print('<script>window.__xss = "script"</script>')`,
	`print('<img src=x onerror="window.__xss = \'img\'">')`,
	`print("\x1b[31mred\x1b[0m \x1b]0;title\x07 bell")`,
	`sys.stdout.flush()`,
	`sys.stdout.buffer.write(b"\xff\xfe<b>bold</b>\n")`,
	`print('<svg onload="window.__xss = \'svg\'"></svg><iframe srcdoc="x"></iframe>', file=sys.stderr)`,
	``,
}, "\n")

var programs = []program{
	{
		name: "python", language: "python", code: "print(6 * 7)\n",
		rawStdout: "42\n", stdout: "42\n",
	},
	{
		name: "javascript", language: "javascript", code: "console.log(6 * 7);\nconsole.error('to stderr');\n",
		rawStdout: "42\n", stdout: "42\n", rawStderr: "to stderr\n", stderr: "to stderr\n",
	},
	{
		name: "bash", language: "bash", code: "echo $((6 * 7))\nexit 3\n",
		rawStdout: "42\n", stdout: "42\n", exitCode: 3,
	},
	{
		name: "xss", language: "python", code: xssPython,
		rawStdout: "<script>window.__xss = \"script\"</script>\n<img src=x onerror=\"window.__xss = 'img'\">\n\x1b[31mred\x1b[0m \x1b]0;title\x07 bell\n\xff\xfe<b>bold</b>\n",
		stdout:    "<script>window.__xss = \"script\"</script>\n<img src=x onerror=\"window.__xss = 'img'\">\n\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 bell\n\ufffd\ufffd<b>bold</b>\n",
		rawStderr: "<svg onload=\"window.__xss = 'svg'\"></svg><iframe srcdoc=\"x\"></iframe>\n",
		stderr:    "<svg onload=\"window.__xss = 'svg'\"></svg><iframe srcdoc=\"x\"></iframe>\n",
	},
}

func statusOf(p program) string {
	if p.exitCode == 0 {
		return "succeeded"
	}
	return "failed"
}

// target is a server to test: a URL whose "/" is the playground, and keys.
type target struct {
	url        string
	key        string
	quotaKey   string // a key whose daily quota is used up; "" to skip
	realEngine bool
	// fake is the fake API behind url, if it is one: it holds a stream
	// until the test lets it go on, and shows the files a run got.
	fake *fakeAPI
}

// runPlaygroundSuite is the browser suite, run against the fake API and
// against the real server.
func runPlaygroundSuite(t *testing.T, tg target) {
	t.Run("headers", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		h := b.open(tg.url + "/")
		if got := h.Get("Content-Security-Policy"); got != web.ContentSecurityPolicy {
			t.Errorf("Content-Security-Policy = %q, want %q", got, web.ContentSecurityPolicy)
		}
		for k, want := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"} {
			if got := h.Get(k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
		b.checkClean()
	})

	t.Run("languages", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		b.open(tg.url + "/")
		b.typeKey(tg.key)
		// Entering a key shows whose it is and the runtimes' versions.
		if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](
			`document.getElementById('key-status').textContent.startsWith('Key OK') && /\d/.test(document.querySelector('#language option[value=python]').textContent)`,
			chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			t.Errorf("key check: status %q, python option %q", eval[string](b, `document.getElementById('key-status').textContent`),
				eval[string](b, `document.querySelector('#language option[value=python]').textContent`))
		}
		for _, p := range programs[:3] {
			b.setLanguage(p.language)
			b.setCode(p.code)
			got := b.clickRun()
			if got.ErrorShown {
				t.Fatalf("%s: error %s %s: %s", p.name, got.ErrorStatus, got.ErrorCode, got.ErrorMessage)
			}
			want := struct{ Status, ExitCode, Stdout, Stderr string }{statusOf(p), fmt.Sprint(p.exitCode), p.stdout, p.stderr}
			gotShort := struct{ Status, ExitCode, Stdout, Stderr string }{got.Status, got.ExitCode, got.Stdout, got.Stderr}
			if diff := cmp.Diff(want, gotShort); diff != "" {
				t.Errorf("%s: result (-want +got):\n%s", p.name, diff)
			}
			if !strings.HasPrefix(got.RequestID, "req_") || !strings.HasPrefix(got.ExecutionID, "exe_") {
				t.Errorf("%s: ids = %q, %q; want req_..., exe_...", p.name, got.RequestID, got.ExecutionID)
			}
			if !strings.HasSuffix(got.Duration, "ms") && !strings.HasSuffix(got.Duration, " s") {
				t.Errorf("%s: duration = %q", p.name, got.Duration)
			}
			if got.Truncated != "no" {
				t.Errorf("%s: truncated = %q, want no", p.name, got.Truncated)
			}
		}
		// The key stays in this tab's sessionStorage and never in the URL.
		if got := eval[string](b, `sessionStorage.getItem('vertal.apiKey')`); got != tg.key {
			t.Errorf("sessionStorage key = %q, want the key", got)
		}
		if got := eval[string](b, `location.href`); strings.Contains(got, tg.key) {
			t.Errorf("the key is in the URL: %s", got)
		}
		if got := eval[string](b, `JSON.stringify(localStorage)`); strings.Contains(got, tg.key) {
			t.Error("the key is in localStorage")
		}
		b.checkClean()
	})

	if tg.realEngine {
		t.Run("starter programs", func(t *testing.T) {
			b := newBrowser(t, 1366, 768)
			b.open(tg.url + "/")
			b.typeKey(tg.key)
			for _, lang := range []string{"python", "javascript", "bash"} {
				b.setLanguage(lang) // a fresh tab shows each language's starter
				got := b.clickRun()
				if got.Status != "succeeded" || !strings.HasPrefix(got.Stdout, "Hello from ") || got.Stderr != "" {
					t.Errorf("%s starter: status %q stdout %q stderr %q (error %q)", lang, got.Status, got.Stdout, got.Stderr, got.ErrorMessage)
				}
			}
			b.checkClean()
		})
	}

	t.Run("live output and files", func(t *testing.T) { testLiveOutputAndFiles(t, tg) })

	t.Run("ctrl-enter and typing", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		b.open(tg.url + "/")
		b.typeKey(tg.key)
		b.setLanguage("python")
		b.setCode("")
		b.do(
			chromedp.Focus(chromedp.ID("code")),
			chromedp.KeyEvent("for i in range(2):"),
			pressEnter(),
			chromedp.KeyEvent("print(i * 21)"),
		)
		code := eval[string](b, `document.getElementById('code').value`)
		if want := "for i in range(2):\n    print(i * 21)"; code != want {
			t.Errorf("typed code = %q, want %q (auto-indent after ':')", code, want)
		}
		b.do(chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierCtrl)))
		got := b.waitResult()
		if got.Status != "succeeded" || got.Stdout != "0\n21\n" {
			t.Errorf("after Ctrl+Enter: status %q stdout %q (error %q %q), want succeeded \"0\\n21\\n\"", got.Status, got.Stdout, got.ErrorCode, got.ErrorMessage)
		}
		// Tab indents inside the editor instead of leaving it.
		b.setCode("x")
		b.do(
			chromedp.Evaluate[chromedp.Void](`(() => { const c = document.getElementById('code'); c.focus(); c.setSelectionRange(0, 0); })()`),
			chromedp.KeyEvent(kb.Tab),
		)
		if got := eval[string](b, `document.activeElement.id + '|' + document.getElementById('code').value`); got != "code|    x" {
			t.Errorf("after Tab: %q, want focus kept and 4 spaces", got)
		}
		b.checkClean()
	})

	t.Run("untrusted output", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		b.open(tg.url + "/")
		b.typeKey(tg.key)
		before := eval[map[string]int](b, countElements)
		p := programs[3]
		b.setLanguage(p.language)
		b.setCode(p.code)
		got := b.clickRun()
		if got.ErrorShown {
			t.Fatalf("error %s %s: %s", got.ErrorStatus, got.ErrorCode, got.ErrorMessage)
		}
		// A server may replace each invalid byte or each run of them.
		if diff := cmp.Diff(collapseReplacement(p.stdout), collapseReplacement(got.Stdout)); diff != "" {
			t.Errorf("stdout as shown (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(p.stderr, got.Stderr); diff != "" {
			t.Errorf("stderr as shown (-want +got):\n%s", diff)
		}
		if got.StdoutElements != 0 || got.StderrElements != 0 {
			t.Errorf("output became elements: %d in stdout, %d in stderr", got.StdoutElements, got.StderrElements)
		}
		if got.StdoutMarks != 4 { // ESC ESC ESC BEL
			t.Errorf("control characters marked: %d, want 4", got.StdoutMarks)
		}
		// Give an injected handler every chance to fire before checking.
		b.do(chromedp.Sleep(300 * time.Millisecond))
		if diff := cmp.Diff(before, eval[map[string]int](b, countElements)); diff != "" {
			t.Errorf("element counts changed (-before +after):\n%s", diff)
		}
		if flag := eval[string](b, `String(window.__xss)`); flag != "undefined" {
			t.Errorf("a payload ran: window.__xss = %s", flag)
		}
		if title := eval[string](b, `document.title`); title != "Playground · Vertal Run" {
			t.Errorf("document.title = %q: an escape sequence changed the page", title)
		}
		b.checkClean()
	})

	t.Run("invalid key", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		b.open(tg.url + "/")
		b.typeKey("kubo_sk_" + strings.Repeat("0", 43))
		b.setCode("print(1)\n")
		got := b.clickRun()
		if !got.ErrorShown || got.ErrorStatus != "401" || got.ErrorCode != "unauthorized" || got.ErrorMessage == "" {
			t.Errorf("error panel = %+v, want 401 unauthorized with the server's message", got)
		}
		if !strings.HasPrefix(got.RequestID, "req_") {
			t.Errorf("request id = %q, want req_...", got.RequestID)
		}
		if !strings.Contains(got.KeyStatus, "unauthorized") {
			t.Errorf("key status = %q, want it to say the key was refused", got.KeyStatus)
		}
		if got.Stdout != "" || got.ExitCode != "—" {
			t.Errorf("a refused run shows output: %+v", got)
		}
		b.checkClean()
	})

	t.Run("missing key", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		b.open(tg.url + "/")
		got := b.clickRun()
		if !got.ErrorShown || got.ErrorCode != "missing_key" {
			t.Errorf("error panel = %+v, want missing_key", got)
		}
		if id := eval[string](b, `document.activeElement.id`); id != "key" {
			t.Errorf("focus on %q, want the key field", id)
		}
		b.checkClean()
	})

	if tg.quotaKey != "" {
		t.Run("quota exceeded", func(t *testing.T) {
			b := newBrowser(t, 1366, 768)
			b.open(tg.url + "/")
			b.typeKey(tg.quotaKey)
			b.setCode("print(1)\n")
			got := b.clickRun()
			if got.ErrorStatus != "429" || got.ErrorCode != "quota_exceeded" {
				t.Errorf("error = %s %s, want 429 quota_exceeded", got.ErrorStatus, got.ErrorCode)
			}
			if !strings.Contains(got.ErrorHint, "resets in") || !strings.Contains(got.ErrorHint, "00:00 UTC") {
				t.Errorf("hint = %q, want when the quota resets", got.ErrorHint)
			}
			b.checkClean()
		})
	}

	t.Run("snippets", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		b.open(tg.url + "/")
		b.setLanguage("javascript")
		b.setCode("console.log('it''s')\n")
		b.do(chromedp.Sleep(400 * time.Millisecond)) // the snippets follow the editor after a short pause
		for tab, want := range map[string][]string{
			"curl":   {"curl -sS -X POST " + tg.url + "/api/v1/executions", `"language":"javascript"`, `'\''`},
			"python": {"from vertal2kubo.client import KuboClient, KuboError", `KuboClient("` + tg.url + `/api"`, `language="javascript"`},
			"go":     {`"github.com/kuboprotocol/vertal2kubo/client"`, `client.New("` + tg.url + `/api"`, `client.WithLanguage("javascript")`},
			"cli":    {"export KUBO_API_URL=" + tg.url + "/api", "vertal run --language javascript -"},
			"mcp":    {`"args": [` + "\n" + `        "mcp"`, `"vertal2kubo.mcp"`, `"KUBO_API_URL": "` + tg.url + `/api"`},
		} {
			b.do(chromedp.Click(chromedp.ID("tab-" + tab)))
			text := eval[string](b, `document.getElementById('snippet-panel').textContent`)
			for _, w := range want {
				if !strings.Contains(text, w) {
					t.Errorf("%s snippet lacks %q:\n%s", tab, w, text)
				}
			}
		}
		b.checkClean()
	})

	t.Run("docs", func(t *testing.T) {
		b := newBrowser(t, 1366, 768)
		for _, path := range []string{"/docs/", "/docs/quickstart", "/docs/reference"} {
			h := b.open(tg.url + path)
			if h.Get("Content-Security-Policy") == "" {
				t.Errorf("%s: no Content-Security-Policy", path)
			}
			if n := eval[int](b, `document.querySelectorAll('h1').length`); n != 1 {
				t.Errorf("%s: %d h1 elements, want 1", path, n)
			}
		}
		if got := eval[string](b, `document.querySelector('[data-origin]').textContent`); got != tg.url {
			t.Errorf("reference base URL origin = %q, want %q", got, tg.url)
		}
		b.checkClean()
	})
}

// realLiveProgram prints a hostile marker, reads the attached CSV, writes
// a PNG with nothing but the standard library and a report, then sleeps so
// the marker is on the page while the run is still going.
const realLiveProgram = `import struct, sys, time, zlib
print('<img src=x onerror=alert(1)>', flush=True)
rows = open('input.csv').read().splitlines()
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
raw = b''.join(b'\x00' + b'\xc8\x1e\x1e' * 4 for _ in range(3))
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 4, 3, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')
open('plot.png', 'wb').write(png)
open('report.txt', 'w').write('<img src=x onerror=alert(1)> is only text\n')
open('data.bin', 'wb').write(open('blob.bin', 'rb').read())
time.sleep(4)
print('second')
`

// testLiveOutputAndFiles: output shows while the run goes on (the fake
// holds its stream after the first chunk until the test has looked; the
// real program sleeps), attached files reach the program, a returned PNG
// shows inline from a blob: URL, other files are download links, and
// hostile output and file content stay text.
func testLiveOutputAndFiles(t *testing.T, tg target) {
	dir := t.TempDir()
	csv := "a,b\n1,2\n3,4\n"
	bin := []byte{0, 0xff, 0x10, 0x80}
	for name, content := range map[string][]byte{"input.csv": []byte(csv), "blob.bin": bin} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, 1366, 768)
	b.open(tg.url + "/")
	b.typeKey(tg.key)
	b.setLanguage("python")
	code := realLiveProgram
	release := func() {}
	if tg.fake != nil {
		code = streamProgram
		release = tg.fake.hold()
		defer release()
	}
	b.setCode(code)
	b.do(
		chromedp.SetUploadFiles(chromedp.ID("files"), []string{filepath.Join(dir, "input.csv"), filepath.Join(dir, "blob.bin")}),
		chromedp.SendKeys(chromedp.ID("return-files"), "*.png report.txt, data.bin"),
		// An alert that ran would say so.
		chromedp.Evaluate[chromedp.Void](`window.alert = () => { window.__xss = 'alert'; }`),
	)
	if got := eval[string](b, `document.getElementById('attached').textContent`); !strings.Contains(got, "input.csv") || !strings.Contains(got, "blob.bin") {
		t.Errorf("attached files shown as %q", got)
	}
	b.do(chromedp.Click(chromedp.ID("run")))
	const marker = "<img src=x onerror=alert(1)>"
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.getElementById('stdout').textContent.includes(`+jsString(marker)+`)`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the first output never appeared: %v (page shows %+v)", err, eval[view](b, readView))
	}
	// The first chunk is on the page and the run has not ended.
	type live struct {
		Status, Busy, Stdout, ExecutionID string
		Elements                          int
	}
	got := eval[live](b, `(() => ({Status: document.getElementById('status').textContent,
	  Busy: document.getElementById('run').getAttribute('aria-busy'), Stdout: document.getElementById('stdout').textContent,
	  ExecutionID: document.getElementById('execution-id').textContent,
	  Elements: document.getElementById('stdout').querySelectorAll('*').length}))()`)
	if got.Status != "running…" || got.Busy != "true" || strings.Contains(got.Stdout, "second") || got.Stdout != marker+"\n" {
		t.Errorf("while running: %+v; want the first line only, still running", got)
	}
	if !strings.HasPrefix(got.ExecutionID, "exe_") {
		t.Errorf("execution id while running = %q; want the started event's", got.ExecutionID)
	}
	if got.Elements != 0 {
		t.Errorf("live output became %d elements", got.Elements)
	}
	release()
	res := b.waitResult()
	if res.ErrorShown || res.Status != "succeeded" || res.Stdout != marker+"\nsecond\n" || res.StdoutElements != 0 {
		t.Fatalf("result: %+v", res)
	}
	if tg.fake != nil {
		want := map[string][]byte{"input.csv": []byte(csv), "blob.bin": bin}
		if diff := cmp.Diff(want, tg.fake.lastFiles()); diff != "" {
			t.Errorf("files the run got (-want +got):\n%s", diff)
		}
	}

	// Returned files: every one a download link to a blob: URL, the PNG
	// also shown as an image.
	type link struct{ Text, Download, Scheme string }
	links := eval[[]link](b, `Array.from(document.querySelectorAll('#returned-list a')).map((a) => ({Text: a.textContent, Download: a.download, Scheme: new URL(a.href).protocol}))`)
	wantLinks := []link{{"data.bin", "data.bin", "blob:"}, {"plot.png", "plot.png", "blob:"}, {"report.txt", "report.txt", "blob:"}}
	if diff := cmp.Diff(wantLinks, links); diff != "" {
		t.Errorf("returned file links (-want +got):\n%s", diff)
	}
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`(() => { const i = document.querySelectorAll('#returned-images img'); return i.length === 1 && i[0].complete; })()`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("no returned image: %v", err)
	}
	type img struct {
		Alt, Scheme   string
		Width, Height int
	}
	imgs := eval[[]img](b, `Array.from(document.querySelectorAll('#returned-images img')).map((i) => ({Alt: i.alt, Scheme: new URL(i.src).protocol, Width: i.naturalWidth, Height: i.naturalHeight}))`)
	if diff := cmp.Diff([]img{{"plot.png", "blob:", 4, 3}}, imgs); diff != "" {
		t.Errorf("inline images (-want +got):\n%s", diff)
	}
	if n := eval[int](b, `document.querySelectorAll('#returned img').length`); n != 1 {
		t.Errorf("%d images in the files panel; only the PNG may be one", n)
	}
	b.do(chromedp.Sleep(300 * time.Millisecond)) // give an injected handler every chance
	if flag := eval[string](b, `String(window.__xss)`); flag != "undefined" {
		t.Errorf("a payload ran: window.__xss = %s", flag)
	}
	b.checkClean()
}

func collapseReplacement(s string) string {
	for strings.Contains(s, "\ufffd\ufffd") {
		s = strings.ReplaceAll(s, "\ufffd\ufffd", "\ufffd")
	}
	return s
}

// fakeAPI answers like the API for the programs above. It is a unit-test
// seam for the page; the real server is tested in e2e_test.go. Asked for
// text/event-stream, it streams as docs/API.md describes (wire.md of issue
// 10): started, the output in several chunks, then the result.
type fakeAPI struct {
	// plainJSON makes it a server without streaming: it answers JSON
	// whatever the Accept header.
	plainJSON bool

	mu   sync.Mutex
	runs int
	// files are the files (decoded) of the last run.
	files map[string][]byte
	// gate, when set, holds a stream of streamProgram after its first
	// chunk until it is closed.
	gate chan struct{}
}

// streamProgram prints a hostile first line, waits for the test, then
// prints more and writes what return_files asks for.
const streamProgram = "print('<img src=x onerror=alert(1)>', flush=True)\nwait()\nprint('second')\n"

// hold makes the next stream of streamProgram wait; the returned func
// lets it go on.
func (f *fakeAPI) hold() func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
	g := f.gate
	return sync.OnceFunc(func() { close(g) })
}

func (f *fakeAPI) lastFiles() map[string][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files
}

// returnedPNG is the PNG the fake "program" writes.
func returnedPNG() []byte {
	img := image.NewRGBA(image.Rect(0, 0, 4, 3))
	for x := range 4 {
		img.Set(x, 1, color.RGBA{200, 30, 30, 255})
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img)
	return b.Bytes()
}

// leftFiles are what every fake run leaves in its working directory, for
// return_files to pick from.
var leftFiles = map[string][]byte{
	"plot.png":   returnedPNG(),
	"report.txt": []byte("<img src=x onerror=alert(1)> is only text\n"),
	"data.bin":   {0, 1, 2, 0xff},
}

const (
	fakeKey      = "kubo_sk_fake_valid_key_0123456789abcdef"
	fakeQuotaKey = "kubo_sk_fake_quota_used_0123456789abcdef"
)

func newID(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := newID("req_")
	w.Header().Set("X-Request-ID", reqID)
	fail := func(status int, code, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}, "request_id": reqID})
	}
	key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch key {
	case fakeKey:
	case fakeQuotaKey:
		if r.URL.Path == "/api/v1/executions" {
			w.Header().Set("Retry-After", "3725")
			fail(http.StatusTooManyRequests, "quota_exceeded", "daily quota of 100 executions reached")
			return
		}
	default:
		fail(http.StatusUnauthorized, "unauthorized", "missing, invalid or revoked API key")
		return
	}
	switch r.Method + " " + r.URL.Path {
	case "GET /api/v1/usage":
		_ = json.NewEncoder(w).Encode(map[string]any{
			"tenant": "local", "plan": "free",
			"today":  map[string]any{"executions": 3, "sandbox_seconds": 0.9},
			"limits": map[string]any{"executions_per_day": 100, "requests_per_minute": 60, "max_timeout_s": 30},
		})
	case "GET /api/v1/languages":
		_ = json.NewEncoder(w).Encode(map[string]any{"languages": []map[string]any{
			{"name": "python", "version": "3.11.2", "aliases": []string{"py"}},
			{"name": "javascript", "version": "22.23.5", "aliases": []string{"js", "node"}},
			{"name": "bash", "version": "5.2.15", "aliases": []string{"sh"}},
		}})
	case "POST /api/v1/executions":
		var req struct {
			Language string `json:"language"`
			Code     string `json:"code"`
			Files    []struct {
				Path, Content, Encoding string
			} `json:"files"`
			ReturnFiles []string `json:"return_files"`
		}
		if r.Header.Get("Content-Type") != "application/json" {
			fail(http.StatusBadRequest, "invalid_request", "Content-Type must be application/json")
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			fail(http.StatusBadRequest, "invalid_request", "malformed JSON")
			return
		}
		var match *program
		for i := range programs {
			if programs[i].language == req.Language && programs[i].code == req.Code {
				match = &programs[i]
			}
		}
		if req.Code == "for i in range(2):\n    print(i * 21)" {
			match = &program{rawStdout: "0\n21\n"}
		}
		if req.Code == streamProgram {
			match = &program{rawStdout: "<img src=x onerror=alert(1)>\nsecond\n"}
		}
		files := map[string][]byte{}
		for i, fl := range req.Files {
			content := []byte(fl.Content)
			if fl.Encoding == "base64" {
				var err error
				if content, err = base64.StdEncoding.DecodeString(fl.Content); err != nil {
					fail(http.StatusBadRequest, "invalid_request", fmt.Sprintf("files[%d].content: not base64", i))
					return
				}
			}
			files[fl.Path] = content
		}
		if match == nil {
			match = &program{rawStdout: "fake API: unknown program\n"}
		}
		f.mu.Lock()
		f.runs++
		f.files = files
		var gate chan struct{}
		if req.Code == streamProgram {
			gate, f.gate = f.gate, nil
		}
		f.mu.Unlock()
		status := "succeeded"
		if match.exitCode != 0 {
			status = "failed"
		}
		id := newID("exe_")
		// Written by hand so invalid UTF-8 reaches the browser as raw bytes,
		// worse than what the real server (which replaces it) sends.
		result := fmt.Sprintf(`{"id":%q,"status":%q,"stdout":"%s","stderr":"%s","exit_code":%d,"duration_ms":21,"truncated":false,"usage":{"sandbox_seconds":0.021},"request_id":%q,"files":%s,"files_truncated":false}`,
			id, status, rawJSONString(match.rawStdout), rawJSONString(match.rawStderr), match.exitCode, reqID, returned(req.ReturnFiles))
		if f.plainJSON || r.Header.Get("Accept") != "text/event-stream" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, result)
			return
		}
		f.stream(w, r, id, req.Language, match, gate, result)
	default:
		fail(http.StatusNotFound, "not_found", "no such route")
	}
}

// stream answers as POST /v1/executions does with Accept:
// text/event-stream: each line of output its own event (so the page sees
// several chunks), a heartbeat comment, CRLF line ends on some events as a
// proxy may send them, and a pause at the gate after the first chunk.
func (f *fakeAPI) stream(w http.ResponseWriter, r *http.Request, id, lang string, p *program, gate chan struct{}, result string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fmt.Fprintf(w, "id: 0-0\nevent: started\ndata: {\"id\":%q,\"language\":%q}\n\n: heartbeat\n\n", id, lang)
	fl.Flush()
	var nout, nerr int
	send := func(stream, text string) {
		if stream == "stdout" {
			nout += len(text)
		} else {
			nerr += len(text)
		}
		eol := "\n"
		if (nout+nerr)%2 == 0 {
			eol = "\r\n"
		}
		fmt.Fprintf(w, "id: %d-%d%sevent: %s%sdata: {\"text\":\"%s\"}%s%s", nout, nerr, eol, stream, eol, rawJSONString(text), eol, eol)
		fl.Flush()
	}
	for i, line := range strings.SplitAfter(p.rawStdout, "\n") {
		if line == "" {
			continue
		}
		send("stdout", line)
		if i == 0 && gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
	}
	for _, line := range strings.SplitAfter(p.rawStderr, "\n") {
		if line != "" {
			send("stderr", line)
		}
	}
	fmt.Fprintf(w, "id: end\nevent: result\ndata: %s\n\n", result)
	fl.Flush()
}

// returned is the "files" of a result: those of leftFiles that globs match.
func returned(globs []string) string {
	type file struct {
		Path     string `json:"path"`
		Size     int    `json:"size"`
		Encoding string `json:"encoding"`
		Content  string `json:"content"`
	}
	out := []file{}
	for _, name := range []string{"data.bin", "plot.png", "report.txt"} {
		for _, g := range globs {
			if ok, _ := path.Match(g, name); ok {
				out = append(out, file{name, len(leftFiles[name]), "base64", base64.StdEncoding.EncodeToString(leftFiles[name])})
				break
			}
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// rawJSONString escapes s for a JSON string but leaves invalid UTF-8 bytes
// as they are.
func rawJSONString(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20:
			fmt.Fprintf(&b, `\u%04x`, c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// testOpenAPIDoc is the API's own document, so the reference page tested
// here is the one the server shows.
func testOpenAPIDoc(t *testing.T) []byte {
	t.Helper()
	doc, err := api.OpenAPIDocument("test", "/api")
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestPlaygroundWithoutStreaming: a server that answers JSON to a request
// for an event stream (one without streaming) still gets its result and
// files shown.
func TestPlaygroundWithoutStreaming(t *testing.T) {
	requireE2E(t)
	mux := http.NewServeMux()
	mux.Handle("/api/", &fakeAPI{plainJSON: true})
	mux.Handle("/", web.Handler(web.Options{OpenAPI: testOpenAPIDoc(t), Version: "test"}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	b := newBrowser(t, 1366, 768)
	b.open(srv.URL + "/")
	b.typeKey(fakeKey)
	b.setLanguage("javascript")
	b.setCode(programs[1].code)
	b.do(chromedp.SendKeys(chromedp.ID("return-files"), "*.png"))
	got := b.clickRun()
	if got.Status != "succeeded" || got.Stdout != programs[1].stdout || got.Stderr != programs[1].stderr {
		t.Errorf("result: %+v", got)
	}
	if n := eval[int](b, `document.querySelectorAll('#returned-images img').length`); n != 1 {
		t.Errorf("%d returned images, want the PNG", n)
	}
	b.checkClean()
}

func TestPlaygroundWithFakeAPI(t *testing.T) {
	requireE2E(t)
	mux := http.NewServeMux()
	fake := &fakeAPI{}
	mux.Handle("/api/", fake)
	mux.Handle("/", web.Handler(web.Options{OpenAPI: testOpenAPIDoc(t), Version: "test"}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	runPlaygroundSuite(t, target{url: srv.URL, key: fakeKey, quotaKey: fakeQuotaKey, fake: fake})
}

// TestScreenshots renders the pages at a laptop's and a phone's size, after
// a run and after a refused key, and checks what a person would look for:
// each screenshot is a PNG of the viewport's size (the full-page ones as
// wide as the viewport) that is not blank, the elements that matter are
// visible in it, and no page scrolls sideways. VERTAL_SCREENSHOTS names a
// directory to keep the images in (default: a temporary one).
func TestScreenshots(t *testing.T) {
	requireE2E(t)
	mux := http.NewServeMux()
	mux.Handle("/api/", &fakeAPI{})
	mux.Handle("/", web.Handler(web.Options{OpenAPI: testOpenAPIDoc(t), Version: "0.2.0"}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dir := os.Getenv("VERTAL_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	takeScreenshots(t, dir, srv.URL, fakeKey)
}

// visibleJS reports which of the selectors match no element that is
// rendered with a size and, unless whole is set, inside the viewport.
const visibleJS = `((sels, whole) => sels.filter((sel) => {
  const el = document.querySelector(sel);
  if (!el || el.closest('[hidden]')) return true;
  const r = el.getBoundingClientRect(), st = getComputedStyle(el);
  if (r.width < 1 || r.height < 1 || st.visibility === 'hidden' || st.display === 'none' || Number(st.opacity) === 0) return true;
  return !whole && (r.bottom <= 0 || r.right <= 0 || r.top >= innerHeight || r.left >= innerWidth);
}))`

// screenSizes are the windows the screenshots are taken in.
var screenSizes = []struct {
	name string
	w, h int64
}{{"laptop", 1366, 768}, {"phone", 390, 844}}

func takeScreenshots(t *testing.T, dir, url, key string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, size := range screenSizes {
		b := newBrowser(t, size.w, size.h)
		save := func(name string, full bool, visible ...string) {
			t.Helper()
			saveShot(t, b, filepath.Join(dir, size.name+"-"+name+".png"), int(size.w), int(size.h), full, visible...)
		}
		b.open(url + "/")
		b.typeKey(key)
		b.setLanguage("python")
		b.setCode(programs[3].code) // hostile output, to see it shown as text
		if v := b.clickRun(); v.Status != statusOf(programs[3]) || v.Stdout != programs[3].stdout {
			t.Errorf("%s: run shows %q with stdout %q", size.name, v.Status, v.Stdout)
		}
		save("playground", false, ".site-header", "#key", "#language", "#run", "#code")
		b.do(chromedp.ScrollIntoView(chromedp.ID("stdout")))
		save("playground-result", false, "#status", "#stdout", "#exit-code")
		save("playground-full", true, ".site-header", "#run", "#code", "#status", "#stdout", ".snippets")
		b.open(url + "/")
		b.typeKey("kubo_sk_wrong")
		if v := b.clickRun(); !v.ErrorShown || v.ErrorCode != "unauthorized" {
			t.Errorf("%s: wrong key shows error %v %q", size.name, v.ErrorShown, v.ErrorCode)
		}
		b.do(chromedp.ScrollIntoView(chromedp.ID("error")))
		save("playground-401", false, "#error", "#error-code", "#error-message")
		checkLayout(t, b, url, size.name)
		for _, p := range []string{"docs/", "docs/quickstart", "docs/clients", "docs/architecture", "docs/reference"} {
			b.open(url + "/" + p)
			save(strings.ReplaceAll(strings.TrimSuffix(p, "/"), "/", "-"), false, ".site-header", "main h1")
		}
		// The reference is taller than one full-page capture can be (its
		// 17 sandbox operations took it past Chrome's limit): its top part
		// is shot above, and its headings must all be laid out.
		if n := eval[int](b, `document.querySelectorAll("main h2").length`); n < 30 {
			t.Errorf("%s: the reference shows %d operations", size.name, n)
		}
		b.checkClean()
	}
}

// saveShot writes a screenshot (the viewport, or the whole page if full)
// and checks it: its size, that it shows something, that the selectors
// are visible and that nothing scrolls sideways.
func saveShot(t *testing.T, b *browser, path string, w, h int, full bool, visible ...string) {
	t.Helper()
	var shot []byte
	var err error
	if full {
		shot, err = chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	} else {
		shot, err = chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	}
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
	checkScreenshot(t, path, shot, w, h, full)
	if visible == nil {
		visible = []string{}
	}
	if hidden := eval[[]string](b, fmt.Sprintf("%s(%s, %v)", visibleJS, mustJSON(t, visible), full)); len(hidden) > 0 {
		t.Errorf("%s: not visible: %q", path, hidden)
	}
	if over := eval[int](b, `document.documentElement.scrollWidth - document.documentElement.clientWidth`); over > 0 {
		t.Errorf("%s: the page scrolls sideways by %d px", path, over)
	}
}

// brokenWordsJS lists the words of the elements' text that the layout
// breaks across lines (a word whose box is more than one line).
const brokenWordsJS = `((sels) => sels.flatMap((sel) => {
  const el = document.querySelector(sel), out = [];
  if (!el) return [sel + ': missing'];
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    for (const m of n.data.matchAll(/\S+/g)) {
      const r = document.createRange();
      r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
      const tops = new Set([...r.getClientRects()].filter((b) => b.width > 0).map((b) => Math.round(b.top)));
      if (tops.size > 1) out.push(sel + ': ' + m[0]);
    }
  }
  return out;
}))`

// checkLayout checks what screenshots of the playground showed wrong once:
// hints broken mid-word, the Run button jumping to another row while a run
// is under way, and the no-key message out of sight.
func checkLayout(t *testing.T, b *browser, url, size string) {
	t.Helper()
	b.open(url + "/")
	if broken := eval[[]string](b, brokenWordsJS+`(["#attached", "#editor-hint", ".pg-title"])`); len(broken) > 0 {
		t.Errorf("%s: words broken across lines: %q", size, broken)
	}
	// The run button's box, idle and busy (as setRunning leaves it).
	box := `(() => { const r = document.getElementById('run').getBoundingClientRect();
	  return [Math.round(r.top), Math.round(r.left), Math.round(r.width), Math.round(document.querySelector('.toolbar').getBoundingClientRect().height)]; })()`
	idle := eval[[]int](b, box)
	busy := eval[[]int](b, `(() => { const run = document.getElementById('run'); run.setAttribute('aria-busy', 'true'); run.disabled = true;
	  const r = `+box+`; run.setAttribute('aria-busy', 'false'); run.disabled = false; return r; })()`)
	if fmt.Sprint(idle) != fmt.Sprint(busy) {
		t.Errorf("%s: the Run button moves when a run starts: [top left width toolbar-height] %v idle, %v busy", size, idle, busy)
	}
	// Run with no key: the message is where the focus goes, in sight.
	_ = eval[bool](b, `(() => { localStorage.clear(); sessionStorage.clear(); return true; })()`)
	b.open(url + "/")
	b.do(chromedp.Click(chromedp.ID("run")))
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.getElementById('error').hidden === false`, chromedp.WithPollingTimeout(5*time.Second))); err != nil {
		t.Fatalf("%s: no error after Run without a key: %v", size, err)
	}
	inView := `(() => { for (const el of document.querySelectorAll('#key-status, #error')) {
	  const r = el.getBoundingClientRect();
	  if (el.textContent.includes('Paste an API key') && r.height > 0 && r.top >= 0 && r.bottom <= innerHeight) return true; }
	  return false; })()`
	if !eval[bool](b, inView) {
		t.Errorf("%s: after Run without a key, the message is not in the window", size)
	}
}

// checkScreenshot decodes a screenshot and checks its size and that it
// shows something: a blank or one-colour image means the page did not
// render.
func checkScreenshot(t *testing.T, path string, shot []byte, w, h int, full bool) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Errorf("%s: not a PNG: %v", path, err)
		return
	}
	got := img.Bounds().Size()
	switch {
	case !full && (got.X != w || got.Y != h):
		t.Errorf("%s: %dx%d, want the viewport's %dx%d", path, got.X, got.Y, w, h)
	case full && (got.X != w || got.Y < h):
		t.Errorf("%s: %dx%d, want %d wide and at least %d high", path, got.X, got.Y, w, h)
	}
	colours := map[[4]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += max(1, got.Y/64) {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += max(1, got.X/64) {
			r, g, b, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, b, a}] = true
		}
	}
	if len(colours) < 8 {
		t.Errorf("%s: only %d colours; the page looks blank", path, len(colours))
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
