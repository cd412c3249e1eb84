package web_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// smtpSink is a real SMTP server, Debian's aiosmtpd, printing every
// message it gets; links reads the links out of them.
type smtpSink struct {
	addr string
	mu   sync.Mutex
	out  strings.Builder
}

func startSMTPSink(t *testing.T) *smtpSink {
	t.Helper()
	port := e2etest.FreePort(t)
	s := &smtpSink{addr: fmt.Sprintf("127.0.0.1:%d", port)}
	cmd := exec.Command("/usr/bin/python3", "-u", "-m", "aiosmtpd", "-n", "-l", s.addr, "-c", "aiosmtpd.handlers.Debugging")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting aiosmtpd (apt-get install python3-aiosmtpd): %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.mu.Lock()
			s.out.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
	}()
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", s.addr); err == nil {
			c.Close()
			return s
		}
		if i == 100 {
			t.Fatalf("aiosmtpd is not listening on %s", s.addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// link waits for a mail to hold a link matching re.
func (s *smtpSink) link(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	for range 100 {
		s.mu.Lock()
		m := re.FindString(s.out.String())
		s.mu.Unlock()
		if m != "" {
			return m
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no mail with %s reached the SMTP sink; it got:\n%s", re, s.out.String())
	return ""
}

// buildVertal builds the vertal binary for a test that runs it.
// requireServerE2E is requireE2E for a test of a real `vertal serve`,
// whose oci driver needs root.
func requireServerE2E(t *testing.T) {
	t.Helper()
	requireE2E(t)
	if os.Geteuid() != 0 {
		t.Fatal("the oci driver needs root")
	}
}

func buildVertal(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vertal")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/kuboprotocol/vertal2kubo/cmd/vertal").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// serveArgs are `vertal serve` on 127.0.0.1:port with the test image
// (VERTAL_ROOTFS, as scripts/test.sh sets it), then more.
func serveArgs(port int, more ...string) []string {
	args := []string{"serve", "--host", "127.0.0.1", "--port", fmt.Sprint(port)}
	if rootfs := os.Getenv("VERTAL_ROOTFS"); rootfs != "" {
		args = append(args, "--image-dir", filepath.Dir(rootfs))
	}
	return append(args, more...)
}

// signIn opens the sign-in page at url and sends the form; the caller
// waits for what should follow.
func (b *browser) signIn(url, email, password string) {
	b.t.Helper()
	b.do(
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.ID("signin")),
		chromedp.SendKeys(chromedp.ID("email"), email),
		chromedp.SendKeys(chromedp.ID("password"), password),
		chromedp.Click(chromedp.ID("signin")),
	)
}

const xssName = `<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>`

// TestAccountFlowWithRealServer is the account flow in Chromium
// against `vertal serve` with the real sandbox and a real SMTP sink:
// accept an invite, verify the email from the mail, sign in at /entrar,
// create a key, run the curl snippet verbatim (42), reload (the key is
// gone from the page), fill up to 5 keys (the 6th is refused), revoke
// (the old key gets 401), and a cross-origin form that is refused.
func TestAccountFlowWithRealServer(t *testing.T) {
	requireServerE2E(t)
	dir := t.TempDir()
	bin := buildVertal(t)
	sink := startSMTPSink(t)
	port := e2etest.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	common := []string{"--data-dir", filepath.Join(dir, "data"), "--public-url", base, "--signup", "invite"}
	args := append(serveArgs(port, "--smtp-url", "smtp://"+sink.addr+"?from=noreply@vertal.test"), common...)
	srv := launchServer(t, bin, args, false)
	defer func() {
		if t.Failed() {
			t.Logf("server log:\n%s", srv.log())
		}
	}()

	out, err := exec.Command(bin, append([]string{"invite", "ann@example.com", "--plan", "pro"}, common...)...).Output()
	if err != nil {
		t.Fatalf("vertal invite: %v", err)
	}
	invite := strings.TrimSpace(string(out))
	if !strings.HasPrefix(invite, base+"/signup?invite=") {
		t.Fatalf("vertal invite printed %q", invite)
	}

	b := newBrowser(t, 1366, 768)
	b.do(
		chromedp.Navigate(invite),
		chromedp.WaitVisible(chromedp.ID("create")),
		chromedp.SendKeys(chromedp.ID("name"), xssName),
		chromedp.SendKeys(chromedp.ID("password"), "a long enough password"),
		chromedp.Click(chromedp.ID("create")),
		chromedp.WaitVisible(chromedp.ID("form-notice")),
	)
	verify := sink.link(t, regexp.MustCompile(regexp.QuoteMeta(base)+`/verify\?token=[0-9a-f]{64}`))
	b.do(chromedp.Navigate(verify), chromedp.WaitVisible(chromedp.ID("form-notice")))
	if got := eval[string](b, `document.getElementById('form-notice').textContent`); !strings.Contains(got, "verified") {
		t.Fatalf("verification page says %q", got)
	}

	// /entrar is the docs' name of the sign-in page.
	b.signIn(base+"/entrar", "ann@example.com", "a long enough password")
	b.do(chromedp.WaitVisible(chromedp.ID("create-key")))
	if got := eval[string](b, `document.getElementById('account-name').textContent`); got != xssName {
		t.Errorf("account name shown as %q, want the payload as text", got)
	}
	if got := eval[string](b, `document.getElementById('plan-name').textContent`); got != "pro" {
		t.Errorf("plan shown as %q, want pro (from the invite)", got)
	}

	createKey := func() string {
		t.Helper()
		b.do(chromedp.Click(chromedp.ID("create-key")))
		if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`!document.getElementById('newkey').hidden || !document.getElementById('key-error').hidden`,
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("waiting for the new key: %v", err)
		}
		return eval[string](b, `document.getElementById('key-error').hidden ? document.getElementById('newkey-secret').textContent : ''`)
	}
	first := createKey()
	if !strings.HasPrefix(first, "kubo_sk_") {
		t.Fatalf("new key = %q", first)
	}
	if got := eval[string](b, `document.getElementById('newkey').textContent`); !strings.Contains(got, "you will not see it again") {
		t.Errorf("the new key's box says %q", got)
	}
	curl := eval[string](b, `document.getElementById('snippet-curl').textContent`)
	if !strings.Contains(curl, first) || !strings.Contains(curl, base+"/api/v1/executions") {
		t.Fatalf("curl snippet lacks the key or the base URL:\n%s", curl)
	}
	for _, id := range []string{"python", "go", "claude-desktop", "claude-stdio", "claude-http"} {
		if s := eval[string](b, `document.getElementById('snippet-`+id+`').textContent`); !strings.Contains(s, first) || !strings.Contains(s, base+"/api") {
			t.Errorf("%s snippet lacks the key or the base URL:\n%s", id, s)
		}
	}
	// The copy button copies that very text.
	b.do(chromedp.Click(chromedp.CSS(`button[data-copy="snippet-curl"]`)))
	runOut, err := exec.Command("sh", "-c", curl).CombinedOutput()
	if err != nil || !strings.Contains(string(runOut), `"stdout":"42\n"`) {
		t.Fatalf("the curl snippet, run verbatim: %v\n%s", err, runOut)
	}

	b.do(chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(chromedp.ID("create-key")))
	if src := eval[string](b, `document.documentElement.outerHTML`); strings.Contains(src, first) {
		t.Errorf("after a reload the page still holds the key")
	}
	if src := fetchSource(t, b); strings.Contains(src, first) {
		t.Errorf("after a reload the page source still holds the key")
	}
	if got := eval[string](b, `document.getElementById('snippet-curl').textContent`); !strings.Contains(got, "kubo_sk_YOUR_KEY") {
		t.Errorf("after a reload the curl snippet is not back to the placeholder:\n%s", got)
	}
	for range 4 {
		if k := createKey(); k == "" {
			t.Fatalf("keys 2-5: refused: %s", eval[string](b, `document.getElementById('key-error').textContent`))
		}
	}
	if got := eval[string](b, `document.getElementById('active-keys').textContent`); got != "5" {
		t.Errorf("after creating 5 keys the heading says %s of 5 active", got)
	}
	if k := createKey(); k != "" {
		t.Errorf("a 6th key was made")
	}
	if msg := eval[string](b, `document.getElementById('key-error').textContent`); !strings.Contains(msg, "5 active keys") {
		t.Errorf("6th key refused with %q, want a clear message", msg)
	}

	// A cross-origin page (localhost is another site than 127.0.0.1)
	// posting the create-key form is refused.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<form id=f method=post action="%s/dashboard/keys"><input name=csrf value=guess></form><script>document.getElementById('f').submit()</script>`, base)
	}))
	defer evil.Close()
	b.do(chromedp.Navigate(strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)))
	time.Sleep(time.Second)
	if src := eval[string](b, `document.body ? document.body.innerText : ''`); strings.Contains(src, "kubo_sk_") {
		t.Errorf("the cross-origin form got a key:\n%s", src)
	}

	// Revoke the first key, with confirmation.
	b.do(chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(chromedp.ID("create-key")))
	id := eval[string](b, `document.querySelector('#keys tbody tr').dataset.key`)
	if n := eval[int](b, `document.querySelectorAll('#keys tbody tr[data-key]').length`); n != 5 {
		t.Errorf("%d keys listed after the cross-origin attempt, want 5", n)
	}
	b.do(chromedp.Click(chromedp.ID("revoke-"+id)), chromedp.WaitVisible(chromedp.ID("confirm-revoke")),
		chromedp.Click(chromedp.ID("confirm-revoke")), chromedp.WaitVisible(chromedp.ID("create-key")))
	req, _ := http.NewRequest("GET", base+"/api/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+first)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("revoked key: %d, want 401", resp.StatusCode)
	}
	// The playground, signed in, runs without a key and counts to the
	// account's tenant.
	b.open(base + "/")
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.getElementById('key-status').textContent.startsWith('Signed in as')`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the playground does not see the session: %v", err)
	}
	b.setLanguage("python")
	b.setCode("print(6 * 7)")
	if v := b.clickRun(); v.Stdout != "42\n" || v.Status != "succeeded" {
		t.Errorf("signed-in playground run: %+v", v)
	}
	b.do(chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(chromedp.ID("create-key")))
	if got := eval[string](b, `document.getElementById('today-executions').textContent`); got != "2" {
		t.Errorf("today's executions on the dashboard = %s, want 2 (the curl snippet and the playground)", got)
	}
	if got := eval[bool](b, `window.__xss === undefined`); !got {
		t.Errorf("the XSS payload ran")
	}
	b.checkClean()

	if dir := os.Getenv("VERTAL_SCREENSHOTS"); dir != "" {
		shootAccount(t, filepath.Join(dir, "accounts"), base)
	}
}

// fetchSource is the page's source as the server sent it.
func fetchSource(t *testing.T, b *browser) string {
	t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`fetch('/dashboard', {credentials: 'same-origin'}).then(r => r.text())`,
		func(p *runtime.EvaluateParams) { await := true; p.AwaitPromise = &await }))
	if err != nil {
		t.Fatalf("fetching the page source: %v", err)
	}
	return v
}

// shootAccount signs in at each size and saves the dashboard and the
// sign-in page.
func shootAccount(t *testing.T, dir, base string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, size := range screenSizes {
		b := newBrowser(t, size.w, size.h)
		save := func(name string) {
			shot, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, size.name+"-"+name+".png")
			if err := os.WriteFile(path, shot, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", path)
			if over := eval[int](b, `document.documentElement.scrollWidth - document.documentElement.clientWidth`); over > 0 {
				t.Errorf("%s: %d px wider than the window", path, over)
			}
		}
		b.do(chromedp.Navigate(base+"/login"), chromedp.WaitVisible(chromedp.ID("signin")))
		save("login")
		b.signIn(base+"/login", "ann@example.com", "a long enough password")
		b.do(chromedp.WaitVisible(chromedp.ID("create-key")))
		save("dashboard")
	}
}

// TestMailedLinksIgnoreForgedHost is the reset-poisoning attack against
// `vertal serve` with a real SMTP sink: sign-up and reset forms sent with
// `Host: attacker.example` get mail whose links are on --public-url, and
// serve refuses to start with --smtp-url but no --public-url.
func TestMailedLinksIgnoreForgedHost(t *testing.T) {
	requireServerE2E(t)
	dir := t.TempDir()
	bin := buildVertal(t)
	sink := startSMTPSink(t)
	smtp := "smtp://" + sink.addr + "?from=noreply@vertal.test"

	// Today's main starts and serves: the timeout ends it, and the test fails.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, serveArgs(e2etest.FreePort(t), "--data-dir", filepath.Join(dir, "refused"), "--smtp-url", smtp)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "smtp-url needs public-url") {
		t.Fatalf("serve with --smtp-url and no --public-url: %v, want a refusal naming public-url:\n%s", err, out)
	}

	port := e2etest.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := launchServer(t, bin, serveArgs(port, "--data-dir", filepath.Join(dir, "data"), "--public-url", base,
		"--signup", "open", "--smtp-url", smtp), false)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path string, form url.Values) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(form.Encode()))
		req.Host = "attacker.example"
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 400 {
			t.Fatalf("POST %s with a forged Host: %d\n%s", path, resp.StatusCode, srv.log())
		}
	}
	post("/signup", url.Values{"email": {"victim@example.com"}, "password": {"a long enough password"}})
	post("/reset", url.Values{"email": {"victim@example.com"}})
	for _, page := range []string{"verify", "reset"} {
		link := sink.link(t, regexp.MustCompile(`https?://\S+/`+page+`\?token=[0-9a-f]{64}`))
		if !strings.HasPrefix(link, base+"/"+page+"?token=") {
			t.Errorf("the %s mail links to %s, want it on %s", page, link, base)
		}
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if strings.Contains(sink.out.String(), "attacker.example") {
		t.Errorf("a mail names the forged Host:\n%s", sink.out.String())
	}
}
