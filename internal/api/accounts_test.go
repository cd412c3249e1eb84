package api

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// accountEnv is a real HTTP server with accounts on storefake.
type accountEnv struct {
	t   *testing.T
	st  store.Store
	srv *httptest.Server
}

func newAccountEnv(t *testing.T, edgeSecret string) *accountEnv {
	return newAccountNode(t, storefake.New(), edgeSecret)
}

// newAccountNode is one API node with accounts on st.
func newAccountNode(t *testing.T, st store.Store, edgeSecret string) *accountEnv {
	acc, err := account.New(account.Options{Store: st, Signup: account.SignupOpen})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(newAccountsAPI(t, st, acc, edgeSecret))
	t.Cleanup(hs.Close)
	return &accountEnv{t: t, st: st, srv: hs}
}

// newAccountsAPI is an API over st with the accounts of acc and the web
// pages, running executions on the fake driver.
func newAccountsAPI(t *testing.T, st store.Store, acc *account.Service, edgeSecret string) *Server {
	t.Helper()
	svc, err := execution.New(execution.Options{Store: st, Engine: enginetest.New(t, newFakeDriver(), engine.Options{MaxConcurrent: 8, MaxQueue: 32, QueueTimeout: time.Second}),
		Languages: testLanguages, Render: RenderExecution})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Service: svc, Store: st, Accounts: acc, Pages: web.NewPages(web.Options{}), EdgeSecret: edgeSecret})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// browser is a client with a cookie jar that does not follow redirects.
func (e *accountEnv) browser() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (e *accountEnv) post(c *http.Client, path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return e.send(c, req)
}

func (e *accountEnv) get(c *http.Client, path string, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return e.send(c, req)
}

func (e *accountEnv) send(c *http.Client, req *http.Request) (*http.Response, string) {
	e.t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// signUpAndIn makes an account and returns a signed-in browser and the
// dashboard's CSRF token.
func (e *accountEnv) signUpAndIn(email, name string) (*http.Client, string) {
	e.t.Helper()
	c := e.browser()
	if resp, body := e.post(c, "/signup", url.Values{"email": {email}, "name": {name}, "password": {"0123456789ab"}}, nil); resp.StatusCode != http.StatusOK {
		e.t.Fatalf("signup: %d %s", resp.StatusCode, body)
	}
	if resp, body := e.post(c, "/login", url.Values{"email": {email}, "password": {"0123456789ab"}}, nil); resp.StatusCode != http.StatusSeeOther {
		e.t.Fatalf("login: %d %s", resp.StatusCode, body)
	}
	return c, e.csrf(c)
}

var csrfRE = regexp.MustCompile(`data-csrf="([0-9a-f]{64})"`)

func (e *accountEnv) csrf(c *http.Client) string {
	e.t.Helper()
	resp, body := e.get(c, "/dashboard", nil)
	m := csrfRE.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		e.t.Fatalf("dashboard: %d, no CSRF token", resp.StatusCode)
	}
	return m[1]
}

func TestAccountCookieFlags(t *testing.T) {
	for _, tc := range []struct {
		name, edge string
		hdr        map[string]string
		secure     bool
	}{
		{"plain http", "", nil, false},
		{"forwarded proto without an edge secret is ignored", "", map[string]string{"X-Forwarded-Proto": "https"}, false},
		{"edge says https", "0123456789abcdef0123", map[string]string{"X-Forwarded-Proto": "https", EdgeSecretHeader: "0123456789abcdef0123"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newAccountEnv(t, tc.edge)
			c := e.browser()
			e.post(c, "/signup", url.Values{"email": {"ann@example.com"}, "password": {"0123456789ab"}}, tc.hdr)
			resp, _ := e.post(c, "/login", url.Values{"email": {"ann@example.com"}, "password": {"0123456789ab"}}, tc.hdr)
			var ck *http.Cookie
			for _, k := range resp.Cookies() {
				if k.Name == SessionCookie {
					ck = k
				}
			}
			if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteLaxMode || ck.Secure != tc.secure {
				t.Errorf("session cookie = %+v; want HttpOnly, SameSite=Lax, Secure=%v", ck, tc.secure)
			}
		})
	}
}

