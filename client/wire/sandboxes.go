package wire

import "time"

// Sandboxes that stay: one sandbox (sbx_...) across many calls. Times are
// RFC 3339 in UTC.

// SandboxRequest is the body of POST /v1/sandboxes. Every field may be
// left out for the server's default.
type SandboxRequest struct {
	Image    *string           `json:"image,omitempty"`
	TimeoutS *float64          `json:"timeout_s,omitempty"` // whole seconds
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Files    []File            `json:"files,omitempty"` // placed under /home/user
	// OnTimeout is "kill" (the default) or "pause".
	OnTimeout *string `json:"on_timeout,omitempty"`
	// Network narrows the plan's egress allowlist; left out, the sandbox
	// gets the plan's (none on the built-in plans).
	Network *NetworkRequest `json:"network,omitempty"`
}

// NetworkRequest is a sandbox's allowlist: names ("pypi.org"), wildcards
// ("*.pythonhosted.org") and address prefixes, each within the plan's;
// empty is no network.
type NetworkRequest struct {
	Allow []string `json:"allow"`
}

// SandboxNetwork is limits.network: what the sandbox may reach, and the
// bytes in and out its connections may carry in all.
type SandboxNetwork struct {
	Allow    []string `json:"allow"`
	MaxBytes int64    `json:"max_bytes"`
}

// NetworkUsage is a running sandbox's traffic through its egress proxy
// in its current live period: bytes of its closed connections, how many
// were made and refused, and the newest attempts (at most 100).
type NetworkUsage struct {
	BytesIn     int64            `json:"bytes_in"`
	BytesOut    int64            `json:"bytes_out"`
	Connections int64            `json:"connections"`
	Refused     int64            `json:"refused"`
	Attempts    []NetworkAttempt `json:"attempts"`
}

// NetworkAttempt is one connection a sandbox asked for.
type NetworkAttempt struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	Kind     string `json:"kind"` // http or tls
	Allowed  bool   `json:"allowed"`
	Reason   string `json:"reason,omitempty"` // why it was refused or cut
	Addr     string `json:"addr,omitempty"`   // the address dialled
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
}

// Sandbox is one sandbox, as create, get, list, timeout, pause, resume
// and delete show it. Reason is set once it has ended (killed, expired,
// error, node_lost), Message for an error.
type Sandbox struct {
	ID           string            `json:"id"`
	Status       string            `json:"status"` // running, paused, ended
	Reason       *string           `json:"reason"`
	Message      *string           `json:"message"`
	Image        string            `json:"image"`
	ImageVersion string            `json:"image_version"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
	EndedAt      *time.Time        `json:"ended_at"`
	OnTimeout    string            `json:"on_timeout"`
	Limits       SandboxLimits     `json:"limits"`
	Metadata     map[string]string `json:"metadata"`
	// AliveSeconds is the wall time it has run (not paused); CPUSeconds
	// its CPU time.
	AliveSeconds float64 `json:"alive_seconds"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	// Network is set on a running sandbox with network.
	Network   *NetworkUsage `json:"network,omitempty"`
	RequestID string        `json:"request_id"`
}

// SandboxLimits are a sandbox's resources.
type SandboxLimits struct {
	MemoryMB      int64   `json:"memory_mb"`
	CPUs          float64 `json:"cpus"`
	Pids          int64   `json:"pids"`
	HomeMB        int64   `json:"home_mb"`
	TmpMB         int64   `json:"tmp_mb"`
	OutputBytes   int     `json:"output_bytes"` // per stream, per foreground command
	MaxLifetimeS  int     `json:"max_lifetime_s"`
	MaxFileMB     int64   `json:"max_file_mb"` // one upload or download
	FileSizeBytes int64   `json:"file_size_bytes"`
	// Network is what it may reach; left out, nothing.
	Network *SandboxNetwork `json:"network,omitempty"`
}

// SandboxList is the answer to GET /v1/sandboxes: newest first, and the
// cursor of the next page (null on the last).
type SandboxList struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	NextCursor *string   `json:"next_cursor"`
}

// SandboxTimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout:
// the sandbox then expires timeout_s from now.
type SandboxTimeoutRequest struct {
	TimeoutS *float64 `json:"timeout_s"`
}

// CommandRequest is the body of POST /v1/sandboxes/{id}/commands: Cmd (a
// shell line) or Argv, exactly one.
type CommandRequest struct {
	Cmd        *string           `json:"cmd,omitempty"`
	Argv       []string          `json:"argv,omitempty"`
	Cwd        *string           `json:"cwd,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Stdin      *string           `json:"stdin,omitempty"`
	TimeoutS   *float64          `json:"timeout_s,omitempty"`
	Background *bool             `json:"background,omitempty"`
}

// CommandResult is a foreground command's outcome, shaped as an
// execution's: Status is succeeded, failed, timed_out or memory_exceeded.
type CommandResult struct {
	PID        int          `json:"pid"`
	Status     string       `json:"status"`
	Stdout     string       `json:"stdout"`
	Stderr     string       `json:"stderr"`
	ExitCode   int          `json:"exit_code"`
	DurationMS int64        `json:"duration_ms"`
	Truncated  bool         `json:"truncated"`
	Usage      CommandUsage `json:"usage"`
	RequestID  string       `json:"request_id"`
}

// CommandUsage is what a foreground command consumed: the sandbox's CPU
// time while it ran.
type CommandUsage struct {
	CPUSeconds float64 `json:"cpu_seconds"`
}

// Command is one command of a sandbox, running or finished; a background
// command's start answers with it.
type Command struct {
	PID       int        `json:"pid"`
	Cmd       *string    `json:"cmd"`
	Argv      []string   `json:"argv"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
}

