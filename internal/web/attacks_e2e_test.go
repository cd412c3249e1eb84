package web_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres/pgtest"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// The attacks on the account pages, each in Chromium against a
// real server: a planted session id (TestSessionFixationInBrowser), a
// brute force of the sign-in form (TestSignInBruteForceInBrowser), and a
// tenant disabled on one node of a PostgreSQL pair
// (TestDisabledTenantOnPostgresPairInBrowser). The HTTP-level versions in
// internal/api check the same rules without a browser.

const testPassword = "a long enough password"

// cookie is the browser's cookie name for base ("" if it has none).
func (b *browser) cookie(base, name string) string {
	b.t.Helper()
	res, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/"}})
	if err != nil {
		b.t.Fatalf("reading the browser's cookies: %v", err)
	}
	for _, c := range res.Cookies {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

// signUp sends the open sign-up form at base.
func (b *browser) signUp(base, email, name string) {
	b.t.Helper()
	b.do(
		chromedp.Navigate(base+"/signup"),
		chromedp.WaitVisible(chromedp.ID("create")),
		chromedp.SendKeys(chromedp.ID("email"), email),
		chromedp.SendKeys(chromedp.ID("name"), name),
		chromedp.SendKeys(chromedp.ID("password"), testPassword),
		chromedp.Click(chromedp.ID("create")),
		chromedp.WaitVisible(chromedp.ID("form-notice")),
	)
}

// serveOpen starts `vertal serve --signup open` (the real sandbox, no
// warm pool) with its own data directory, then more flags, and returns
// its base URL; the server's log is shown if the test fails.
func serveOpen(t *testing.T, bin string, more ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the oci driver needs root")
	}
	port := e2etest.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := launchServer(t, bin, serveArgs(port, append([]string{"--data-dir", t.TempDir(), "--public-url", base,
		"--signup", "open", "--pool-max", "0"}, more...)...), false)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log of %s:\n%s", base, srv.log())
		}
	})
	return base
}

// dashboardStatus is what GET /dashboard answers a client that sends only
// cookie as the session (no redirects followed).
func dashboardStatus(t *testing.T, base, cookie string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/dashboard", nil)
	req.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: cookie})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSessionFixationInBrowser: anonymous visits get no session id to
// steal; an id planted in the browser before sign-in (as a sibling site
// or a network attacker could set it, HttpOnly included) is replaced at
// sign-in through the real form, and gives no access afterwards.
func TestSessionFixationInBrowser(t *testing.T) {
	requireE2E(t)
	base := serveOpen(t, buildVertal(t))

	b := newBrowser(t, 1366, 768)
	b.signUp(base, "ann@example.com", "Ann")
	for _, path := range []string{"/", "/login", "/signup", "/dashboard"} {
		b.do(chromedp.Navigate(base + path))
		if v := b.cookie(base, api.SessionCookie); v != "" {
			t.Fatalf("an anonymous visit to %s got a session cookie %q", path, v)
		}
	}

	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	planted := hex.EncodeToString(raw) // the shape of a real id
	httpOnly := true
	if _, err := chromedp.Call(b.ctx, network.SetCookie, network.SetCookieParams{Name: api.SessionCookie, Value: planted,
		URL: base + "/", Path: "/", HTTPOnly: &httpOnly, SameSite: network.CookieSameSiteLax}); err != nil {
		t.Fatalf("planting the cookie: %v", err)
	}
	if got := b.cookie(base, api.SessionCookie); got != planted {
		t.Fatalf("the planted cookie is %q in the browser, want %q", got, planted)
	}
	b.signIn(base+"/login", "ann@example.com", testPassword)
	b.do(chromedp.WaitVisible(chromedp.ID("create-key")))
	got := b.cookie(base, api.SessionCookie)
	if got == planted || len(got) != 64 {
		t.Fatalf("the session cookie after sign-in is %q, want a new id (planted %q)", got, planted)
	}
	if s := dashboardStatus(t, base, planted); s != http.StatusSeeOther {
		t.Errorf("the dashboard with the planted id after the victim's sign-in: %d, want 303 to /login", s)
	}
	if s := dashboardStatus(t, base, got); s != http.StatusOK {
		t.Errorf("the dashboard with the browser's own new id: %d, want 200 (the check above must be able to pass)", s)
	}
	b.checkClean()
}

