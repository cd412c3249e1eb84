package account

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/storefake"
)

func TestPassword(t *testing.T) {
	h := HashPassword("correct horse battery")
	for _, tc := range []struct {
		pw   string
		want bool
	}{{"correct horse battery", true}, {"correct horse batterY", false}, {"", false}} {
		got, err := CheckPassword(h, tc.pw)
		if err != nil || got != tc.want {
			t.Errorf("CheckPassword(%q) = %v, %v; want %v", tc.pw, got, err, tc.want)
		}
	}
	if _, err := CheckPassword("$2y$10$bcrypt", "x"); err == nil {
		t.Errorf("CheckPassword of a non-argon2id hash: no error")
	}
}

func newService(t *testing.T, mode string) (*Service, *storefake.Store) {
	st := storefake.New()
	s, err := New(Options{Store: st, Signup: mode, PublicURL: "http://h"})
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func TestSignupModes(t *testing.T) {
	ctx := t.Context()
	in := SignUp{Email: "Ann@Example.com", Name: "Ann", Password: "0123456789"}
	for _, tc := range []struct {
		mode string
		want error
	}{{SignupOpen, nil}, {SignupInvite, ErrInviteRequired}, {SignupClosed, ErrSignupClosed}} {
		s, _ := newService(t, tc.mode)
		a, err := s.SignUp(ctx, in)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: SignUp error = %v, want %v", tc.mode, err, tc.want)
		}
		if err == nil && (a.Email != "ann@example.com" || a.VerifiedAt.IsZero()) {
			t.Errorf("%s: account = %+v, want lower-cased email, verified (no mailer)", tc.mode, a)
		}
	}
}

