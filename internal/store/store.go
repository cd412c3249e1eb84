// Package store keeps tenants, API keys, executions, metering, quotas,
// rate-limit windows and idempotency records.
//
// Store is the seam, the union of small role interfaces (Keys, Quota,
// Executions, ...). internal/store/sqlstore implements it once over
// database/sql; internal/store/sqlite (the embedded default) and
// internal/store/postgres (several API nodes on one database) open it with
// their dialect. internal/store/storetest is the one behaviour suite both
// and the fake must pass.
// Every method is safe for concurrent use by many goroutines and, for
// PostgreSQL, by many processes: quota reservation, rate-limit counting,
// key rotation, idempotency claims, execution claims and aborts, and the
// creation of a webhook secret are atomic in the database.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

var (
	ErrNotFound      = errors.New("store: not found")
	ErrTooManyKeys   = errors.New("store: tenant already has the maximum number of active keys")
	ErrQuotaExceeded = errors.New("store: daily quota exceeded")
	// ErrFinished: the execution already has a final status, so it can no
	// longer be started, canceled or deleted.
	ErrFinished = errors.New("store: execution already finished")
	// ErrNotQueued: the execution is running already, so it cannot be
	// claimed (or canceled as queued) again.
	ErrNotQueued = errors.New("store: execution is not queued")
)

// The statuses of an execution that has not finished. Every other status
// (succeeded, failed, timed_out, memory_exceeded, canceled; see
// internal/engine) is final.
const (
	StatusQueued   = "queued"   // accepted, waiting for a sandbox slot
	StatusRunning  = "running"  // its sandbox is running
	StatusCanceled = "canceled" // ended by POST /v1/executions/{id}/cancel
)

// Final reports whether status is a final one.
func Final(status string) bool { return status != StatusQueued && status != StatusRunning }

// MaxActiveKeys is how many unrevoked keys one tenant may hold.
const MaxActiveKeys = 5

// Key is an API key's record. The secret itself is never stored: only the
// SHA-256 of it.
type Key struct {
	ID        string // public id, "key_" + 12 hex
	Tenant    string
	Plan      string // the tenant's plan
	CreatedAt time.Time
	RevokedAt time.Time // zero while active
	// LastUsedAt is when the key last authenticated a request (TouchKey),
	// to the minute; zero if never.
	LastUsedAt time.Time
	// TenantDisabled is set while an operator has disabled the tenant.
	TenantDisabled bool
}

// NewKey is what CreateKey and RotateKey insert.
type NewKey struct {
	ID     string
	Tenant string
	// Plan is the plan of a tenant this key creates. A key never changes
	// an existing tenant's plan (only SetPlan does), so a rotation cannot
	// carry back a plan read before an operator changed it. "" for a new
	// tenant is an error.
	Plan      string
	Hash      [32]byte
	CreatedAt time.Time
}

