// Package account is who may use the dashboard: sign-up (open, by invite
// or closed), argon2id passwords, server-side sessions, one-time links for
// invites, email verification and password resets, and the throttling of
// sign-in attempts. It has no HTTP in it; internal/api serves the pages.
//
// Everything is kept in the store (the roles of Store), so sessions, tokens
// and throttling counters are shared by every node of a PostgreSQL pair.
// Session ids and link tokens are 256-bit random strings of which only
// the SHA-256 is stored.
package account

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/mail"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// Sign-up modes (serve --signup).
const (
	SignupOpen   = "open"   // anyone may create an account
	SignupInvite = "invite" // only with a link from `vertal invite` (the default)
	SignupClosed = "closed" // nobody, not even with an invite
)

// ValidSignup reports whether mode is a sign-up mode.
func ValidSignup(mode string) bool {
	return mode == SignupOpen || mode == SignupInvite || mode == SignupClosed
}

// Errors shown to the person at the form; each message is safe to show.
var (
	ErrSignInFailed = errors.New("the email or password is not right")
	ErrThrottled    = errors.New("too many sign-in attempts; wait 15 minutes and try again")
	// ErrSignupThrottled and ErrSignupBusy are the sign-up limits' answers
	// (per IP, and for the whole server).
	ErrSignupThrottled = errors.New("too many sign-ups from your network; wait 15 minutes and try again")
	ErrSignupBusy      = errors.New("too many sign-ups on this server right now; try again in a minute")
	ErrSignupClosed    = errors.New("sign-up is closed on this server")
	ErrInviteRequired  = errors.New("sign-up on this server needs an invite link from its operator")
	ErrBadLink         = errors.New("this link is not valid: it was used already, it expired, or it was mistyped")
	ErrEmailTaken      = errors.New("an account with this email exists already; sign in instead")
	ErrInviteEmail     = errors.New("this invite is for another email address")
	ErrBadEmail        = errors.New("enter a valid email address")
	ErrBadName         = errors.New("a name is at most 100 characters, without control characters")
	ErrWeakPassword    = errors.New("a password has 10 to 200 characters")
	ErrNoSession       = errors.New("not signed in")
	// ErrNoPublicURL is the answer of a link's maker on a service
	// without Options.PublicURL.
	ErrNoPublicURL = errors.New("links need the server's address: set --public-url (or VERTAL_PUBLIC_URL), e.g. https://vertalrun.com")
)

// Throttling of sign-in attempts, counted in the store's rate windows so
// every node sees the same counts: per email (known or not, so the answer
// does not tell them apart) and per client IP.
const (
	ThrottleWindow   = 15 * time.Minute
	MaxTriesPerEmail = 10
	// MaxResetsPerEmail bounds the reset emails one address gets per
	// ThrottleWindow, however often the form is sent: the form is open to
	// anyone, and must not become a way to flood someone's inbox.
	MaxResetsPerEmail = 3
	MaxTriesPerIP     = 50
)

// Throttling of sign-ups, in the same shared windows: per client IP, and
// for the whole server per minute as a backstop against many addresses
// at once. Every sign-up form sent counts (an accepted invite too), so
// the limit also bounds the argon2id work and the verification emails a
// client can cause.
const (
	MaxSignupsPerIP     = 5
	MaxSignupsPerMinute = 30
)

// Link lifetimes.
const (
	SessionTTL = 14 * 24 * time.Hour
	InviteTTL  = 7 * 24 * time.Hour
	VerifyTTL  = 48 * time.Hour
	ResetTTL   = time.Hour
)

// DefaultPlan is the plan of a tenant made by an open sign-up.
const DefaultPlan = "free"

// Store is what the service keeps: accounts, their sessions and one-time
// tokens, the tenant an account owns, and the rate windows that throttle
// sign-in attempts.
type Store interface {
	store.Accounts
	store.Sessions
	store.Tenants
	store.Quota
}

