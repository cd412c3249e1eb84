package api

import (
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// SessionCookie holds a signed-in browser's session id.
const SessionCookie = "vertal_session"

// CSRFHeader carries the session's CSRF token on fetch requests.
const CSRFHeader = "X-CSRF-Token"

// How the account pages decide things that depend on the network path:
//
//   - Secure cookies: a request is HTTPS if it arrived over TLS, if the
//     configured PublicURL is https, or if X-Forwarded-Proto says https
//     and an edge secret is configured (so ServeHTTP already proved the
//     request came through the edge). Without an edge secret, the header
//     could be anyone's and is ignored.
//   - The client IP for throttling is RemoteAddr, or with an edge secret
//     the first address of CF-Connecting-IP / X-Forwarded-For.
//   - CSRF: every POST from a page must come from this origin (see
//     sameOrigin: Sec-Fetch-Site, else Origin). A signed-in
//     POST must also carry the session's token (form field csrf, or the
//     X-CSRF-Token header for fetch), compared in constant time.
func (s *Server) viaTLS(r *http.Request) bool {
	if r.TLS != nil || strings.HasPrefix(s.opts.PublicURL, "https://") {
		return true
	}
	return s.edgeSecret != nil && strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (s *Server) clientIP(r *http.Request) string {
	if s.edgeSecret != nil {
		for _, h := range []string{"CF-Connecting-IP", "X-Forwarded-For"} {
			if v, _, _ := strings.Cut(r.Header.Get(h), ","); strings.TrimSpace(v) != "" {
				return strings.TrimSpace(v)
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// publicBase is the server's origin as a browser sees it.
func (s *Server) publicBase(r *http.Request) string {
	if s.opts.PublicURL != "" {
		return strings.TrimRight(s.opts.PublicURL, "/")
	}
	scheme := "http"
	if s.viaTLS(r) {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// sameOrigin is the origin half of the CSRF check. Browsers send
// Sec-Fetch-Site on every request, so it decides when present: only
// same-origin (or none: the user's own navigation) passes. Otherwise an
// Origin header must name this server; "null" (what a page under
// Referrer-Policy no-referrer may send) does not. A request with neither
// header is not from a modern browser, so not a cross-site forgery.
func (s *Server) sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin" || site == "none"
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if s.opts.PublicURL != "" {
		if p, err := url.Parse(s.opts.PublicURL); err == nil && strings.EqualFold(p.Host, u.Host) {
			return true
		}
	}
	return strings.EqualFold(u.Host, r.Host)
}

var errCrossOrigin = errorf(KindForbidden, "this form may only be sent from this server's own pages")

// session is the signed-in browser behind a page request.
type session struct {
	id      string
	s       store.Session
	account store.Account
}

func (s *Server) currentSession(r *http.Request) (*session, error) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return nil, nil
	}
	se, a, err := s.opts.Accounts.Session(r.Context(), c.Value)
	if errors.Is(err, account.ErrNoSession) {
		return nil, nil
	}
	if err != nil {
		return nil, internal(err)
	}
	infoFrom(r.Context()).tenant = a.Tenant
	return &session{id: c.Value, s: se, account: a}, nil
}

// checkCSRF is the whole CSRF check of a signed-in POST.
func (s *Server) checkCSRF(r *http.Request, se *session) error {
	if !s.sameOrigin(r) {
		return errCrossOrigin
	}
	token := r.Header.Get(CSRFHeader)
	if token == "" {
		token = r.PostFormValue("csrf")
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(se.s.CSRF)) != 1 {
		return errorf(KindForbidden, "the form's CSRF token is missing or stale; reload the page and try again")
	}
	return nil
}

// sessionCaller authenticates an API request by session (the signed-in
// playground): nil, nil without a session cookie.
func (s *Server) sessionCaller(r *http.Request) (*Caller, error) {
	se, err := s.currentSession(r)
	if se == nil || err != nil {
		return nil, err
	}
	if err := s.checkCSRF(r, se); err != nil {
		return nil, err
	}
	if se.account.VerifiedAt.IsZero() {
		return nil, errorf(KindForbidden, "verify your email first")
	}
	t, err := s.store.Tenant(r.Context(), se.account.Tenant)
	if err != nil {
		return nil, internal(err)
	}
	if t.Disabled {
		return nil, errTenantDisabled
	}
	plan, ok := s.plans[t.Plan]
	if !ok {
		return nil, internal(errors.New("tenant " + t.ID + " has plan " + t.Plan + ", which is not configured"))
	}
	info := infoFrom(r.Context())
	info.tenant, info.keyID = t.ID, "session"
	return &Caller{Key: store.Key{ID: "session", Tenant: t.ID, Plan: t.Plan}, Plan: plan}, nil
}

func (s *Server) setSessionCookie(w http.ResponseWriter, r *http.Request, id string) {
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: id, Path: "/", MaxAge: int(account.SessionTTL.Seconds()),
		HttpOnly: true, Secure: s.viaTLS(r), SameSite: http.SameSiteLaxMode})
}

func (s *Server) clearSessionCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: s.viaTLS(r), SameSite: http.SameSiteLaxMode})
}