func TestSessionFixation(t *testing.T) {
	e := newAccountEnv(t, "")
	c := e.browser()
	e.post(c, "/signup", url.Values{"email": {"ann@example.com"}, "password": {"0123456789ab"}}, nil)
	planted := strings.Repeat("ab", 32)
	u, _ := url.Parse(e.srv.URL)
	c.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: planted, Path: "/"}})
	e.post(c, "/login", url.Values{"email": {"ann@example.com"}, "password": {"0123456789ab"}}, nil)
	for _, k := range c.Jar.Cookies(u) {
		if k.Name == SessionCookie && k.Value == planted {
			t.Fatalf("the planted session id is still the browser's after sign-in")
		}
	}
	attacker := e.browser()
	attacker.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: planted, Path: "/"}})
	if resp, _ := e.get(attacker, "/dashboard", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("dashboard with the planted id: %d, want 303 to /login", resp.StatusCode)
	}
	// Sign-out ends the session server-side: a copied cookie stops working.
	csrf := e.csrf(c)
	var stolen string
	for _, k := range c.Jar.Cookies(u) {
		if k.Name == SessionCookie {
			stolen = k.Value
		}
	}
	e.post(c, "/logout", url.Values{"csrf": {csrf}}, nil)
	attacker.Jar.SetCookies(u, []*http.Cookie{{Name: SessionCookie, Value: stolen, Path: "/"}})
	if resp, _ := e.get(attacker, "/dashboard", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("dashboard with a signed-out session: %d, want 303", resp.StatusCode)
	}
}

