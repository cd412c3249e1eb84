package client

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
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
// state from Get. It is decoded from the wire's wire.Execution, with
// fields the server sends as null given as their zero value.
type Execution struct {
	ID         string
	Status     Status
	Stdout     string
	Stderr     string
	ExitCode   int
	DurationMS int64
	// Truncated is true when stdout or stderr went over the per-stream cap
	// (64 KB) and the rest was discarded.
	Truncated bool
	Usage     ExecutionUsage
	RequestID string
	// IdempotentReplay is true when the server answered an earlier request
	// with the same Idempotency-Key instead of running the code again.
	IdempotentReplay bool
	// Language and CreatedAt (Unix seconds) are set by Get.
	Language  string
	CreatedAt int64
	// Image is the image the execution runs on ("default" when the request
	// named none) and ImageVersion the id of that image's build it was
	// given (the Version of Images' entry at the time). ImageVersion is
	// empty for an image not built by vertal image build; both are empty
	// for an execution stored by a server that did not record them.
	Image        string
	ImageVersion string
	// Files are the files the program left in its working directory that
	// matched WithReturnFiles, decoded. FilesTruncated is true when the
	// plan's count or size cap left some out.
	Files          []ReturnedFile
	FilesTruncated bool
	// Reason says why an execution ended as error or canceled without
	// running to its end (e.g. the node running it died); empty otherwise.
	Reason string
	// Webhook is the delivery state of the execution's webhook (Submit or
	// Batch with a webhook URL); nil when it has none.
	Webhook *WebhookState
	// Network is what an execution with a network (WithNetwork, or a plan
	// with an egress allowlist) could reach and did: its allowlist, the
	// bytes in and out, the connections made and refused, and its newest
	// attempts, each with why it was refused or cut. Nil for an execution
	// without a network; Usage.NetworkBytesIn and NetworkBytesOut are set
	// exactly when it is not.
	Network *wire.ExecutionNetwork

	// Raw is the response body exactly as received, including fields this
	// version of the package does not know.
	Raw json.RawMessage
}

// UnmarshalJSON decodes a wire.Execution and keeps b as Raw.
func (e *Execution) UnmarshalJSON(b []byte) error {
	var w wire.Execution
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	files, err := decodeFiles(w.Files)
	if err != nil {
		return err
	}
	*e = Execution{
		ID: w.ID, Status: Status(w.Status), Stdout: w.Stdout, Stderr: w.Stderr, ExitCode: w.ExitCode, DurationMS: w.DurationMS,
		Truncated: w.Truncated, Usage: w.Usage, RequestID: w.RequestID, IdempotentReplay: w.IdempotentReplay,
		Language: w.Language, CreatedAt: w.CreatedAt, Image: deref(w.Image), ImageVersion: deref(w.ImageVersion),
		Files: files, FilesTruncated: w.FilesTruncated, Reason: deref(w.Reason), Network: w.Network,
		Raw: append(json.RawMessage(nil), b...),
	}
	if h := w.Webhook; h != nil {
		e.Webhook = &WebhookState{URL: h.URL, State: DeliveryState(h.State), Attempts: h.Attempts, LastStatus: h.LastStatus, LastError: h.LastError}
	}
	return nil
}

// MarshalJSON writes Raw, the body as the server sent it; an Execution
// made by hand (no Raw) is written in the wire's shape.
func (e Execution) MarshalJSON() ([]byte, error) {
	if len(e.Raw) > 0 {
		return e.Raw, nil
	}
	w := wire.Execution{
		ID: e.ID, Status: string(e.Status), Stdout: e.Stdout, Stderr: e.Stderr, ExitCode: e.ExitCode, DurationMS: e.DurationMS,
		Truncated: e.Truncated, Usage: e.Usage, RequestID: e.RequestID, IdempotentReplay: e.IdempotentReplay,
		Language: e.Language, CreatedAt: e.CreatedAt, Image: nonEmpty(e.Image), ImageVersion: nonEmpty(e.ImageVersion),
		Files: make([]wire.ReturnedFile, len(e.Files)), FilesTruncated: e.FilesTruncated, Reason: nonEmpty(e.Reason),
		Network: e.Network,
	}
	for i, f := range e.Files {
		w.Files[i] = wire.ReturnedFile{Path: f.Path, Size: f.Size, Encoding: encodingBase64, Content: base64.StdEncoding.EncodeToString(f.Content)}
	}
	if h := e.Webhook; h != nil {
		w.Webhook = &wire.Webhook{URL: h.URL, State: string(h.State), Attempts: h.Attempts, LastStatus: h.LastStatus, LastError: h.LastError}
	}
	return json.Marshal(w)
}