// Options configure a Service. Store is required.
type Options struct {
	Store Store
	// Signup is the sign-up mode; "" means SignupInvite.
	Signup string
	// Mailer sends verification and reset emails. Nil: no email, so new
	// accounts count as verified and resets go through `vertal reset-link`.
	Mailer Mailer
	// PublicURL is the server's origin as browsers see it
	// (https://vertalrun.com). Every link the service makes starts with
	// it, and only with it: a link built from a request's Host header
	// would let whoever sends the request choose where a mailed token
	// goes. Required with a Mailer; without one, links (invites, resets)
	// fail with ErrNoPublicURL.
	PublicURL string
	// Logger receives mail failures; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Service runs accounts. It is safe for concurrent use.
type Service struct {
	st     Store
	signup string
	mailer Mailer
	// publicURL starts every link (no trailing slash); "" refuses links.
	publicURL string
	log       *slog.Logger
	now       func() time.Time
	// hashing bounds concurrent argon2id computations (19 MiB each), so a
	// flood of sign-ins cannot exhaust memory.
	hashing chan struct{}
	dummy   string // a hash to check unknown emails against, for equal timing
}

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, errors.New("account: Store is required")
	}
	if opts.Signup == "" {
		opts.Signup = SignupInvite
	}
	if !ValidSignup(opts.Signup) {
		return nil, fmt.Errorf("account: sign-up mode %q is not open, invite or closed", opts.Signup)
	}
	if opts.PublicURL != "" {
		u, err := url.Parse(opts.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("account: PublicURL %q is not an http(s) origin", opts.PublicURL)
		}
	} else if opts.Mailer != nil {
		return nil, fmt.Errorf("account: a Mailer needs PublicURL: %w", ErrNoPublicURL)
	}
	s := &Service{st: opts.Store, signup: opts.Signup, mailer: opts.Mailer, log: opts.Logger, now: opts.Now,
		publicURL: strings.TrimRight(opts.PublicURL, "/"), hashing: make(chan struct{}, 4)}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.dummy = HashPassword(NewSecret())
	return s, nil
}

// Signup is the sign-up mode.
func (s *Service) Signup() string { return s.signup }

// EmailEnabled reports whether the service sends email.
func (s *Service) EmailEnabled() bool { return s.mailer != nil }

// NewSecret returns 256 random bits as 64 hex digits.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// HashSecret is what the store keeps of a session id or a link token.
func HashSecret(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

func (s *Service) hash(password string) string {
	s.hashing <- struct{}{}
	defer func() { <-s.hashing }()
	return HashPassword(password)
}

func (s *Service) check(hash, password string) bool {
	s.hashing <- struct{}{}
	defer func() { <-s.hashing }()
	ok, err := CheckPassword(hash, password)
	return err == nil && ok
}

// NormalizeEmail lower-cases and checks an email address.
func NormalizeEmail(email string) (string, error) {
	email = strings.ToLower(strings.TrimSpace(email))
	a, err := mail.ParseAddress(email)
	// A bare address only ("Name <addr>" is refused); quoted local parts
	// come back unquoted.
	if err != nil || a.Name != "" || strings.HasSuffix(email, ">") || len(a.Address) > 254 {
		return "", ErrBadEmail
	}
	return a.Address, nil
}

func checkName(name string) (string, error) {
	name = strings.TrimSpace(name)
	if len([]rune(name)) > 100 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", ErrBadName
	}
	return name, nil
}

func checkPassword(p string) error {
	if n := len([]rune(p)); n < 10 || n > 200 {
		return ErrWeakPassword
	}
	return nil
}

var notTenantChars = regexp.MustCompile(`[^a-z0-9]+`)