func TestInviteAttachesTenant(t *testing.T) {
	ctx := t.Context()
	s, st := newService(t, SignupInvite)
	if _, err := st.CreateKey(ctx, store.NewKey{ID: "key_000000000001", Tenant: "legacy", Plan: "pro", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	link, err := s.Invite(ctx, "lee@example.com", "", "legacy")
	if err != nil {
		t.Fatal(err)
	}
	tok := link[len("http://h/signup?invite="):]
	if _, err := s.SignUp(ctx, SignUp{Email: "other@example.com", Password: "0123456789", Invite: tok}); !errors.Is(err, ErrInviteEmail) {
		t.Errorf("invite used by another email: %v, want ErrInviteEmail", err)
	}
	a, err := s.SignUp(ctx, SignUp{Email: "lee@example.com", Password: "0123456789", Invite: tok})
	if err != nil || a.Tenant != "legacy" {
		t.Fatalf("SignUp with invite = %+v, %v; want tenant legacy", a, err)
	}
	if tn, _ := st.Tenant(ctx, "legacy"); tn.Plan != "pro" {
		t.Errorf("attached tenant plan = %q, want pro", tn.Plan)
	}
	if _, err := s.SignUp(ctx, SignUp{Email: "lee@example.com", Password: "0123456789", Invite: tok}); !errors.Is(err, ErrBadLink) {
		t.Errorf("invite used twice: %v, want ErrBadLink", err)
	}
}

func TestSignInSameAnswerAndThrottle(t *testing.T) {
	ctx := t.Context()
	s, _ := newService(t, SignupOpen)
	if _, err := s.SignUp(ctx, SignUp{Email: "ann@example.com", Password: "0123456789"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SignIn(ctx, "ann@example.com", "0123456789", "10.0.0.1"); err != nil {
		t.Fatalf("right password: %v", err)
	}
	_, wrong := s.SignIn(ctx, "ann@example.com", "nope", "10.0.0.1")
	_, unknown := s.SignIn(ctx, "bob@example.com", "nope", "10.0.0.1")
	if wrong != ErrSignInFailed || unknown != ErrSignInFailed {
		t.Errorf("wrong password: %v; unknown email: %v; want both ErrSignInFailed", wrong, unknown)
	}
	var last error
	for i := range MaxTriesPerEmail {
		_, last = s.SignIn(ctx, "ann@example.com", fmt.Sprint("guess", i), "10.0.0.2")
	}
	if last != ErrThrottled {
		t.Errorf("after %d tries: %v, want ErrThrottled", MaxTriesPerEmail+2, last)
	}
	// The right password is refused too while throttled, and so is an
	// unknown email after as many tries: the answers do not differ.
	if _, err := s.SignIn(ctx, "ann@example.com", "0123456789", "10.0.0.3"); err != ErrThrottled {
		t.Errorf("right password while throttled: %v, want ErrThrottled", err)
	}
	for i := range MaxTriesPerIP + 1 {
		_, last = s.SignIn(ctx, fmt.Sprintf("u%d@example.com", i), "x", "10.0.0.9")
	}
	if last != ErrThrottled {
		t.Errorf("after %d tries from one IP: %v, want ErrThrottled", MaxTriesPerIP+1, last)
	}
}

func TestResetEndsSessions(t *testing.T) {
	ctx := t.Context()
	s, _ := newService(t, SignupOpen)
	a, err := s.SignUp(ctx, SignUp{Email: "ann@example.com", Password: "0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := s.StartSession(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	link, err := s.ResetLink(ctx, "ann@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ResetPassword(ctx, link[len("http://h/reset?token="):], "a new password"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Session(ctx, id); !errors.Is(err, ErrNoSession) {
		t.Errorf("session after a reset: %v, want ErrNoSession", err)
	}
	if _, err := s.SignIn(ctx, "ann@example.com", "a new password", "1.1.1.1"); err != nil {
		t.Errorf("sign-in with the new password: %v", err)
	}
}

type countingMailer struct{ sent int }

func (m *countingMailer) Send(_ context.Context, to, subject, body string) error {
	m.sent++
	return nil
}

// TestResetEmailsAreBounded: the reset form is open to anyone, so one
// address gets at most MaxResetsPerEmail emails per window, however often
// it is asked for; the answer stays the same.
func TestResetEmailsAreBounded(t *testing.T) {
	ctx := t.Context()
	st := storefake.New()
	m := &countingMailer{}
	s, err := New(Options{Store: st, Signup: SignupOpen, Mailer: m, PublicURL: "http://h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SignUp(ctx, SignUp{Email: "ann@example.com", Name: "Ann", Password: "0123456789"}); err != nil {
		t.Fatal(err)
	}
	m.sent = 0 // the verification email
	for range 10 {
		if err := s.RequestReset(ctx, "Ann@example.com"); err != nil {
			t.Fatal(err)
		}
	}
	if m.sent != MaxResetsPerEmail {
		t.Errorf("%d reset emails sent; want %d", m.sent, MaxResetsPerEmail)
	}
}

// TestSignupLimits: at most MaxSignupsPerIP sign-up forms per address per
// window (refused ones count too), then the throttle's answer; another
// address is not affected, and the next window lets the address in again.
// MaxSignupsPerMinute bounds the whole server whatever the addresses.
func TestSignupLimits(t *testing.T) {
	ctx := t.Context()
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	s, err := New(Options{Store: storefake.New(), Signup: SignupOpen, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	signUp := func(ip, password string) error {
		n++
		_, err := s.SignUp(ctx, SignUp{Email: fmt.Sprintf("u%d@example.com", n), Password: password, IP: ip})
		return err
	}
	if err := signUp("10.0.0.1", "short"); !errors.Is(err, ErrWeakPassword) {
		t.Fatalf("a weak password: %v", err)
	}
	for i := range MaxSignupsPerIP - 1 {
		if err := signUp("10.0.0.1", "0123456789"); err != nil {
			t.Fatalf("sign-up %d from one address: %v", i+2, err)
		}
	}
	for _, tc := range []struct {
		name, ip string
		want     error
	}{
		{"one more from the address", "10.0.0.1", ErrSignupThrottled},
		{"again, with a good form", "10.0.0.1", ErrSignupThrottled},
		{"another address", "10.0.0.2", nil},
	} {
		if err := signUp(tc.ip, "0123456789"); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	now = now.Add(ThrottleWindow)
	if err := signUp("10.0.0.1", "0123456789"); err != nil {
		t.Errorf("the next window: %v, want the sign-up to work", err)
	}

	// The whole server: MaxSignupsPerMinute per minute, one per address.
	now = now.Add(time.Minute)
	var last error
	for i := range MaxSignupsPerMinute + 1 {
		last = signUp(fmt.Sprintf("10.1.%d.%d", i/250, i%250), "0123456789")
		if i < MaxSignupsPerMinute && last != nil {
			t.Fatalf("server-wide sign-up %d: %v", i+1, last)
		}
	}
	if !errors.Is(last, ErrSignupBusy) {
		t.Errorf("sign-up %d in a minute: %v, want ErrSignupBusy", MaxSignupsPerMinute+1, last)
	}
	now = now.Add(time.Minute)
	if err := signUp("10.2.0.1", "0123456789"); err != nil {
		t.Errorf("the next minute: %v", err)
	}
}

// fakeClock is a clock a test sets.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// signedIn is a service on c with one account and one session (its id).
func signedIn(t *testing.T, c *fakeClock) (*Service, *storefake.Store, store.Account, string) {
	t.Helper()
	st := storefake.New()
	s, err := New(Options{Store: st, Signup: SignupOpen, PublicURL: "http://h", Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.SignUp(t.Context(), SignUp{Email: "ann@example.com", Password: "0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := s.StartSession(t.Context(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	return s, st, a, id
}

// TestPurge: Purge deletes on the service's clock; a session past its
// expiry is refused before any purge.
func TestPurge(t *testing.T) {
	ctx := t.Context()
	c := &fakeClock{t: time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)}
	s, _, a, old := signedIn(t, c)
	if _, err := s.ResetLink(ctx, "ann@example.com"); err != nil {
		t.Fatal(err)
	}
	c.add(SessionTTL - time.Hour)
	live, _, err := s.StartSession(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	c.add(time.Hour)
	if _, _, err := s.Session(ctx, old); !errors.Is(err, ErrNoSession) {
		t.Errorf("a session at its expiry, before the purge: %v, want ErrNoSession", err)
	}
	sessions, tokens, err := s.Purge(ctx)
	if err != nil || sessions != 1 || tokens != 1 {
		t.Errorf("Purge = %d sessions, %d links, %v; want 1, 1 (the old session, the expired reset link)", sessions, tokens, err)
	}
	if _, _, err := s.Session(ctx, live); err != nil {
		t.Errorf("the live session after the purge: %v", err)
	}
}

// TestPurgeEvery: the server's sweep purges at once and again each
// interval, on the service's clock, and ends with its context.
func TestPurgeEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	start := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	c := &fakeClock{t: start}
	s, st, _, id := signedIn(t, c)
	done := make(chan struct{})
	go func() { s.PurgeEvery(ctx, 5*time.Millisecond); close(done) }()
	c.add(SessionTTL)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		// Looked up at the start, the session would be live: gone means deleted.
		if _, err := st.SessionByHash(ctx, HashSecret(id), start); errors.Is(err, store.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweep did not purge the expired session")
		}
	}
	cancel()
	<-done
}

// TestMailNeedsPublicURL: a service that mails links must know its own
// origin, since the only other source would be the request's Host header,
// which the sender chooses (reset poisoning). Without one, printed links
// are refused too.
func TestMailNeedsPublicURL(t *testing.T) {
	if _, err := New(Options{Store: storefake.New(), Mailer: &countingMailer{}}); !errors.Is(err, ErrNoPublicURL) {
		t.Errorf("New with a Mailer and no PublicURL: error %v, want ErrNoPublicURL", err)
	}
	for _, bad := range []string{"attacker.example", "ftp://x", "https://"} {
		if _, err := New(Options{Store: storefake.New(), PublicURL: bad}); err == nil {
			t.Errorf("New with PublicURL %q: no error", bad)
		}
	}
	s, _ := New(Options{Store: storefake.New(), Signup: SignupOpen})
	if _, err := s.Invite(t.Context(), "ann@example.com", "", ""); !errors.Is(err, ErrNoPublicURL) {
		t.Errorf("Invite without PublicURL: error %v, want ErrNoPublicURL", err)
	}
}
