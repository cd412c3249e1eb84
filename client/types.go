package client

import (
	"time"

	"encoding/base64"
	"encoding/json"
	"fmt"
)

// Status is the outcome of an execution.
type Status string

// Execution outcomes. Only StatusSucceeded means the program exited 0;
// the other final ones are still results (HTTP 200), not errors.
// StatusQueued and StatusRunning are not final: an execution shows them
// while it waits for a sandbox or runs (Submit, Get, Wait).
const (
	StatusSucceeded      Status = "succeeded"
	StatusFailed         Status = "failed"
	StatusTimedOut       Status = "timed_out"
	StatusMemoryExceeded Status = "memory_exceeded"
	StatusError          Status = "error"
	StatusCanceled       Status = "canceled"
	StatusQueued         Status = "queued"
	StatusRunning        Status = "running"
)

// Final reports whether an execution with this status has ended: every
// status but queued and running, including ones this version does not
// know.
func (s Status) Final() bool { return s != StatusQueued && s != StatusRunning }

// Execution is one execution: finished when Run, Wait or a result event
// returns it; queued (or already final) when Submit or Batch does; in any
// state from Get.
type Execution struct {
	ID         string `json:"id"`
	Status     Status `json:"status"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	DurationMS int64  `json:"duration_ms"`
	// Truncated is true when stdout or stderr went over the per-stream cap
	// (64 KB) and the rest was discarded.
	Truncated bool           `json:"truncated"`
	Usage     ExecutionUsage `json:"usage"`
	RequestID string         `json:"request_id"`
	// IdempotentReplay is true when the server answered an earlier request
	// with the same Idempotency-Key instead of running the code again.
	IdempotentReplay bool `json:"idempotent_replay,omitempty"`
	// Language and CreatedAt (Unix seconds) are set by Get.
	Language  string `json:"language,omitempty"`
	CreatedAt int64  `json:"created_at,omitempty"`
	// Image is the image the execution runs on ("default" when the request
	// named none) and ImageVersion the id of that image's build it was
	// given (the Version of Images' entry at the time). ImageVersion is
	// empty for an image not built by vertal image build; both are empty
	// for an execution stored by a server that did not record them.
	Image        string `json:"image,omitempty"`
	ImageVersion string `json:"image_version,omitempty"`
	// Files are the files the program left in its working directory that
	// matched WithReturnFiles, decoded. FilesTruncated is true when the
	// plan's count or size cap left some out.
	Files          []ReturnedFile `json:"files,omitempty"`
	FilesTruncated bool           `json:"files_truncated,omitempty"`
	// Reason says why an execution ended as error or canceled without
	// running to its end (e.g. the node running it died); empty otherwise.
	Reason string `json:"reason,omitempty"`
	// Webhook is the delivery state of the execution's webhook (Submit or
	// Batch with a webhook URL); nil when it has none.
	Webhook *WebhookState `json:"webhook,omitempty"`

	// Raw is the response body exactly as received, including fields this
	// version of the package does not know.
	Raw json.RawMessage `json:"-"`
}

// WebhookState is where the delivery of an execution's result to its
// webhook URL stands. Delivery is at least once: a receiver dedupes by the
// Vertal-Delivery header.
type WebhookState struct {
	URL string `json:"url"`
	// State is DeliveryPending until a delivery got a 2xx answer
	// (DeliveryDelivered) or the server gave up retrying (DeliveryFailed).
	State    DeliveryState `json:"state"`
	Attempts int           `json:"attempts"`
	// LastStatus is the HTTP status of the last attempt, nil when it got
	// no answer (or none was made yet); LastError says what went wrong
	// with it, nil after a success.
	LastStatus *int    `json:"last_status"`
	LastError  *string `json:"last_error"`
}

// DeliveryState is the state of a webhook delivery.
type DeliveryState string

// Webhook delivery states.
const (
	DeliveryPending   DeliveryState = "pending"
	DeliveryDelivered DeliveryState = "delivered"
	DeliveryFailed    DeliveryState = "failed"
)

// ReturnedFile is one file an execution handed back.
type ReturnedFile struct {
	// Path is relative to the program's working directory, '/'-separated.
	Path string
	// Size is the file's size in bytes, as the server reports it.
	Size int64
	// Content is the file's bytes, decoded from the response's base64.
	Content []byte
}

// UnmarshalJSON decodes {"path", "size", "encoding", "content"}. The API
// always sends base64; "utf8" is accepted too so that a file written by
// hand in a test or a proxy reads the same.
func (f *ReturnedFile) UnmarshalJSON(b []byte) error {
	var w struct {
		Path     string `json:"path"`
		Size     int64  `json:"size"`
		Encoding string `json:"encoding"`
		Content  string `json:"content"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	f.Path, f.Size = w.Path, w.Size
	switch w.Encoding {
	case "", encodingBase64:
		c, err := base64.StdEncoding.DecodeString(w.Content)
		if err != nil {
			return fmt.Errorf("returned file %q: %w", w.Path, err)
		}
		f.Content = c
	case encodingUTF8:
		f.Content = []byte(w.Content)
	default:
		return fmt.Errorf("returned file %q: unknown encoding %q", w.Path, w.Encoding)
	}
	return nil
}

// ExecutionUsage is what one execution consumed.
type ExecutionUsage struct {
	SandboxSeconds  float64 `json:"sandbox_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes,omitempty"`
}

// Usage is today's consumption (UTC) and the plan's limits.
type Usage struct {
	Tenant string     `json:"tenant"`
	Plan   string     `json:"plan"`
	Today  UsageToday `json:"today"`
	Limits Limits     `json:"limits"`

	// Raw is the response body exactly as received.
	Raw json.RawMessage `json:"-"`
}

// UsageToday counts the current UTC day.
type UsageToday struct {
	Date           string  `json:"date,omitempty"` // YYYY-MM-DD, UTC
	Executions     int64   `json:"executions"`
	SandboxSeconds float64 `json:"sandbox_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds,omitempty"`
}

// Limits are a plan's limits. Servers may report more than these; read
// Usage.Raw for the rest.
type Limits struct {
	ExecutionsPerDay  int64 `json:"executions_per_day"`
	RequestsPerMinute int64 `json:"requests_per_minute"`
	MaxTimeoutS       int   `json:"max_timeout_s"`
	MemoryMB          int64 `json:"memory_mb,omitempty"` // per sandbox
}

// KeyRotation is the result of RotateKey. APIKey is shown only this once.
type KeyRotation struct {
	APIKey       string `json:"api_key"`
	KeyID        string `json:"key_id"`
	RevokedKeyID string `json:"revoked_key_id"`
	Plan         string `json:"plan"`
}

// Language is one language the server runs.
type Language struct {
	Name    string   `json:"name"`
	Version string   `json:"version,omitempty"`
	Aliases []string `json:"aliases,omitempty"`
}

// Image is one image the caller may run on (Images), with its languages
// and the packages it adds, which a program can import.
type Image struct {
	Name string `json:"name"`
	// Version identifies the image's current build; empty when unknown.
	Version   string     `json:"version,omitempty"`
	BuiltAt   time.Time  `json:"built_at,omitempty"`
	Languages []Language `json:"languages"`
	Packages  []Package  `json:"packages"`
}

// Package is one package an image adds.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Source is "apt" (Debian), "npm" or "pip".
	Source string `json:"source"`
}