// newTenantName makes a tenant id from an email's local part and random
// digits, e.g. "ann-3fa2c1".
func newTenantName(email string) string {
	local, _, _ := strings.Cut(email, "@")
	base := strings.Trim(notTenantChars.ReplaceAllString(local, "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	if base == "" {
		base = "t"
	}
	return base + "-" + NewSecret()[:6]
}

// SignUp is what the sign-up form sends.
type SignUp struct {
	Email    string
	Name     string
	Password string
	Invite   string // the invite link's token, if any
	IP       string // the client's address, for the sign-up limit
}

// SignUp creates an account (and its tenant, unless the invite attaches an
// existing one). With a Mailer it sends the verification link; without one
// the account is verified at once.
func (s *Service) SignUp(ctx context.Context, in SignUp) (store.Account, error) {
	if s.signup == SignupClosed {
		return store.Account{}, ErrSignupClosed
	}
	if s.signup == SignupInvite && in.Invite == "" {
		return store.Account{}, ErrInviteRequired
	}
	if over, err := s.overLimit(ctx, limit{"signup-ip:" + in.IP, MaxSignupsPerIP, ThrottleWindow},
		limit{"signup-all", MaxSignupsPerMinute, time.Minute}); err != nil {
		return store.Account{}, err
	} else if over != nil {
		if over.key == "signup-all" {
			return store.Account{}, ErrSignupBusy
		}
		return store.Account{}, ErrSignupThrottled
	}
	email, err := NormalizeEmail(in.Email)
	if err != nil {
		return store.Account{}, err
	}
	name, err := checkName(in.Name)
	if err != nil {
		return store.Account{}, err
	}
	if err := checkPassword(in.Password); err != nil {
		return store.Account{}, err
	}
	now := s.now().UTC()
	tenant, plan := newTenantName(email), DefaultPlan
	if in.Invite != "" {
		tok, err := s.st.PeekToken(ctx, HashSecret(in.Invite), store.TokenInvite, now)
		if errors.Is(err, store.ErrNotFound) {
			return store.Account{}, ErrBadLink
		}
		if err != nil {
			return store.Account{}, err
		}
		if tok.Email != email {
			return store.Account{}, ErrInviteEmail
		}
		if _, err := s.st.AccountByEmail(ctx, email); err == nil {
			return store.Account{}, ErrEmailTaken
		}
		// Consumed only now, so a typo in the form does not burn the link.
		if tok, err = s.st.UseToken(ctx, HashSecret(in.Invite), store.TokenInvite, now); errors.Is(err, store.ErrNotFound) {
			return store.Account{}, ErrBadLink
		} else if err != nil {
			return store.Account{}, err
		}
		if tok.Tenant != "" {
			tenant = tok.Tenant
		}
		if tok.Plan != "" {
			plan = tok.Plan
		}
	}
	a := store.Account{ID: "acc_" + NewSecret()[:16], Email: email, Name: name, PasswordHash: s.hash(in.Password),
		Tenant: tenant, Role: store.RoleUser, CreatedAt: now}
	if s.mailer == nil {
		a.VerifiedAt = now
	}
	if err := s.st.CreateAccount(ctx, a, plan); errors.Is(err, store.ErrExists) {
		return store.Account{}, ErrEmailTaken
	} else if err != nil {
		return store.Account{}, err
	}
	if s.mailer != nil {
		if err := s.SendVerification(ctx, a); err != nil {
			s.log.Warn("sending the verification email", "account", a.ID, "error", err)
		}
	}
	return a, nil
}

func (s *Service) newToken(ctx context.Context, t store.Token, ttl time.Duration) (string, error) {
	secret := NewSecret()
	t.Hash = HashSecret(secret)
	t.CreatedAt = s.now().UTC()
	t.ExpiresAt = t.CreatedAt.Add(ttl)
	if err := s.st.CreateToken(ctx, t); err != nil {
		return "", err
	}
	return secret, nil
}

// link returns the page at path with query key=secret on the configured
// origin, never on one a request named.
func (s *Service) link(path, key, secret string) (string, error) {
	if s.publicURL == "" {
		return "", ErrNoPublicURL
	}
	return s.publicURL + path + "?" + url.Values{key: {secret}}.Encode(), nil
}

// SendVerification emails a's verification link.
func (s *Service) SendVerification(ctx context.Context, a store.Account) error {
	if s.mailer == nil {
		return errors.New("account: no SMTP server configured")
	}
	tok, err := s.newToken(ctx, store.Token{Kind: store.TokenVerify, Email: a.Email, AccountID: a.ID}, VerifyTTL)
	if err != nil {
		return err
	}
	link, err := s.link("/verify", "token", tok)
	if err != nil {
		return err
	}
	return s.mailer.Send(ctx, a.Email, "Verify your Vertal Run email",
		"Open this link to verify the email of your Vertal Run account:\n\n"+link+"\n\nIt works once, for 48 hours.\n")
}

// Verify consumes a verification link.
func (s *Service) Verify(ctx context.Context, token string) (store.Account, error) {
	tok, err := s.st.UseToken(ctx, HashSecret(token), store.TokenVerify, s.now())
	if errors.Is(err, store.ErrNotFound) {
		return store.Account{}, ErrBadLink
	}
	if err != nil {
		return store.Account{}, err
	}
	if err := s.st.MarkVerified(ctx, tok.AccountID, s.now()); err != nil {
		return store.Account{}, err
	}
	return s.st.AccountByID(ctx, tok.AccountID)
}

// Invite returns a one-time sign-up link for email on plan; tenant, if
// set, is an existing tenant (made with create-key) the account will own.
func (s *Service) Invite(ctx context.Context, email, plan, tenant string) (string, error) {
	if s.publicURL == "" {
		return "", ErrNoPublicURL
	}
	email, err := NormalizeEmail(email)
	if err != nil {
		return "", err
	}
	if tenant != "" {
		if _, err := s.st.Tenant(ctx, tenant); err != nil {
			return "", fmt.Errorf("tenant %s: %w", tenant, err)
		}
	}
	tok, err := s.newToken(ctx, store.Token{Kind: store.TokenInvite, Email: email, Tenant: tenant, Plan: plan}, InviteTTL)
	if err != nil {
		return "", err
	}
	return s.link("/signup", "invite", tok)
}

// PeekInvite returns the invite behind a link, to fill in the form.
func (s *Service) PeekInvite(ctx context.Context, token string) (store.Token, error) {
	tok, err := s.st.PeekToken(ctx, HashSecret(token), store.TokenInvite, s.now())
	if errors.Is(err, store.ErrNotFound) {
		return store.Token{}, ErrBadLink
	}
	return tok, err
}

// ResetLink returns a password reset link for the account with email
// (store.ErrNotFound if there is none): `vertal reset-link` prints it.
func (s *Service) ResetLink(ctx context.Context, email string) (string, error) {
	if s.publicURL == "" {
		return "", ErrNoPublicURL
	}
	if norm, err := NormalizeEmail(email); err == nil {
		email = norm
	}
	a, err := s.st.AccountByEmail(ctx, email)
	if err != nil {
		return "", err
	}
	tok, err := s.newToken(ctx, store.Token{Kind: store.TokenReset, Email: a.Email, AccountID: a.ID}, ResetTTL)
	if err != nil {
		return "", err
	}
	return s.link("/reset", "token", tok)
}

// RequestReset emails a reset link if an account has email; the caller
// answers the same either way.
func (s *Service) RequestReset(ctx context.Context, email string) error {
	if s.mailer == nil {
		return nil
	}
	norm, err := NormalizeEmail(email)
	if err != nil {
		return nil // no such account can exist
	}
	over, err := s.overLimit(ctx, limit{"reset-email:" + norm, MaxResetsPerEmail, ThrottleWindow})
	if err != nil {
		return err
	}
	if over != nil {
		s.log.Warn("password reset requests over the limit; no email sent", "window", ThrottleWindow.String())
		return nil
	}
	link, err := s.ResetLink(ctx, email)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.mailer.Send(ctx, email, "Reset your Vertal Run password",
		"Open this link to choose a new password:\n\n"+link+"\n\nIt works once, for one hour. If you did not ask for it, ignore this email.\n")
}

// ResetPassword consumes a reset link, sets the password and ends every
// session of the account.
func (s *Service) ResetPassword(ctx context.Context, token, password string) error {
	if err := checkPassword(password); err != nil {
		return err
	}
	tok, err := s.st.UseToken(ctx, HashSecret(token), store.TokenReset, s.now())
	if errors.Is(err, store.ErrNotFound) {
		return ErrBadLink
	}
	if err != nil {
		return err
	}
	if err := s.st.SetPassword(ctx, tok.AccountID, s.hash(password)); err != nil {
		return err
	}
	// Whoever could open the reset link proved the email, too.
	if err := s.st.MarkVerified(ctx, tok.AccountID, s.now()); err != nil {
		return err
	}
	return s.st.DeleteSessions(ctx, tok.AccountID)
}

// limit is one throttle: at most max events per window (fixed windows,
// aligned to the clock, counted in the store) under key.
type limit struct {
	key    string
	max    int64
	window time.Duration
}

// overLimit counts one event against each limit in turn and returns the
// first one it is over (nil if none); the limits after it are not
// counted.
func (s *Service) overLimit(ctx context.Context, limits ...limit) (*limit, error) {
	now := s.now().UTC()
	for i, l := range limits {
		n, err := s.st.CountRequest(ctx, l.key, now.Truncate(l.window))
		if err != nil {
			return nil, err
		}
		if n > l.max {
			return &limits[i], nil
		}
	}
	return nil, nil
}

// SignIn checks email and password, after counting the attempt against
// the email's and the IP's windows. An unknown email and a wrong password
// get the same error, after the same work.
func (s *Service) SignIn(ctx context.Context, email, password, ip string) (store.Account, error) {
	norm, err := NormalizeEmail(email)
	if err != nil {
		norm = strings.ToLower(strings.TrimSpace(email)) // unknown, but throttled all the same
	}
	if over, err := s.overLimit(ctx, limit{"signin-email:" + norm, MaxTriesPerEmail, ThrottleWindow},
		limit{"signin-ip:" + ip, MaxTriesPerIP, ThrottleWindow}); err != nil {
		return store.Account{}, err
	} else if over != nil {
		return store.Account{}, ErrThrottled
	}
	a, err := s.st.AccountByEmail(ctx, norm)
	if errors.Is(err, store.ErrNotFound) {
		s.check(s.dummy, password)
		return store.Account{}, ErrSignInFailed
	}
	if err != nil {
		return store.Account{}, err
	}
	if !s.check(a.PasswordHash, password) {
		return store.Account{}, ErrSignInFailed
	}
	return a, nil
}

// StartSession makes a new session for the account and returns its id
// (for the cookie; the store keeps its hash only) and the session. The
// caller ends the session the browser had before, so an id planted in the
// browser before sign-in is never the signed-in one.
func (s *Service) StartSession(ctx context.Context, accountID string) (string, store.Session, error) {
	id := NewSecret()
	now := s.now().UTC()
	se := store.Session{Hash: HashSecret(id), AccountID: accountID, CSRF: NewSecret(), CreatedAt: now, ExpiresAt: now.Add(SessionTTL)}
	if err := s.st.CreateSession(ctx, se); err != nil {
		return "", store.Session{}, err
	}
	return id, se, nil
}

// Session returns the live session with id and its account; ErrNoSession
// if there is none.
func (s *Service) Session(ctx context.Context, id string) (store.Session, store.Account, error) {
	if len(id) != 64 {
		return store.Session{}, store.Account{}, ErrNoSession
	}
	se, err := s.st.SessionByHash(ctx, HashSecret(id), s.now())
	if errors.Is(err, store.ErrNotFound) {
		return store.Session{}, store.Account{}, ErrNoSession
	}
	if err != nil {
		return store.Session{}, store.Account{}, err
	}
	a, err := s.st.AccountByID(ctx, se.AccountID)
	if err != nil {
		return store.Session{}, store.Account{}, err
	}
	return se, a, nil
}

// EndSession signs one browser out.
func (s *Service) EndSession(ctx context.Context, id string) error {
	return s.st.DeleteSession(ctx, HashSecret(id))
}

// EndAllSessions signs the account out everywhere.
func (s *Service) EndAllSessions(ctx context.Context, accountID string) error {
	return s.st.DeleteSessions(ctx, accountID)
}