// deref is *s, or "" for null.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// nonEmpty is &s, or nil (null, left out) for "".
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// WebhookState is where the delivery of an execution's result to its
// webhook URL stands. Delivery is at least once: a receiver dedupes by the
// Vertal-Delivery header.
type WebhookState struct {
	URL string
	// State is DeliveryPending until a delivery got a 2xx answer
	// (DeliveryDelivered) or the server gave up retrying (DeliveryFailed).
	State    DeliveryState
	Attempts int
	// LastStatus is the HTTP status of the last attempt, nil when it got
	// no answer (or none was made yet); LastError says what went wrong
	// with it, nil after a success.
	LastStatus *int
	LastError  *string
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

// UnmarshalJSON decodes a wire.ReturnedFile.
func (f *ReturnedFile) UnmarshalJSON(b []byte) error {
	var w wire.ReturnedFile
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	var err error
	*f, err = decodeFile(w)
	return err
}

// decodeFile decodes a returned file's content. The API always sends
// base64; "utf8" is accepted too so that a file written by hand in a test
// or a proxy reads the same.
func decodeFile(w wire.ReturnedFile) (ReturnedFile, error) {
	f := ReturnedFile{Path: w.Path, Size: w.Size}
	switch w.Encoding {
	case "", encodingBase64:
		c, err := base64.StdEncoding.DecodeString(w.Content)
		if err != nil {
			return ReturnedFile{}, fmt.Errorf("returned file %q: %w", w.Path, err)
		}
		f.Content = c
	case encodingUTF8:
		f.Content = []byte(w.Content)
	default:
		return ReturnedFile{}, fmt.Errorf("returned file %q: unknown encoding %q", w.Path, w.Encoding)
	}
	return f, nil
}

// decodeFiles decodes the returned files; nil stays nil, [] stays empty.
func decodeFiles(in []wire.ReturnedFile) ([]ReturnedFile, error) {
	if in == nil {
		return nil, nil
	}
	out := make([]ReturnedFile, len(in))
	for i, w := range in {
		f, err := decodeFile(w)
		if err != nil {
			return nil, err
		}
		out[i] = f
	}
	return out, nil
}

// ExecutionUsage is what one execution consumed: sandbox (wall-clock)
// seconds, CPU seconds and peak memory, and for an execution with a
// network the bytes its connections carried in and out (nil without).
type ExecutionUsage = wire.ExecutionUsage

// Usage is today's consumption (UTC) and the plan's limits.
type Usage struct {
	Tenant string
	Plan   string
	Today  UsageToday
	Limits Limits
	// Sandboxes is today's use of sandboxes that stay; nil when the
	// server does not serve them.
	Sandboxes *SandboxUsage

	// Raw is the response body exactly as received.
	Raw json.RawMessage
}

// UnmarshalJSON decodes a wire.Usage and keeps b as Raw.
func (u *Usage) UnmarshalJSON(b []byte) error {
	var w wire.Usage
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*u = Usage{Tenant: w.Tenant, Plan: w.Plan, Today: w.Today, Limits: w.Limits, Sandboxes: w.Sandboxes, Raw: append(json.RawMessage(nil), b...)}
	return nil
}

// MarshalJSON writes Raw, or the wire's shape for a Usage made by hand.
func (u Usage) MarshalJSON() ([]byte, error) {
	if len(u.Raw) > 0 {
		return u.Raw, nil
	}
	return json.Marshal(wire.Usage{Tenant: u.Tenant, Plan: u.Plan, Today: u.Today, Limits: u.Limits, Sandboxes: u.Sandboxes})
}

// UsageToday counts the current UTC day: Date is YYYY-MM-DD.
type UsageToday = wire.UsageToday

// Limits are a plan's limits (MemoryMB per sandbox). Servers may report
// more than these; read Usage.Raw for the rest.
type Limits = wire.Limits

// KeyRotation is the result of RotateKey. APIKey is shown only this once.
type KeyRotation = wire.KeyRotation

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