// Execution is one stored execution.
type Execution struct {
	ID              string // "exe_" + 32 hex
	Tenant          string
	KeyID           string
	RequestID       string
	Language        string
	Image           string // the image the request resolved (the default's name if it named none); "" in rows older than migration 0006
	ImageVersion    string // that image's build id when accepted; "" when unknown (not built by vertal image build)
	Status          string
	Stdout          string
	Stderr          string
	ExitCode        int
	DurationMS      int64
	Truncated       bool
	SandboxSeconds  float64
	CPUSeconds      float64
	PeakMemoryBytes int64
	CreatedAt       time.Time // when the execution was accepted
	StartedAt       time.Time // when its sandbox started; zero before (and if it never did)
	FinishedAt      time.Time // when it reached its final status; zero before
	// CancelRequested is set by RequestCancel; the node running the
	// execution sees it and ends the run. SaveExecution ignores it.
	CancelRequested bool
	// Purged is set by Purge, which blanked Stdout, Stderr and Files; SaveExecution
	// ignores it.
	Purged bool
	// Files are the files the program left that matched the request's
	// return_files, and FilesTruncated whether the plan's caps left some
	// out. Saved with the result.
	Files          []File
	FilesTruncated bool
	// Async is set for an execution accepted to run later (async: true or
	// a batch). Its Request is stored with it, so a queue worker on any
	// node can run it; its quota was reserved when it was accepted.
	Async   bool
	Request []byte
	// Owner is the node that runs (or ran) the execution: set when a sync
	// execution is accepted and when an async one is claimed; "" while an
	// async one waits in the queue. A node that dies leaves its owned
	// executions to be settled (AbortExecution) by the next one to look.
	Owner string
	// Reason says why an execution ended as error or canceled without
	// running to its end (a node that stopped, a cancel while queued).
	Reason string
	// Webhook is the delivery of the execution's result to its
	// webhook_url; nil when it has none.
	Webhook *Webhook
	// IdempotencyKey is the key whose running claim accepted this
	// execution, given to CreateExecution: the claim then names the
	// execution as pending, and AbortExecution completes the claim with
	// it. It is not read back.
	IdempotencyKey string
	// Network is what an execution with a network reached (its allowlist
	// and its traffic, JSON: execution.NetworkRecord); "" for one without.
	// Saved with the result; its bytes are metered with it (NetworkBytes).
	Network string
}

// NetworkBytes are the bytes in and out that e's network record holds
// (its "bytes_in" and "bytes_out"); 0 without one, or one that cannot be
// read.
func (e Execution) NetworkBytes() (in, out int64) {
	if e.Network == "" {
		return 0, 0
	}
	var n struct {
		In  int64 `json:"bytes_in"`
		Out int64 `json:"bytes_out"`
	}
	if json.Unmarshal([]byte(e.Network), &n) != nil {
		return 0, 0
	}
	return max(n.In, 0), max(n.Out, 0)
}

// Webhook is one execution's webhook and the state of its delivery.
type Webhook struct {
	URL        string
	DeliveryID string // "dlv_" + 32 hex, the same across retries
	State      string // WebhookPending, WebhookDelivered or WebhookFailed
	Attempts   int
	LastStatus int // HTTP status of the last answer; 0 if none came
	LastError  string
}

// Webhook delivery states.
const (
	WebhookPending   = "pending"
	WebhookDelivered = "delivered"
	WebhookFailed    = "failed"
)

// File is one returned file of an execution.
type File struct {
	Path    string
	Content []byte
}

// DayUsage is one tenant's metering for one UTC day.
type DayUsage struct {
	Executions     int64 // reservations (ReserveExecution minus RefundExecution), so it includes running ones
	SandboxSeconds float64
	CPUSeconds     float64
	// NetworkBytesIn and NetworkBytesOut are what the egress proxies of
	// its executions carried (Execution.NetworkBytes).
	NetworkBytesIn, NetworkBytesOut int64
}

// Idempotency is a claimed Idempotency-Key.
type Idempotency struct {
	Tenant      string
	Key         string
	BodyHash    string
	ExecutionID string // empty while the first request is still running; a batch's ids joined by ","
	CreatedAt   time.Time
}

// Store is the persistence seam: the union of the roles below, which one
// implementation (internal/store/sqlstore, over SQLite or PostgreSQL) and
// the fake (storefake) provide. A consumer asks for the roles it uses.
// Days are UTC dates formatted "2006-01-02" (another form is an error).
// Times are kept to the microsecond and come back in UTC.
type Store interface {
	Keys
	Tenants
	Accounts
	Sessions
	Quota
	Executions
	Idempotencies
	Nodes
	WebhookSecrets

	Close() error
}