// Page is what every account page's template gets; Data is the page's
// own.
type Page struct {
	Title   string
	Section string // "login", "signup", "dashboard", "operator"
	// Email is the signed-in account's ("" when nobody is), Operator its
	// role, CSRF the session's token for the page's forms.
	Email    string
	Operator bool
	CSRF     string
	Error    string // shown above the form
	Notice   string
	Data     any

	Version, APIBase, RepoURL string
	HasDocs                   bool
}

// PageRenderer renders the account pages (web.Pages).
type PageRenderer interface {
	Render(w http.ResponseWriter, r *http.Request, status int, name string, data any) error
}

// repoURL is the footer's source link.
const repoURL = "https://github.com/kuboprotocol/Vertal2Kubo"

// render writes an account page, with the signed-in account's header.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, se *session, p Page) error {
	p.Version, p.APIBase, p.RepoURL, p.HasDocs = s.opts.Version, "/api", repoURL, true
	if se != nil {
		p.Email, p.CSRF, p.Operator = se.account.Email, se.s.CSRF, se.account.Role == store.RoleOperator
	}
	return s.opts.Pages.Render(w, r, status, name, p)
}

// pageHandler is a page route's handler with the session (nil if none).
type pageHandler func(w http.ResponseWriter, r *http.Request, se *session) error

// page is the adapter of the account pages: it reads the session, and for
// POSTs checks the origin, and the CSRF token when signed in.
func (s *Server) page(h pageHandler) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.opts.Accounts == nil || s.opts.Pages == nil {
			return errorf(KindNotFound, "accounts are not enabled on this server")
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		se, err := s.currentSession(r)
		if err != nil {
			return err
		}
		if r.Method == http.MethodPost {
			if se != nil {
				if err := s.checkCSRF(r, se); err != nil {
					return err
				}
			} else if !s.sameOrigin(r) {
				return errCrossOrigin
			}
		}
		return h(w, r, se)
	}
}

// signedIn is page for pages that need a session: others go to /login.
func (s *Server) signedIn(h pageHandler) handlerFunc {
	return s.page(func(w http.ResponseWriter, r *http.Request, se *session) error {
		if se == nil {
			if r.Method == http.MethodPost || r.Header.Get("Accept") == "application/json" {
				return errorf(KindUnauthorized, "not signed in; sign in at /login")
			}
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return nil
		}
		// Only an account that could run code leaves the unauthenticated
		// connection caps: a sign-up whose email was never verified, or a
		// disabled tenant, holds its connection as anyone without a key.
		if !se.account.VerifiedAt.IsZero() {
			if t, err := s.store.Tenant(r.Context(), se.account.Tenant); err == nil && !t.Disabled {
				if err := tenantConn(w, r, t.ID); err != nil {
					return err
				}
			}
		}
		return h(w, r, se)
	})
}

// notices are the messages a redirect may ask a page to show, by code
// (?notice=signed-out): the text is the server's, so a link cannot make
// the real origin show words of its sender's choosing. An unknown code
// shows nothing.
var notices = map[string]string{
	"signed-out":            "Signed out.",
	"signed-out-everywhere": "Signed out on every device.",
	"password-changed":      "Password changed: sign in.",
}

