// Package sandboxes serves sandboxes that stay: one sandbox (sbx_…)
// across many calls, with commands, files, pause and resume. It keeps the
// record in the store, holds the node's live sandboxes (engine.Live, with
// an agent.Client each), ends them at their expiry, saves a paused one's
// home under the data dir, and meters their time.
//
// sandboxes.go holds the types the API is written against; service.go,
// commands.go and files.go the Service. Every method reports failures as
// *execution.Error (kinds from execution/errors.go): KindNotFound for a
// sandbox, process or path the caller cannot see (another tenant's
// sandbox is not found, never forbidden), KindSandboxNotRunning for a
// call that needs a running sandbox on an ended one (a paused one is
// resumed first, transparently), KindProcessFinished, KindSandboxLimit,
// KindPayloadTooLarge, KindInvalidRequest.
//
// What counts and what is metered:
//   - Quota: creating a sandbox and each command (foreground or
//     background) counts one execution toward the tenant's daily quota,
//     through the same atomic reservation executions use; it is given back
//     when the platform fails (the sandbox does not start, the sandbox or
//     its agent goes away during a command), never for the program's own
//     failure. Pause, resume, file calls and reads count nothing.
//   - Concurrency: a plan's max_sandboxes bounds the sandboxes a tenant
//     holds that have not ended, running or paused alike (a paused one
//     keeps its place and its saved home); the count and the insert are
//     one transaction in the store.
//   - Metering: each live period (create or resume, to pause or end) adds
//     its wall time and its cgroup's CPU seconds to the sandbox and to the
//     tenant's sandbox metering of the UTC day the period closes; Usage
//     adds the open periods of this node. A paused sandbox is not metered.
//
// Lifetime: expires_at is absolute; SetTimeout moves it up to the plan's
// maximum lifetime counted from the start of the current live period
// (created_at, then each resume). The agent's own deadline is expires_at
// plus 15 s, so the service's expiry (kill or pause) comes first and the
// agent's holds when the server is gone.
//
// Survives a pause: the files of the home (/home/user), as the agent
// archives them. Not processes, /tmp, or anything outside the home. A
// server stop (Shutdown) pauses every running sandbox; one recorded
// running on this node that is not live when the server starts (it was
// SIGKILLed or crashed) ends with reason node_lost. Calls about processes
// (stdin, signals, events, the command list) on a paused sandbox answer
// sandbox_not_running; commands and file calls resume it first.
package sandboxes

import (
	"io/fs"
	"time"
)

// Status of a sandbox.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusEnded   Status = "ended"
)

// Reasons an ended sandbox keeps.
const (
	ReasonKilled   = "killed"    // DELETE, or the tenant's key revoked
	ReasonExpired  = "expired"   // expires_at passed with on_timeout kill
	ReasonError    = "error"     // the platform failed; Message says how
	ReasonNodeLost = "node_lost" // its node died or restarted without pausing it
)

// Limits are a sandbox's resources as the client sees them.
type Limits struct {
	MemoryMB      int64   `json:"memory_mb"`
	CPUs          float64 `json:"cpus"`
	Pids          int64   `json:"pids"`
	HomeMB        int64   `json:"home_mb"`
	TmpMB         int64   `json:"tmp_mb"`
	OutputBytes   int     `json:"output_bytes"` // per stream, per foreground command
	MaxLifetimeS  int     `json:"max_lifetime_s"`
	MaxFileMB     int64   `json:"max_file_mb"` // one upload or download
	FileSizeBytes int64   `json:"file_size_bytes"`
	PausedMB      int64   `json:"paused_storage_mb"` // the largest saved home of a pause
	// Network is what the sandbox may reach (network.go); nil is nothing.
	Network *Network `json:"network,omitempty"`
}

// cgroupBytes is the memory limit of a live sandbox with l: the home is a
// tmpfs, whose pages the kernel charges to the sandbox's memory cgroup, so
// it comes on top of MemoryMB. Filling the home then leaves the processes
// their MemoryMB instead of ending them out of memory.
func (l Limits) cgroupBytes() int64 { return (l.MemoryMB + l.HomeMB) << 20 }