// Keys keeps API keys.
type Keys interface {
	// CreateKey inserts a key, creating the tenant if needed and setting its
	// plan. ErrTooManyKeys if the tenant already has MaxActiveKeys active.
	CreateKey(ctx context.Context, k NewKey) (Key, error)
	// KeyByHash returns the active key with this hash; ErrNotFound for an
	// unknown or revoked key.
	KeyByHash(ctx context.Context, hash [32]byte) (Key, error)
	// RevokeKey revokes a key by id; ErrNotFound if unknown or already revoked.
	RevokeKey(ctx context.Context, keyID string, at time.Time) error
	// RotateKey revokes oldKeyID and inserts k in one transaction.
	RotateKey(ctx context.Context, oldKeyID string, k NewKey) (Key, error)
	// ListKeys lists keys (active and revoked) of tenant, or of all tenants
	// when tenant is "".
	ListKeys(ctx context.Context, tenant string) ([]Key, error)
	// TouchKey records that a key was used at at; it only moves LastUsedAt
	// forward.
	TouchKey(ctx context.Context, keyID string, at time.Time) error
}

// Quota counts executions against the daily quota, requests against the
// rate limit, and the metering of each day.
type Quota interface {
	// ReserveExecution atomically counts one execution for tenant on day if
	// fewer than limit were counted; ErrQuotaExceeded otherwise. It returns
	// the count including this one. A limit below 1 allows nothing.
	ReserveExecution(ctx context.Context, tenant, day string, limit int64) (used int64, err error)
	// RefundExecution undoes one reservation when nothing ran.
	RefundExecution(ctx context.Context, tenant, day string) error
	// ReserveExecutions counts n executions at once (a batch), all or
	// none: ErrQuotaExceeded, counting nothing, if fewer than n are left.
	// n below 1 is an error (not ErrQuotaExceeded).
	ReserveExecutions(ctx context.Context, tenant, day string, n, limit int64) (used int64, err error)
	// RefundExecutions undoes n reservations, never going below zero; n
	// of 0 does nothing and a negative n is an error.
	RefundExecutions(ctx context.Context, tenant, day string, n int64) error
	// CountRequest adds one request to tenant's fixed one-minute window
	// starting at window and returns the count including it.
	CountRequest(ctx context.Context, tenant string, window time.Time) (count int64, err error)
	// Usage returns tenant's metering for day (zero if none).
	Usage(ctx context.Context, tenant, day string) (DayUsage, error)
}

// Executions keeps executions from acceptance to their final status.
type Executions interface {
	// CreateExecution stores an accepted execution that has not finished
	// (Status queued or running), before anything is acknowledged. It adds
	// nothing to usage. A duplicate id is an error.
	CreateExecution(ctx context.Context, e Execution) error
	// CreateExecutions stores several accepted executions (a batch) in one
	// transaction: all or none.
	CreateExecutions(ctx context.Context, es []Execution) error
	// StartExecution moves a queued execution to running, with StartedAt
	// at. ErrNotFound if there is none; ErrFinished if it has finished.
	StartExecution(ctx context.Context, tenant, id string, at time.Time) error
	// ClaimExecution moves a queued execution to running on node owner,
	// with StartedAt at, so exactly one queue worker runs it. ErrNotQueued
	// if it is running already; ErrFinished if it has finished;
	// ErrNotFound if unknown.
	ClaimExecution(ctx context.Context, tenant, id, owner string, at time.Time) error
	// AbortExecution ends a non-final execution whose status is one of
	// from with status (error or canceled) and reason, at at, without
	// adding usage, and returns it. A running idempotency claim that
	// accepted it (see Execution.IdempotencyKey) is completed with it in
	// the same transaction, so a retry replays the settled execution. ErrFinished if it has finished;
	// ErrNotQueued if its status is not in from; ErrNotFound if unknown.
	// Two nodes settling the same execution: exactly one succeeds. A
	// status that is not final is an error, changing nothing.
	AbortExecution(ctx context.Context, tenant, id, status, reason string, from []string, at time.Time) (Execution, error)
	// OwnedExecutions lists the non-final executions owned by node, of
	// every tenant, by id.
	OwnedExecutions(ctx context.Context, owner string) ([]Execution, error)
	// QueuedAsync lists the async executions still queued that were
	// created before before, oldest first (then by id), at most limit (none
	// for a limit below 1).
	QueuedAsync(ctx context.Context, before time.Time, limit int) ([]Execution, error)
	// CountQueuedAsync counts tenant's async executions still queued: its
	// backlog, which the queue's fairness and cap look at.
	CountQueuedAsync(ctx context.Context, tenant string) (int64, error)
	// UpdateWebhook stores the state of an execution's webhook delivery.
	// ErrNotFound if the execution is unknown or has no webhook.
	UpdateWebhook(ctx context.Context, tenant, id string, w Webhook) error
	// SaveExecution stores a finished execution (a final Status): it
	// replaces the row CreateExecution wrote, or inserts one, and adds its
	// sandbox and CPU seconds to the tenant's usage for the day of
	// e.CreatedAt. Saving over a finished execution is an error.
	SaveExecution(ctx context.Context, e Execution) error
	// DeleteExecution removes an execution that never ran (refused while it
	// was queued). ErrFinished for a finished one; ErrNotFound if unknown.
	DeleteExecution(ctx context.Context, tenant, id string) error
	// RequestCancel records that tenant asked to cancel the execution and
	// returns it. ErrFinished if it has finished; ErrNotFound for unknown
	// ids and for other tenants' ids alike.
	RequestCancel(ctx context.Context, tenant, id string) (Execution, error)
	// Execution returns tenant's execution; ErrNotFound for unknown ids and
	// for other tenants' ids alike.
	Execution(ctx context.Context, tenant, id string) (Execution, error)
	// Purge blanks stdout/stderr, returned files and the stored Request of
	// executions created before t, whatever their status, and deletes
	// idempotency records and rate-limit windows older than t; metering is
	// kept. It returns how many executions were purged.
	Purge(ctx context.Context, before time.Time) (int64, error)
}