// noticeParam is the message for r's ?notice= code, or "".
func noticeParam(r *http.Request) string { return notices[r.URL.Query().Get("notice")] }

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request, se *session) error {
	if se != nil {
		http.Redirect(w, r, "/dashboard", http.StatusSeeOther)
		return nil
	}
	return s.render(w, r, http.StatusOK, "login.html", nil, Page{Title: "Sign in", Section: "login", Notice: noticeParam(r)})
}

// login checks the password, ends any session the browser came with (so
// an id planted before sign-in is worthless) and starts a new one.
func (s *Server) login(w http.ResponseWriter, r *http.Request, se *session) error {
	a, err := s.opts.Accounts.SignIn(r.Context(), r.PostFormValue("email"), r.PostFormValue("password"), s.clientIP(r))
	if errors.Is(err, account.ErrSignInFailed) || errors.Is(err, account.ErrThrottled) {
		status := http.StatusUnauthorized
		if errors.Is(err, account.ErrThrottled) {
			status = http.StatusTooManyRequests
		}
		return s.render(w, r, status, "login.html", nil, Page{Title: "Sign in", Section: "login", Error: err.Error()})
	}
	if err != nil {
		return internal(err)
	}
	if c, err := r.Cookie(SessionCookie); err == nil && c.Value != "" {
		if err := s.opts.Accounts.EndSession(r.Context(), c.Value); err != nil {
			return internal(err)
		}
	}
	id, _, err := s.opts.Accounts.StartSession(r.Context(), a.ID)
	if err != nil {
		return internal(err)
	}
	s.setSessionCookie(w, r, id)
	http.Redirect(w, r, "/dashboard", http.StatusSeeOther)
	return nil
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, se *session) error {
	if err := s.opts.Accounts.EndSession(r.Context(), se.id); err != nil {
		return internal(err)
	}
	s.clearSessionCookie(w, r)
	http.Redirect(w, r, "/login?notice=signed-out", http.StatusSeeOther)
	return nil
}

func (s *Server) logoutEverywhere(w http.ResponseWriter, r *http.Request, se *session) error {
	if err := s.opts.Accounts.EndAllSessions(r.Context(), se.account.ID); err != nil {
		return internal(err)
	}
	s.clearSessionCookie(w, r)
	http.Redirect(w, r, "/login?notice=signed-out-everywhere", http.StatusSeeOther)
	return nil
}

type signupData struct {
	Allowed             bool
	Invite, Email, Name string
}

func (s *Server) signupPage(w http.ResponseWriter, r *http.Request, se *session) error {
	p := Page{Title: "Create an account", Section: "signup"}
	d := signupData{Invite: r.URL.Query().Get("invite")}
	switch mode := s.opts.Accounts.Signup(); {
	case mode == account.SignupClosed:
		p.Error = account.ErrSignupClosed.Error()
	case d.Invite != "":
		tok, err := s.opts.Accounts.PeekInvite(r.Context(), d.Invite)
		if errors.Is(err, account.ErrBadLink) {
			p.Error = err.Error()
			break
		}
		if err != nil {
			return internal(err)
		}
		d.Allowed, d.Email = true, tok.Email
	case mode == account.SignupInvite:
		p.Error = account.ErrInviteRequired.Error()
	default:
		d.Allowed = true
	}
	p.Data = d
	return s.render(w, r, http.StatusOK, "signup.html", se, p)
}

func (s *Server) signup(w http.ResponseWriter, r *http.Request, se *session) error {
	in := account.SignUp{Email: r.PostFormValue("email"), Name: r.PostFormValue("name"),
		Password: r.PostFormValue("password"), Invite: r.PostFormValue("invite"), IP: s.clientIP(r)}
	a, err := s.opts.Accounts.SignUp(r.Context(), in)
	if err != nil {
		if isAccountError(err) {
			status := http.StatusBadRequest
			if errors.Is(err, account.ErrSignupThrottled) || errors.Is(err, account.ErrSignupBusy) {
				status = http.StatusTooManyRequests
			}
			return s.render(w, r, status, "signup.html", se, Page{Title: "Create an account", Section: "signup", Error: err.Error(),
				Data: signupData{Allowed: true, Invite: in.Invite, Email: in.Email, Name: in.Name}})
		}
		return internal(err)
	}
	// The page says what happens next, rather than leaving the person at
	// an empty sign-in form.
	p := Page{Title: "Your account is ready", Data: signupDone{Email: a.Email, Verify: a.VerifiedAt.IsZero()}}
	return s.render(w, r, http.StatusOK, "signup-done.html", se, p)
}

