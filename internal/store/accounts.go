package store

import (
	"context"
	"errors"
	"time"
)

// ErrExists: an account with this email, or an account for this tenant,
// is already there.
var ErrExists = errors.New("store: already exists")

// Tenant is one tenant: its plan and whether an operator disabled it.
// Only the operator paths (SetPlan, SetTenantDisabled, CreateTenant) write
// these; keys read them.
type Tenant struct {
	ID        string
	Plan      string
	Disabled  bool
	CreatedAt time.Time
}

// Account roles.
const (
	RoleUser     = "user"
	RoleOperator = "operator" // sees every tenant, changes plans, disables tenants
)

// Account is a person who signs in. It owns exactly one tenant.
type Account struct {
	ID           string // "acc_" + 16 hex
	Email        string // lower-cased; unique
	Name         string
	PasswordHash string // PHC string of the argon2id hash
	Tenant       string // unique: one account per tenant
	Role         string
	VerifiedAt   time.Time // zero until the email is verified
	CreatedAt    time.Time
}

// Session is a signed-in browser. Only the SHA-256 of the session id is
// stored, so a copy of the database signs nobody in.
type Session struct {
	Hash      [32]byte
	AccountID string
	CSRF      string // the token every state-changing form must echo
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Token kinds: one-time links.
const (
	TokenInvite = "invite" // sign up (or attach Tenant) with Email, on Plan
	TokenVerify = "verify" // verify AccountID's email
	TokenReset  = "reset"  // set AccountID's password
)

// Token is a one-time link; only its SHA-256 is stored.
type Token struct {
	Hash      [32]byte
	Kind      string
	Email     string
	AccountID string
	Tenant    string // invite: an existing tenant to attach, or "" for a new one
	Plan      string // invite: the plan of a new tenant
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Tenants keeps tenants' settings.
type Tenants interface {
	// CreateTenant inserts a tenant with no keys; ErrExists if it is there.
	CreateTenant(ctx context.Context, t Tenant) error
	// Tenant returns one tenant; ErrNotFound if unknown.
	Tenant(ctx context.Context, id string) (Tenant, error)
	// Tenants lists every tenant by id.
	Tenants(ctx context.Context) ([]Tenant, error)
	// SetPlan changes a tenant's plan (an operator path); ErrNotFound if
	// unknown. Keys never write the plan.
	SetPlan(ctx context.Context, tenant, plan string) error
	// SetTenantDisabled disables or enables a tenant; its keys and its
	// account's sessions are refused on the next request while disabled.
	SetTenantDisabled(ctx context.Context, tenant string, disabled bool) error
}

// Accounts keeps the accounts people sign in with.
type Accounts interface {
	// CreateAccount inserts a, creating its tenant on plan if there is none
	// (an existing tenant keeps its plan). ErrExists if the email or the
	// tenant already has an account.
	CreateAccount(ctx context.Context, a Account, plan string) error
	// AccountByEmail and AccountByID return ErrNotFound if unknown.
	AccountByEmail(ctx context.Context, email string) (Account, error)
	AccountByID(ctx context.Context, id string) (Account, error)
	// ListAccounts lists every account by email.
	ListAccounts(ctx context.Context) ([]Account, error)
	// SetPassword replaces an account's password hash.
	SetPassword(ctx context.Context, accountID, hash string) error
	// MarkVerified records that the account's email was verified at at.
	MarkVerified(ctx context.Context, accountID string, at time.Time) error
	// SetRole sets an account's role (RoleUser or RoleOperator).
	SetRole(ctx context.Context, accountID, role string) error
}

// Sessions keeps signed-in browsers and one-time tokens.
type Sessions interface {
	// CreateSession stores a new session.
	CreateSession(ctx context.Context, s Session) error
	// SessionByHash returns the session if it has not expired at now;
	// ErrNotFound otherwise.
	SessionByHash(ctx context.Context, hash [32]byte, now time.Time) (Session, error)
	// DeleteSession ends one session (no error if it is gone already).
	DeleteSession(ctx context.Context, hash [32]byte) error
	// DeleteSessions ends every session of an account ("sign out
	// everywhere", a password reset).
	DeleteSessions(ctx context.Context, accountID string) error

	// CreateToken stores a one-time token.
	CreateToken(ctx context.Context, t Token) error
	// UseToken consumes the token of kind with hash, unexpired at at, and
	// returns it; exactly one of several concurrent callers gets it, the
	// others (and any later one) get ErrNotFound.
	UseToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (Token, error)
	// PeekToken returns the token like UseToken without consuming it (to
	// show the form an invite or reset link opens).
	PeekToken(ctx context.Context, hash [32]byte, kind string, at time.Time) (Token, error)

	// PurgeExpired deletes the sessions expired at now and the one-time
	// tokens used or expired at now, and says how many of each went. Such
	// rows are refused already (SessionByHash, UseToken); this only keeps
	// the tables from growing.
	PurgeExpired(ctx context.Context, now time.Time) (sessions, tokens int64, err error)
}