// Idempotencies keeps claimed Idempotency-Keys.
type Idempotencies interface {
	// ClaimIdempotency claims (tenant, key) for bodyHash. claimed is true if
	// this caller now owns it and must Complete or Release it. Otherwise rec
	// is the existing record (ExecutionID empty while it is still running).
	// Records created before staleBefore count as absent and are replaced.
	// So do running claims (ExecutionID empty) created before
	// abandonedBefore: their request can no longer be alive (its process
	// was killed), and they would otherwise block the key until
	// staleBefore. A completed record is judged by staleBefore alone.
	ClaimIdempotency(ctx context.Context, tenant, key, bodyHash string, now, staleBefore, abandonedBefore time.Time) (rec Idempotency, claimed bool, err error)
	// CompleteIdempotency attaches the finished execution to the claim.
	CompleteIdempotency(ctx context.Context, tenant, key, executionID string) error
	// ReleaseIdempotency drops a claim whose request ran nothing (refused
	// for quota, overload or a platform error), so a retry may run. A
	// completed claim is kept, and releasing an unknown claim is no error.
	ReleaseIdempotency(ctx context.Context, tenant, key string) error
}

// Nodes keeps the heartbeats of the nodes sharing the database.
type Nodes interface {
	// Heartbeat records that node is alive at at (inserting it the first
	// time), and the address other nodes reach it at ("" for none).
	Heartbeat(ctx context.Context, node, address string, at time.Time) error
	// NodeAddress is the address node last sent with a heartbeat;
	// ErrNotFound if it has none on record (never seen, or forgotten).
	NodeAddress(ctx context.Context, node string) (string, error)
	// StaleNodes lists the nodes whose last heartbeat is before before, by
	// id.
	StaleNodes(ctx context.Context, before time.Time) ([]string, error)
	// ForgetNode removes a node's heartbeat.
	ForgetNode(ctx context.Context, node string) error
}

// WebhookSecrets keeps each tenant's webhook signing secret.
type WebhookSecrets interface {
	// WebhookSecret returns tenant's webhook signing secret and when it was
	// made; a tenant without one gets create() stored first (two callers
	// racing get the same secret; create may be called by a loser too).
	WebhookSecret(ctx context.Context, tenant string, create func() string, at time.Time) (secret string, created time.Time, err error)
	// RotateWebhookSecret replaces tenant's secret, or sets its first.
	RotateWebhookSecret(ctx context.Context, tenant, secret string, at time.Time) error
}