type signupDone struct {
	Email  string
	Verify bool // a verification link was mailed
}

func isAccountError(err error) bool {
	for _, e := range []error{account.ErrSignupThrottled, account.ErrSignupBusy, account.ErrSignupClosed, account.ErrInviteRequired, account.ErrBadLink, account.ErrEmailTaken,
		account.ErrInviteEmail, account.ErrBadEmail, account.ErrBadName, account.ErrWeakPassword} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (s *Server) verify(w http.ResponseWriter, r *http.Request, se *session) error {
	p := Page{Title: "Email verified", Notice: "Thank you: your email is verified."}
	if _, err := s.opts.Accounts.Verify(r.Context(), r.URL.Query().Get("token")); errors.Is(err, account.ErrBadLink) {
		p = Page{Title: "Verification failed", Error: err.Error()}
	} else if err != nil {
		return internal(err)
	}
	return s.render(w, r, http.StatusOK, "message.html", se, p)
}

func (s *Server) resendVerification(w http.ResponseWriter, r *http.Request, se *session) error {
	if err := s.opts.Accounts.SendVerification(r.Context(), se.account); err != nil {
		return &Error{Kind: KindUnavailable, Msg: "the email could not be sent; try again later", Err: err}
	}
	http.Redirect(w, r, "/dashboard", http.StatusSeeOther)
	return nil
}

type resetData struct {
	Token string
	Email bool // the request form (the server sends email)
}

func (s *Server) resetPage(w http.ResponseWriter, r *http.Request, se *session) error {
	d := resetData{Token: r.URL.Query().Get("token"), Email: s.opts.Accounts.EmailEnabled()}
	return s.render(w, r, http.StatusOK, "reset.html", se, Page{Title: "Reset your password", Data: d})
}

func (s *Server) requestReset(w http.ResponseWriter, r *http.Request, se *session) error {
	if err := s.opts.Accounts.RequestReset(r.Context(), r.PostFormValue("email")); err != nil {
		s.log.Warn("sending a reset email", "error", err)
	}
	return s.render(w, r, http.StatusOK, "message.html", se, Page{Title: "Check your email",
		Notice: "If an account has this email, a reset link is on its way. It works for one hour."})
}

func (s *Server) confirmReset(w http.ResponseWriter, r *http.Request, se *session) error {
	token := r.PostFormValue("token")
	err := s.opts.Accounts.ResetPassword(r.Context(), token, r.PostFormValue("password"))
	if errors.Is(err, account.ErrBadLink) || errors.Is(err, account.ErrWeakPassword) {
		return s.render(w, r, http.StatusBadRequest, "reset.html", se, Page{Title: "Reset your password", Error: err.Error(),
			Data: resetData{Token: token}})
	}
	if err != nil {
		return internal(err)
	}
	http.Redirect(w, r, "/login?notice=password-changed", http.StatusSeeOther)
	return nil
}

// sessionInfo tells the playground whether it may run without a key.
// Same-origin only: without CORS headers another origin cannot read it.
func (s *Server) sessionInfo(w http.ResponseWriter, r *http.Request, se *session) error {
	body := struct {
		SignedIn bool   `json:"signed_in"`
		Email    string `json:"email,omitempty"`
		CSRF     string `json:"csrf,omitempty"`
	}{}
	if se != nil && !se.account.VerifiedAt.IsZero() {
		body.SignedIn, body.Email, body.CSRF = true, se.account.Email, se.s.CSRF
	}
	return s.writeJSON(w, r, http.StatusOK, body)
}