// CommandList is the answer to GET /v1/sandboxes/{id}/commands.
type CommandList struct {
	Commands []Command `json:"commands"`
}

// StdinRequest is the body of POST .../commands/{pid}/stdin: Data is
// written to the command's standard input, then it is closed if EOF.
type StdinRequest struct {
	Data *string `json:"data,omitempty"`
	EOF  *bool   `json:"eof,omitempty"`
}

// SignalRequest is the body of POST .../commands/{pid}/signal: TERM,
// KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT.
type SignalRequest struct {
	Signal *string `json:"signal"`
}

// ExitEvent is the data of a command stream's exit event.
type ExitEvent struct {
	ExitCode int `json:"exit_code"`
}

// FileEntry is a file inside a sandbox: one entry of a listing, or what
// an upload, mkdir or move made. Type is file, dir, symlink or other;
// Mode the octal permission bits ("0644").
type FileEntry struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mtime"`
}

// FileList is the answer to GET .../files?path= for a directory.
type FileList struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries"`
}

// PathRequest is the body of POST .../files/mkdir.
type PathRequest struct {
	Path *string `json:"path"`
}

// MoveRequest is the body of POST .../files/move.
type MoveRequest struct {
	From *string `json:"from"`
	To   *string `json:"to"`
}

// Ack is the answer to a call that has nothing else to say (stdin,
// signal, file delete).
type Ack struct {
	OK        bool   `json:"ok"`
	RequestID string `json:"request_id"`
}

// SandboxUsage is the sandboxes part of GET /v1/usage, today (UTC):
// their wall time alive and CPU time, and how many are running and
// paused now.
type SandboxUsage struct {
	SandboxSeconds  float64 `json:"sandbox_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	NetworkBytesIn  int64   `json:"network_bytes_in"`
	NetworkBytesOut int64   `json:"network_bytes_out"`
	Running         int     `json:"running"`
	Paused          int     `json:"paused"`
}

// ContextRequest is the body of POST /v1/sandboxes/{id}/contexts: a code
// context, an interpreter that keeps its state from one cell to the next.
// Language is python (the default) or javascript; Cwd defaults to the home.
type ContextRequest struct {
	Language *string `json:"language,omitempty"`
	Cwd      *string `json:"cwd,omitempty"`
}

// Context is one code context of a sandbox. Default marks a language's
// default context, used by a run that names no context_id.
type Context struct {
	ID        string    `json:"id"`
	Language  string    `json:"language"`
	Cwd       string    `json:"cwd"`
	Default   bool      `json:"default"`
	CreatedAt time.Time `json:"created_at"`
}

// ContextList is the answer to GET /v1/sandboxes/{id}/contexts.
type ContextList struct {
	Contexts []Context `json:"contexts"`
}

// RunCodeRequest is the body of POST /v1/sandboxes/{id}/run: Code runs
// in ContextID, or else in Language's default context.
type RunCodeRequest struct {
	Code      *string           `json:"code"`
	ContextID *string           `json:"context_id,omitempty"`
	Language  *string           `json:"language,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	TimeoutS  *float64          `json:"timeout_s,omitempty"`
}

// CodeOutput is one result of a cell, a MIME bundle: Data always has
// text/plain, and may have text/html, image/png (base64), image/svg+xml,
// text/markdown, text/latex, application/json. Main marks the value of
// the cell's last expression; the others are figures it displayed.
type CodeOutput struct {
	Main bool              `json:"main"`
	Data map[string]string `json:"data"`
}

// CodeError is what a cell raised or threw.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// RunCodeResult is a cell's outcome: Status is succeeded, failed (Error
// says what it raised) or timed_out (it was interrupted; the context
// stays).
type RunCodeResult struct {
	ContextID      string       `json:"context_id"`
	Status         string       `json:"status"`
	Stdout         string       `json:"stdout"`
	Stderr         string       `json:"stderr"`
	Results        []CodeOutput `json:"results"`
	Error          *CodeError   `json:"error"`
	ExecutionCount int          `json:"execution_count"`
	DurationMS     int64        `json:"duration_ms"`
	Truncated      bool         `json:"truncated"`
	Usage          CommandUsage `json:"usage"`
	RequestID      string       `json:"request_id"`
}