// checkOperatorOnPhone signs in as the operator on a phone-sized window and
// checks that every control of the tenant table is inside the window, with
// nothing to scroll sideways to, and saves a screenshot under
// VERTAL_SCREENSHOTS.
func checkOperatorOnPhone(t *testing.T, base, email string) {
	t.Helper()
	b := newBrowser(t, 390, 844)
	b.signIn(base+"/login", email, testPassword)
	b.do(chromedp.WaitVisible(chromedp.ID("create-key")), chromedp.Navigate(base+"/operator"), chromedp.WaitVisible(chromedp.CSS(`table.keys`)))
	clipped := eval[[]string](b, `[...document.querySelectorAll('table.keys button, table.keys select')].filter((el) => {
	  const r = el.getBoundingClientRect(); return r.width < 1 || r.left < 0 || r.right > document.documentElement.clientWidth;
	}).map((el) => el.id || el.textContent.trim())`)
	if len(clipped) > 0 {
		t.Errorf("operator page at 390 px: controls outside the window: %q", clipped)
	}
	if over := eval[int](b, `Math.max(...[...document.querySelectorAll('.table-wrap')].map((w) => w.scrollWidth - w.clientWidth), 0)`); over > 0 {
		t.Errorf("operator page at 390 px: the tenant table scrolls sideways by %d px", over)
	}
	if dir := os.Getenv("VERTAL_SCREENSHOTS"); dir != "" {
		shot, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "accounts", "phone-operator.png")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			_ = os.WriteFile(path, shot, 0o644)
		}
	}
	b.checkClean()
}

// shootError checks that the page's error is shown styled and fits the
// window, and saves a screenshot as name under VERTAL_SCREENSHOTS.
func (b *browser) shootError(name string) {
	t := b.t
	t.Helper()
	if bg := eval[string](b, `getComputedStyle(document.getElementById('form-error')).backgroundColor`); bg == "rgba(0, 0, 0, 0)" {
		t.Errorf("%s: the error has no style (the stylesheet did not load?)", name)
	}
	if over := eval[int](b, `document.documentElement.scrollWidth - document.documentElement.clientWidth`); over > 0 {
		t.Errorf("%s: %d px wider than the window", name, over)
	}
	dir := os.Getenv("VERTAL_SCREENSHOTS")
	if dir == "" {
		return
	}
	shot, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "accounts", name+".png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}

// TestSignupLimitInBrowser: `vertal serve --signup open` takes
// account.MaxSignupsPerIP sign-up forms from one address per window; the
// next one gets the limit's message on the form, on a phone-sized page,
// and makes no account.
func TestSignupLimitInBrowser(t *testing.T) {
	requireE2E(t)
	base := serveOpen(t, buildVertal(t))
	b := newBrowser(t, 390, 844)
	for i := range account.MaxSignupsPerIP {
		b.signUp(base, fmt.Sprintf("user%d@example.com", i), "User")
	}
	b.do(
		chromedp.Navigate(base+"/signup"),
		chromedp.WaitVisible(chromedp.ID("create")),
		chromedp.SendKeys(chromedp.ID("email"), "late@example.com"),
		chromedp.SendKeys(chromedp.ID("password"), testPassword),
		chromedp.Click(chromedp.ID("create")),
		chromedp.WaitVisible(chromedp.ID("form-error")),
	)
	if msg := eval[string](b, `document.getElementById('form-error').textContent`); msg != account.ErrSignupThrottled.Error() {
		t.Errorf("sign-up %d from one address: %q, want %q", account.MaxSignupsPerIP+1, msg, account.ErrSignupThrottled)
	}
	b.shootError("phone-signup-throttled")
	b.signIn(base+"/login", "late@example.com", testPassword)
	b.do(chromedp.WaitVisible(chromedp.ID("form-error")))
	if msg := eval[string](b, `document.getElementById('form-error').textContent`); msg != account.ErrSignInFailed.Error() {
		t.Errorf("signing in as the refused sign-up: %q, want %q (no account)", msg, account.ErrSignInFailed)
	}
	b.checkClean()
}

// noSandbox is the driver of a server that runs nothing in its test.
type noSandbox struct{}

func (noSandbox) Run(context.Context, engine.Spec) (engine.Result, error) {
	return engine.Result{}, fmt.Errorf("this test runs no code")
}
func (noSandbox) Reap(context.Context) (int, error) { return 0, nil }
func (noSandbox) Name() string                      { return "none" }

// startAccountServer is the API with its account pages and assets on a
// SQLite store, in this process so that the account service's clock is the test's.
func startAccountServer(t *testing.T, now func() time.Time) (string, *account.Service) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "vertal.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	acc, err := account.New(account.Options{Store: st, Signup: account.SignupOpen, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := execution.New(execution.Options{Store: st, Engine: enginetest.New(t, noSandbox{}, engine.Options{MaxConcurrent: 1, MaxQueue: 4, QueueTimeout: time.Second}),
		Render: api.RenderExecution})
	if err != nil {
		t.Fatal(err)
	}
	s, err := api.New(api.Options{Service: svc, Store: st,
		Accounts: acc, Pages: web.NewPages(web.Options{}), Web: web.Handler(web.Options{OpenAPI: testOpenAPIDoc(t), APIBase: "/api"})})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return hs.URL, acc
}

