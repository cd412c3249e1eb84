package store

import (
	"context"
	"errors"
	"time"
)

// ErrSandboxLimit: the tenant already holds the most sandboxes (running or
// paused) its plan allows.
var ErrSandboxLimit = errors.New("store: sandbox limit reached")

// ErrSandboxState: the sandbox is not in the status the update expected
// (another call moved it first).
var ErrSandboxState = errors.New("store: sandbox is not in the expected status")

// Sandbox is the record of one sandbox that stays (package sandboxes).
// Status is "running", "paused" or "ended".
type Sandbox struct {
	ID           string // "sbx_" + 32 hex
	Tenant       string
	KeyID        string
	Status       string
	Reason       string // when ended
	Message      string // for reason error
	Image        string
	ImageVersion string
	Limits       []byte            // the sandbox's limits, a JSON object the service reads
	Metadata     map[string]string // never nil once read
	Env          map[string]string // never nil once read
	OnTimeout    string
	TimeoutS     int    // the last timeout asked for (create or extension), reused on resume
	Node         string // the node that holds (or held) it live
	CreatedAt    time.Time
	StartedAt    time.Time // when its current (or last) live period began
	ExpiresAt    time.Time
	EndedAt      time.Time // zero until ended
	AliveSeconds float64   // metered so far (closed live periods)
	CPUSeconds   float64
	ArchivePath  string // the saved home of a paused one
	ArchiveBytes int64
	// AccessToken is the E2B data plane's token for this sandbox (its
	// envdAccessToken); "" for one made through /v1. Set at create only.
	AccessToken string
}

// SandboxPage selects a page of a tenant's sandboxes, newest first
// (created_at, then id, descending).
type SandboxPage struct {
	Status string // "" is any
	// Before, when BeforeID is set, continues after the row (Before,
	// BeforeID) of the previous page.
	Before   time.Time
	BeforeID string
	Limit    int // at most this many; below 1 is none
}

// Sandboxes keeps sandboxes that stay. Every method but NodeSandboxes and
// SandboxByID is scoped to a tenant: another tenant's sandbox is ErrNotFound.
type Sandboxes interface {
	// CreateSandbox inserts sb if its tenant holds fewer than max
	// sandboxes that have not ended; ErrSandboxLimit otherwise. Count and
	// insert are one transaction, serialized per tenant, so parallel
	// creates never pass max.
	CreateSandbox(ctx context.Context, sb Sandbox, max int) error
	// Sandbox returns tenant's sandbox; ErrNotFound otherwise.
	Sandbox(ctx context.Context, tenant, id string) (Sandbox, error)
	// ListSandboxes returns a page of tenant's sandboxes.
	ListSandboxes(ctx context.Context, tenant string, p SandboxPage) ([]Sandbox, error)
	// UpdateSandbox replaces the mutable fields of sb (status, reason,
	// message, node, started, expires and ended times, usage, archive,
	// timeout) if the stored status is from: ErrNotFound if there is no
	// such sandbox of sb.Tenant, ErrSandboxState if its status is another.
	UpdateSandbox(ctx context.Context, sb Sandbox, from string) error
	// SandboxByID returns the sandbox id of any tenant; ErrNotFound if
	// there is none. Only for a credential that names the sandbox itself
	// (the E2B data plane's access token), which the caller then checks.
	SandboxByID(ctx context.Context, id string) (Sandbox, error)
	// NodeSandboxes lists the sandboxes of every tenant with status held
	// by node, by id.
	NodeSandboxes(ctx context.Context, node, status string) ([]Sandbox, error)
	// CountSandboxes counts tenant's running and paused sandboxes.
	CountSandboxes(ctx context.Context, tenant string) (running, paused int, err error)
	// AddSandboxUsage adds u (a closed live period's) to tenant's sandbox
	// metering of day.
	AddSandboxUsage(ctx context.Context, tenant, day string, u SandboxUsage) error
	// PurgeSandboxes deletes the records of sandboxes that ended before
	// before (the retention period), of every tenant, and returns how many.
	PurgeSandboxes(ctx context.Context, before time.Time) (int64, error)
	// SandboxUsage is tenant's sandbox metering of day (zero if none).
	SandboxUsage(ctx context.Context, tenant, day string) (SandboxUsage, error)
}

// SandboxUsage is a tenant's sandbox metering: alive and CPU seconds, and
// the bytes its egress proxies carried in and out.
type SandboxUsage struct {
	AliveSeconds, CPUSeconds        float64
	NetworkBytesIn, NetworkBytesOut int64
}