// Sandbox is the record of one sandbox.
type Sandbox struct {
	ID           string            `json:"id"`
	Status       Status            `json:"status"`
	Reason       string            `json:"reason,omitempty"`  // when ended
	Message      string            `json:"message,omitempty"` // for ReasonError
	Image        string            `json:"image"`
	ImageVersion string            `json:"image_version"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	EndedAt      *time.Time        `json:"ended_at,omitempty"`
	OnTimeout    string            `json:"on_timeout"` // "kill" or "pause"
	Limits       Limits            `json:"limits"`
	Metadata     map[string]string `json:"metadata"`
	// Usage so far: wall time alive (running, not paused) and CPU.
	AliveSeconds float64 `json:"alive_seconds"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	// Network is a running sandbox's traffic in its live period, when
	// Limits.Network allows any.
	Network *NetworkUsage `json:"network,omitempty"`
	// AccessToken is the E2B data plane's token of a sandbox made through
	// /e2b ("" otherwise); only the E2B routes show it, to its owner.
	AccessToken string `json:"-"`
	// LiveSince is when its current (or last) live period began, from
	// which the plan's maximum lifetime counts; KeyID is the key that
	// created it. Neither is on the /v1 wire.
	LiveSince time.Time `json:"-"`
	KeyID     string    `json:"-"`
	// PeakMemoryBytes is the peak memory of a running sandbox's cgroup
	// in its live period (0 if unknown); not on the /v1 wire.
	PeakMemoryBytes int64 `json:"-"`
}

// File is one file of CreateRequest, placed under the home directory.
type File struct {
	Path    string // relative to engine.HomeDir
	Content []byte
	Mode    fs.FileMode // 0 means 0644
}

// CreateRequest is POST /v1/sandboxes.
type CreateRequest struct {
	Image     string // "" is the default image
	TimeoutS  int    // 0 is the default (5 min, capped by the plan's lifetime)
	Env       map[string]string
	Metadata  map[string]string
	Files     []File
	OnTimeout string // "" is "kill"
	// Network narrows the plan's egress; nil takes the plan's.
	Network *NetworkRequest
	// AccessToken, for a sandbox made through the E2B API, is the token its
	// data plane calls must carry (see Service.ByAccessToken).
	AccessToken string `json:"-"`
}

// ListRequest is GET /v1/sandboxes.
type ListRequest struct {
	Status   Status            // "" is any
	Metadata map[string]string // every pair must match
	Limit    int               // 0 is 50; at most 100
	Cursor   string            // from the previous page's Next
}

// Page is one page of sandboxes, newest first.
type Page struct {
	Sandboxes []Sandbox
	Next      string // "" on the last page
}

// CommandRequest is POST /v1/sandboxes/{id}/commands.
type CommandRequest struct {
	Cmd        string   // a shell line (run by /bin/sh -c), or
	Argv       []string // an argv; exactly one of them
	Cwd        string   // default engine.HomeDir
	Env        map[string]string
	Stdin      string // written, then stdin closed (foreground); kept open if Background and empty
	TimeoutS   int    // foreground: 0 is 60 s or the plan's max_timeout_s if lower, and more than that maximum is refused; background: 0 is until the sandbox ends
	Background bool
}

// CommandResult is a foreground command's outcome, shaped as an
// execution's.
type CommandResult struct {
	PID        int     `json:"pid"`
	Status     string  `json:"status"` // succeeded, failed, timed_out, memory_exceeded
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	ExitCode   int     `json:"exit_code"`
	DurationMS int64   `json:"duration_ms"`
	Truncated  bool    `json:"truncated"`
	CPUSeconds float64 `json:"cpu_seconds"` // the sandbox's CPU during the command
}

// Command is one command of a sandbox, running or finished.
type Command struct {
	PID       int        `json:"pid"`
	Cmd       string     `json:"cmd,omitempty"`
	Argv      []string   `json:"argv,omitempty"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// Event is one event of a command, for SSE: "stdout", "stderr" (Data),
// then "exit" (ExitCode). Seq numbers a command's events from 1, for
// Last-Event-ID.
type Event struct {
	Seq      int64  `json:"-"`
	Type     string `json:"-"`
	Data     string `json:"data,omitempty"`
	ExitCode int    `json:"exit_code"`
}

// FileInfo is one entry of a listing or the answer to an upload.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mtime"`
}

// Usage is a tenant's sandbox time for GET /v1/usage, today (UTC).
type Usage struct {
	SandboxSeconds    float64 `json:"sandbox_seconds"`
	SandboxCPUSeconds float64 `json:"sandbox_cpu_seconds"`
	NetworkBytesIn    int64   `json:"network_bytes_in"`
	NetworkBytesOut   int64   `json:"network_bytes_out"`
	Running           int     `json:"running"`
	Paused            int     `json:"paused"`
}