// TestSignInBruteForceInBrowser drives the sign-in form with wrong
// passwords: after account.MaxTriesPerEmail of them the page answers with
// the throttle's message, and an unknown email gets the same answers at
// every step. While throttled even the right password is refused; once
// the window has passed (the service's clock is moved on, no sleeping)
// it signs in. Phone-sized, the throttled page is the screenshot.
func TestSignInBruteForceInBrowser(t *testing.T) {
	requireE2E(t)
	var skew atomic.Int64 // how far the service's clock is ahead of the real one
	base, acc := startAccountServer(t, func() time.Time { return time.Now().Add(time.Duration(skew.Load())) })
	if _, err := acc.SignUp(t.Context(), account.SignUp{Email: "ann@example.com", Password: testPassword}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, 390, 844)
	answer := func(email, password string) string {
		t.Helper()
		b.signIn(base+"/login", email, password)
		b.do(chromedp.WaitVisible(chromedp.ID("form-error")))
		return eval[string](b, `document.getElementById('form-error').textContent`)
	}
	for i := range account.MaxTriesPerEmail + 1 {
		want := account.ErrSignInFailed.Error()
		if i == account.MaxTriesPerEmail {
			want = account.ErrThrottled.Error()
		}
		guess := fmt.Sprintf("wrong guess %02d", i)
		if wrong, unknown := answer("ann@example.com", guess), answer("nobody@example.com", guess); wrong != want || unknown != wrong {
			t.Fatalf("try %d: wrong password %q, unknown email %q; want both %q", i+1, wrong, unknown, want)
		}
	}
	b.shootError("phone-login-throttled")
	if got := answer("ann@example.com", testPassword); got != account.ErrThrottled.Error() {
		t.Errorf("the right password while throttled: %q, want %q", got, account.ErrThrottled)
	}
	if v := b.cookie(base, api.SessionCookie); v != "" {
		t.Errorf("a throttled sign-in set a session cookie")
	}
	b.do(chromedp.Navigate(base+"/dashboard"), chromedp.WaitVisible(chromedp.ID("signin")))

	skew.Add(int64(account.ThrottleWindow))
	b.signIn(base+"/login", "ann@example.com", testPassword)
	b.do(chromedp.WaitVisible(chromedp.ID("create-key")))
	b.checkClean()
}

