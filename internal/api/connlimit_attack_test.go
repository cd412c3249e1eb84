package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
)

// Attacks on the connection limits through the account pages, which take
// requests without a key. Found by a review of the merged limiter.

type discardMailer struct{}

func (discardMailer) Send(context.Context, string, string, string) error { return nil }

// accountsServer is an API with open sign-up and a mailer (so accounts
// start unverified) behind limiter o; stall, when set, replaces
// unauthStall.
func accountsServer(t *testing.T, o ConnLimits, stall time.Duration) (*ConnLimiter, *url.URL) {
	t.Helper()
	st := storefake.New()
	acc, err := account.New(account.Options{Store: st, Signup: account.SignupOpen, Mailer: discardMailer{}, PublicURL: "http://x.test"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := execution.New(execution.Options{Store: st, Engine: engine.New(newFakeDriver(), engine.Options{MaxConcurrent: 8, QueueTimeout: time.Second}),
		Languages: testLanguages, Render: RenderExecution})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Service: svc, Store: st, Accounts: acc, Pages: web.NewPages(web.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	l := NewConnLimiter(o)
	if stall > 0 {
		l.stall = stall
	}
	hs := httptest.NewUnstartedServer(l.Handler(s))
	hs.Listener = l.Listener(hs.Listener)
	hs.Config.ConnContext = l.ConnContext
	hs.Config.ReadTimeout = time.Minute
	hs.Start()
	t.Cleanup(hs.Close)
	u, _ := url.Parse(hs.URL)
	return l, u
}

func (l *ConnLimiter) unauthenticated() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unauth
}

// firstLine sends req on a new connection and returns the answer's status
// line ("" if none came within 3 s).
func firstLine(t *testing.T, host, req string) string {
	t.Helper()
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, req)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 512)
	n, _ := conn.Read(buf)
	line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
	return line
}

// TestStalledFormsGiveWay: sign-in forms whose body never comes hold every
// unauthenticated place; past the stall time a newcomer takes one of them
// instead of getting the 503.
func TestStalledFormsGiveWay(t *testing.T) {
	l, u := accountsServer(t, ConnLimits{Max: 64, MaxUnauth: 4, UnauthPerPrefix: 4}, 300*time.Millisecond)
	for range 4 {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 10000\r\n\r\nemail=", u.Host)
	}
	waitFor(t, func() bool { return l.running() == 4 })
	time.Sleep(400 * time.Millisecond) // past the stall time
	if got := firstLine(t, u.Host, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); !strings.Contains(got, " 200 ") {
		t.Errorf("a newcomer while 4 stalled forms hold every unauthenticated place: %q, want 200", got)
	}
}

// TestUnverifiedSessionStaysUnauthenticated: a sign-up that never verified
// its email signs in; its dashboard views do not take its connections out
// of the unauthenticated caps.
func TestUnverifiedSessionStaysUnauthenticated(t *testing.T) {
	l, u := accountsServer(t, ConnLimits{Max: 64, MaxUnauth: 8, UnauthPerPrefix: 8}, 0)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, step := range []struct {
		path string
		form url.Values
		want int
	}{
		{"/signup", url.Values{"email": {"fake@nowhere.invalid"}, "name": {"x"}, "password": {"0123456789ab"}}, http.StatusOK},
		{"/login", url.Values{"email": {"fake@nowhere.invalid"}, "password": {"0123456789ab"}}, http.StatusSeeOther},
	} {
		resp, err := c.PostForm(u.String()+step.path, step.form)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != step.want {
			t.Fatalf("%s: %d, want %d", step.path, resp.StatusCode, step.want)
		}
	}
	c.CloseIdleConnections()
	var cookie string
	for _, k := range jar.Cookies(u) {
		cookie = k.Name + "=" + k.Value
	}
	waitFor(t, func() bool { return l.unauthenticated() == 0 })
	conns := make([]net.Conn, 0, 4)
	for range 4 {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
		fmt.Fprintf(conn, "GET /dashboard HTTP/1.1\r\nHost: %s\r\nCookie: %s\r\n\r\n", u.Host, cookie)
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 256)
		if n, _ := conn.Read(buf); !strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200") {
			t.Fatalf("dashboard of the unverified account: %q", buf[:n])
		}
	}
	if got := l.unauthenticated(); got != len(conns) {
		t.Errorf("%d of %d connections of an unverified session count as unauthenticated", got, len(conns))
	}
}