func TestAccountCSRF(t *testing.T) {
	e := newAccountEnv(t, "")
	c, csrf := e.signUpAndIn("ann@example.com", "Ann")
	for _, tc := range []struct {
		name string
		form url.Values
		hdr  map[string]string
		want int
	}{
		{"other origin, right token", url.Values{"csrf": {csrf}}, map[string]string{"Origin": "https://evil.example"}, http.StatusForbidden},
		{"cross-site fetch", url.Values{"csrf": {csrf}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"no token", nil, nil, http.StatusForbidden},
		{"wrong token", url.Values{"csrf": {strings.Repeat("0", 64)}}, nil, http.StatusForbidden},
		{"same origin, token", url.Values{"csrf": {csrf}}, map[string]string{"Origin": e.srv.URL}, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if resp, body := e.post(c, "/dashboard/keys", tc.form, tc.hdr); resp.StatusCode != tc.want {
				t.Errorf("POST /dashboard/keys: %d, want %d\n%s", resp.StatusCode, tc.want, body)
			}
		})
	}
	// A sign-in form posted from another origin is refused as well.
	if resp, _ := e.post(e.browser(), "/login", url.Values{"email": {"ann@example.com"}, "password": {"0123456789ab"}},
		map[string]string{"Origin": "https://evil.example"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin sign-in: %d, want 403", resp.StatusCode)
	}
}

func TestDashboardKeysAndEscaping(t *testing.T) {
	e := newAccountEnv(t, "")
	c, csrf := e.signUpAndIn(`"<script>alert('email')</script>"@example.com`, `<script>alert("name")</script>`)
	_, body := e.get(c, "/dashboard", nil)
	if strings.Contains(body, `<script>alert`) || !strings.Contains(body, `&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;`) ||
		!strings.Contains(body, `&lt;script&gt;alert(&#39;email&#39;)&lt;/script&gt;`) {
		t.Errorf("the name or email is not escaped in the dashboard")
	}
	if !strings.Contains(body, KeyPlaceholder) {
		t.Errorf("snippets without a key lack the placeholder")
	}
	json := map[string]string{"Accept": "application/json", CSRFHeader: csrf}
	var secrets []string
	for i := range store.MaxActiveKeys {
		resp, body := e.post(c, "/dashboard/keys", nil, json)
		m := regexp.MustCompile(`"api_key":"(kubo_sk_[0-9A-Za-z]+)"`).FindStringSubmatch(body)
		if resp.StatusCode != http.StatusCreated || m == nil {
			t.Fatalf("key %d: %d %s", i+1, resp.StatusCode, body)
		}
		secrets = append(secrets, m[1])
	}
	resp, body := e.post(c, "/dashboard/keys", nil, json)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "too_many_keys") || !strings.Contains(body, "revoke one first") {
		t.Errorf("6th key: %d %s; want 409 too_many_keys", resp.StatusCode, body)
	}
	_, page := e.get(c, "/dashboard", nil)
	for _, s := range secrets {
		if strings.Contains(page, s) {
			t.Errorf("the dashboard shows a key's secret after creation")
		}
	}
	bearer := map[string]string{"Authorization": "Bearer " + secrets[0]}
	if resp, _ := e.get(http.DefaultClient, "/v1/usage", bearer); resp.StatusCode != http.StatusOK {
		t.Fatalf("new key on /v1/usage: %d", resp.StatusCode)
	}
	keys, _ := e.st.ListKeys(t.Context(), "")
	if keys[0].LastUsedAt.IsZero() {
		t.Errorf("a used key has no LastUsedAt")
	}
	if resp, _ := e.post(c, "/dashboard/keys/"+keys[0].ID+"/revoke", url.Values{"csrf": {csrf}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	if resp, _ := e.get(http.DefaultClient, "/v1/usage", bearer); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("revoked key: %d, want 401", resp.StatusCode)
	}
	// Another account cannot revoke this one's keys.
	other, otherCSRF := e.signUpAndIn("bob@example.com", "Bob")
	if resp, _ := e.post(other, "/dashboard/keys/"+keys[1].ID+"/revoke", url.Values{"csrf": {otherCSRF}}, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("revoking another account's key: %d, want 404", resp.StatusCode)
	}
}

func TestSignInThrottledSameAnswer(t *testing.T) {
	e := newAccountEnv(t, "")
	e.signUpAndIn("ann@example.com", "Ann")
	answer := func(email string) (int, string) {
		resp, body := e.post(e.browser(), "/login", url.Values{"email": {email}, "password": {"wrong password"}}, nil)
		m := regexp.MustCompile(`id="form-error">([^<]*)<`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no error on the sign-in page: %s", body)
		}
		return resp.StatusCode, m[1]
	}
	s1, m1 := answer("ann@example.com")
	s2, m2 := answer("nobody@example.com")
	if s1 != s2 || m1 != m2 {
		t.Errorf("wrong password: %d %q; unknown email: %d %q; want the same", s1, m1, s2, m2)
	}
	var status int
	for range account.MaxTriesPerEmail {
		status, _ = answer("ann@example.com")
	}
	if status != http.StatusTooManyRequests {
		t.Errorf("after %d tries: %d, want 429", account.MaxTriesPerEmail+1, status)
	}
}

func TestSessionRunsAndDisabledTenant(t *testing.T) {
	e := newAccountEnv(t, "")
	c, csrf := e.signUpAndIn("ann@example.com", "Ann")
	run := func(hdr map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/executions", strings.NewReader(`{"language":"python","code":"print(6 * 7)"}`))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, _ := e.send(c, req)
		return resp.StatusCode
	}
	if got := run(map[string]string{CSRFHeader: csrf}); got != http.StatusOK {
		t.Fatalf("signed-in run: %d, want 200", got)
	}
	if got := run(nil); got != http.StatusForbidden {
		t.Errorf("signed-in run without the CSRF header: %d, want 403", got)
	}
	a, _ := e.st.AccountByEmail(t.Context(), "ann@example.com")
	if u, _ := e.st.Usage(t.Context(), a.Tenant, time.Now().UTC().Format(time.DateOnly)); u.Executions != 1 {
		t.Errorf("tenant executions = %d, want the signed-in run counted", u.Executions)
	}
	resp, body := e.post(c, "/dashboard/keys", nil, map[string]string{"Accept": "application/json", CSRFHeader: csrf})
	secret := regexp.MustCompile(`kubo_sk_[0-9A-Za-z]+`).FindString(body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatal(body)
	}
	if err := e.st.SetTenantDisabled(t.Context(), a.Tenant, true); err != nil {
		t.Fatal(err)
	}
	if got := run(map[string]string{CSRFHeader: csrf}); got != http.StatusForbidden {
		t.Errorf("disabled tenant, session run: %d, want 403", got)
	}
	if resp, page := e.get(c, "/dashboard", nil); resp.StatusCode != http.StatusForbidden || !strings.Contains(page, "this account is disabled") {
		t.Errorf("disabled tenant, dashboard: %d, want 403 saying %q", resp.StatusCode, errTenantDisabled.Msg)
	}
	if resp, _ := e.get(http.DefaultClient, "/v1/usage", map[string]string{"Authorization": "Bearer " + secret}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("disabled tenant's key: %d, want 403", resp.StatusCode)
	}
}

// TestDisabledTenantOnBothNodes: two API nodes on one PostgreSQL
// database. A session made on one works on the other; an operator signed
// in on node B disables the tenant, and its key and its session are
// refused on both nodes from the next request on.
func TestDisabledTenantOnBothNodes(t *testing.T) {
	if os.Getenv("VERTAL_TEST_DATABASE_URL") == "" {
		t.Skip("VERTAL_TEST_DATABASE_URL is not set (CI sets it)")
	}
	dbURL := NewTestDatabase(t)
	open := func() store.Store {
		st, err := postgres.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, b := newAccountNode(t, open(), ""), newAccountNode(t, open(), "")
	user, userCSRF := a.signUpAndIn("ann@example.com", "Ann")
	_, body := a.post(user, "/dashboard/keys", nil, map[string]string{"Accept": "application/json", CSRFHeader: userCSRF})
	secret := regexp.MustCompile(`kubo_sk_[0-9A-Za-z]+`).FindString(body)
	op, _ := b.signUpAndIn("op@example.com", "Op")
	opAcc, _ := b.st.AccountByEmail(t.Context(), "op@example.com")
	if err := b.st.SetRole(t.Context(), opAcc.ID, store.RoleOperator); err != nil {
		t.Fatal(err)
	}
	opCSRF := b.csrf(op)
	ann, _ := a.st.AccountByEmail(t.Context(), "ann@example.com")

	// The session cookie of node A, sent to node B.
	ua, _ := url.Parse(a.srv.URL)
	ub, _ := url.Parse(b.srv.URL)
	user.Jar.SetCookies(ub, user.Jar.Cookies(ua))
	check := func(when string, want int) {
		t.Helper()
		for _, n := range []*accountEnv{a, b} {
			if resp, _ := n.get(http.DefaultClient, "/v1/usage", map[string]string{"Authorization": "Bearer " + secret}); resp.StatusCode != want {
				t.Errorf("%s: key on %s: %d, want %d", when, n.srv.URL, resp.StatusCode, want)
			}
			if resp, _ := n.get(user, "/v1/usage", map[string]string{CSRFHeader: userCSRF}); resp.StatusCode != want {
				t.Errorf("%s: session on %s: %d, want %d", when, n.srv.URL, resp.StatusCode, want)
			}
		}
	}
	check("before", http.StatusOK)
	if resp, body := b.post(op, "/operator/tenants/"+ann.Tenant+"/disable", url.Values{"csrf": {opCSRF}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("operator disables: %d %s", resp.StatusCode, body)
	}
	check("disabled", http.StatusForbidden)
	if _, page := b.get(op, "/operator", nil); !strings.Contains(page, ann.Tenant) || !strings.Contains(page, "disabled") {
		t.Errorf("the operator page does not show %s disabled", ann.Tenant)
	}
	if resp, _ := b.post(op, "/operator/tenants/"+ann.Tenant+"/plan", url.Values{"csrf": {opCSRF}, "plan": {"enterprise"}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("operator sets plan: %d", resp.StatusCode)
	}
	if resp, _ := b.post(op, "/operator/tenants/"+ann.Tenant+"/enable", url.Values{"csrf": {opCSRF}}, nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("operator enables: %d", resp.StatusCode)
	}
	check("enabled again", http.StatusOK)
	if tn, _ := a.st.Tenant(t.Context(), ann.Tenant); tn.Plan != "enterprise" {
		t.Errorf("plan after the operator's change = %q, want enterprise", tn.Plan)
	}
	// A user who is not an operator does not see the operator pages.
	if resp, _ := a.get(user, "/operator", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/operator for a user: %d, want 404", resp.StatusCode)
	}
}

// TestSignupThrottled: the sign-up form answers 429 on its own page, with
// the limit's message, once an address has sent MaxSignupsPerIP forms.
func TestSignupThrottled(t *testing.T) {
	e := newAccountEnv(t, "")
	for i := range account.MaxSignupsPerIP {
		form := url.Values{"email": {fmt.Sprintf("u%d@example.com", i)}, "password": {"0123456789ab"}}
		if resp, body := e.post(e.browser(), "/signup", form, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("sign-up %d: %d %s", i+1, resp.StatusCode, body)
		}
	}
	resp, body := e.post(e.browser(), "/signup", url.Values{"email": {"late@example.com"}, "password": {"0123456789ab"}}, nil)
	m := regexp.MustCompile(`id="form-error">([^<]*)<`).FindStringSubmatch(body)
	if resp.StatusCode != http.StatusTooManyRequests || m == nil || m[1] != account.ErrSignupThrottled.Error() {
		t.Errorf("sign-up over the limit: %d, error %q; want 429 with %q", resp.StatusCode, m, account.ErrSignupThrottled)
	}
	if _, err := e.st.AccountByEmail(t.Context(), "late@example.com"); err == nil {
		t.Errorf("the throttled sign-up made an account")
	}
}

// TestLoginNoticeIsACode: ?notice= picks one of the server's messages; any
// other text in the link is not shown on the real origin.
func TestLoginNoticeIsACode(t *testing.T) {
	e := newAccountEnv(t, "")
	for _, tc := range []struct{ query, want, not string }{
		{"signed-out", "Signed out.", ""},
		{"password-changed", "Password changed: sign in.", ""},
		{url.QueryEscape("Your account is locked: call +1 555 0100"), "", "call +1 555 0100"},
		{"Signed+out.", "", "Signed out."},
	} {
		_, body := e.get(e.browser(), "/login?notice="+tc.query, nil)
		if tc.want != "" && !strings.Contains(body, tc.want) {
			t.Errorf("notice=%s: the page lacks %q", tc.query, tc.want)
		}
		if tc.want == "" && (strings.Contains(body, "form-notice") || strings.Contains(body, tc.not)) {
			t.Errorf("notice=%s: the page shows the link's text", tc.query)
		}
	}
	// Sign-up ends on a page that says what comes next.
	resp, body := e.post(e.browser(), "/signup", url.Values{"email": {"ann@example.com"}, "password": {"0123456789ab"}}, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="signup-done"`) || !strings.Contains(body, "Sign in with your email") {
		t.Errorf("sign-up answered %d without the next steps:\n%s", resp.StatusCode, body)
	}
}