// TestDisabledTenantOnPostgresPairInBrowser: two `vertal serve` processes
// on one PostgreSQL database. Ann works on node B (dashboard, a key, a
// signed-in playground run); the operator, signed in on node A, disables
// her tenant on the operator page. From the next request on, her session
// on node B is refused (dashboard and playground run) and her key is
// refused on both nodes; enabling again lets her back in.
func TestDisabledTenantOnPostgresPairInBrowser(t *testing.T) {
	requireE2E(t)
	if os.Getenv(pgtest.EnvVar) == "" {
		t.Fatal(pgtest.EnvVar + " is not set (scripts/test.sh sets it)")
	}
	dbURL := pgtest.NewDatabase(t)
	bin := buildVertal(t)
	nodeA, nodeB := serveOpen(t, bin, "--database-url", dbURL), serveOpen(t, bin, "--database-url", dbURL)

	user := newBrowser(t, 1366, 768)
	user.signUp(nodeB, "ann@example.com", "Ann")
	user.signIn(nodeB+"/login", "ann@example.com", testPassword)
	user.do(chromedp.WaitVisible(chromedp.ID("create-key")), chromedp.Click(chromedp.ID("create-key")),
		chromedp.WaitVisible(chromedp.ID("newkey-secret")))
	key := eval[string](user, `document.getElementById('newkey-secret').textContent`)
	if !strings.HasPrefix(key, "kubo_sk_") {
		t.Fatalf("new key = %q", key)
	}
	keyStatus := func(base string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/usage", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// playgroundRun opens the playground on node B, waits until it has
	// settled what it shows of the session (signed in with today's usage;
	// or, for a disabled tenant, the refusal of its usage check, which
	// replaces the brief "Signed in as" line), and runs 6*7.
	playgroundRun := func(disabled bool) view {
		t.Helper()
		user.open(nodeB + "/")
		settled := `(() => { const s = document.getElementById('key-status');
			return s.textContent.startsWith('Signed in as') && s.textContent.includes(' plan'); })()`
		if disabled {
			settled = `(() => { const s = document.getElementById('key-status');
				return s.classList.contains('bad') && s.textContent.includes('disabled'); })()`
		}
		if _, err := chromedp.Run(user.ctx, chromedp.Poll[bool](settled, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("the playground on node B does not show the session's state (disabled %v): %v; it shows %q", disabled, err,
				eval[string](user, `document.getElementById('key-status').textContent`))
		}
		user.setLanguage("python")
		user.setCode("print(6 * 7)")
		return user.clickRun()
	}
	for _, base := range []string{nodeA, nodeB} {
		if s := keyStatus(base); s != http.StatusOK {
			t.Fatalf("the key on %s before: %d, want 200", base, s)
		}
	}
	if v := playgroundRun(false); v.Stdout != "42\n" || v.Status != "succeeded" {
		t.Fatalf("signed-in run on node B before: %+v", v)
	}

	op := newBrowser(t, 1366, 768)
	op.signUp(nodeA, "op@example.com", "Op")
	if out, err := exec.Command(bin, "make-operator", "op@example.com", "--database-url", dbURL).CombinedOutput(); err != nil {
		t.Fatalf("vertal make-operator: %v\n%s", err, out)
	}
	op.signIn(nodeA+"/login", "op@example.com", testPassword)
	op.do(chromedp.WaitVisible(chromedp.ID("create-key")), chromedp.Navigate(nodeA+"/operator"), chromedp.WaitVisible(chromedp.CSS(`table.keys`)))
	tenant := eval[string](op, `[...document.querySelectorAll('table.keys tbody tr')].find(r => r.textContent.includes('ann@example.com')).querySelector('code').textContent`)
	op.do(chromedp.Click(chromedp.ID("disable-"+tenant)), chromedp.WaitVisible(chromedp.ID("enable-"+tenant)))
	checkOperatorOnPhone(t, nodeA, "op@example.com")

	user.do(chromedp.Navigate(nodeB + "/dashboard"))
	if msg := eval[string](user, `document.getElementById('form-error')?.textContent ?? ''`); !strings.Contains(msg, "disabled") {
		t.Errorf("node B's dashboard for the disabled tenant says %q", msg)
	}
	if n := eval[int](user, `document.querySelectorAll('#create-key').length`); n != 0 {
		t.Errorf("node B still shows the dashboard to the disabled tenant")
	}
	if v := playgroundRun(true); !v.ErrorShown || !strings.Contains(v.ErrorMessage, "disabled") || v.Stdout != "" {
		t.Errorf("signed-in run on node B after the disable: %+v, want refused as disabled", v)
	}
	for _, base := range []string{nodeA, nodeB} {
		if s := keyStatus(base); s != http.StatusForbidden {
			t.Errorf("the key on %s after the disable: %d, want 403", base, s)
		}
	}

	op.do(chromedp.Click(chromedp.ID("enable-"+tenant)), chromedp.WaitVisible(chromedp.ID("disable-"+tenant)))
	user.do(chromedp.Navigate(nodeB+"/dashboard"), chromedp.WaitVisible(chromedp.ID("create-key")))
	if s := keyStatus(nodeA); s != http.StatusOK {
		t.Errorf("the key on node A after enabling again: %d, want 200", s)
	}
	user.checkClean()
	op.checkClean()
}

// TestUnknownPageForBrowsers: a browser asking for a page that does not
// exist gets the site's page-not-found (HTML, 404); an API client keeps
// the JSON error shape.
func TestUnknownPageForBrowsers(t *testing.T) {
	base, _ := startAccountServer(t, time.Now)
	for _, tc := range []struct{ accept, wantType, wantBody string }{
		{"text/html,application/xhtml+xml,*/*;q=0.8", "text/html", "Page not found"},
		{"application/json", "application/json", `"not_found"`},
		{"", "application/json", `"not_found"`},
	} {
		req, _ := http.NewRequest("GET", base+"/no-such-page", nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.wantType) || !strings.Contains(string(body), tc.wantBody) {
			t.Errorf("Accept %q: %d %s, want 404 %s with %q:\n%.300s", tc.accept, resp.StatusCode, resp.Header.Get("Content-Type"), tc.wantType, tc.wantBody, body)
		}
	}
}
