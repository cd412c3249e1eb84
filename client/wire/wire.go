// Package wire holds the bodies of the Vertal Run HTTP API exactly as they
// travel: the one Go definition of each request and response. The server
// (internal/api) decodes requests into these types and encodes its answers
// from them; the client package sends these requests and builds its own
// friendlier types (decoded files, plain strings) from these answers.
//
// A pointer field is one the wire may leave out or send as null; a field
// without omitempty is always sent. The OpenAPI document served at
// /openapi.json describes the same shapes, and a test holds the two
// together. Use the client package to talk to a server; use this one to
// read or write the bodies yourself (a proxy, a webhook receiver, a test).
package wire

// ExecutionRequest is the body of POST /v1/executions, and one item of a
// batch. Language and Code are required; every other field may be left out
// for the server's default.
type ExecutionRequest struct {
	Image       *string           `json:"image,omitempty"`
	Language    *string           `json:"language"`
	Code        *string           `json:"code"`
	TimeoutS    *float64          `json:"timeout_s,omitempty"`
	Stdin       *string           `json:"stdin,omitempty"`
	Files       []File            `json:"files,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Args        []string          `json:"args,omitempty"`
	ReturnFiles []string          `json:"return_files,omitempty"`
	Async       *bool             `json:"async,omitempty"`
	WebhookURL  *string           `json:"webhook_url,omitempty"`
	// Network narrows the plan's egress allowlist; left out, the
	// execution gets the plan's (none on the built-in plans); an empty
	// allow is none.
	Network *NetworkRequest `json:"network,omitempty"`
}

// File is one file of a request, placed in the program's working
// directory. Encoding is "utf8" (the default) or "base64".
type File struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding"`
}

// Execution is one execution, as POST /v1/executions (run or replay), GET,
// cancel, a batch, a result event and a webhook show it. Null fields are
// ones not recorded (Image, ImageVersion) or not happened yet (StartedAt,
// FinishedAt).
type Execution struct {
	ID         string `json:"id"`
	Status     string `json:"status"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	DurationMS int64  `json:"duration_ms"`
	// Truncated is true when stdout or stderr went over its cap.
	Truncated    bool           `json:"truncated"`
	Usage        ExecutionUsage `json:"usage"`
	Language     string         `json:"language"`
	Image        *string        `json:"image"`
	ImageVersion *string        `json:"image_version"`
	// CreatedAt, StartedAt and FinishedAt are Unix seconds.
	CreatedAt      int64          `json:"created_at"`
	StartedAt      *int64         `json:"started_at"`
	FinishedAt     *int64         `json:"finished_at"`
	Files          []ReturnedFile `json:"files"`
	FilesTruncated bool           `json:"files_truncated"`
	Webhook        *Webhook       `json:"webhook"`
	// Reason says why an execution ended as error or canceled without
	// running to its end.
	Reason           *string `json:"reason"`
	IdempotentReplay bool    `json:"idempotent_replay,omitempty"`
	OutputPurged     bool    `json:"output_purged,omitempty"`
	RequestID        string  `json:"request_id"`
	// Network is what an execution with a network reached; absent for
	// one without.
	Network *ExecutionNetwork `json:"network,omitempty"`
}

// ExecutionUsage is what one execution consumed. The network bytes are
// there only for an execution with a network.
type ExecutionUsage struct {
	SandboxSeconds  float64 `json:"sandbox_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	NetworkBytesIn  *int64  `json:"network_bytes_in,omitempty"`
	NetworkBytesOut *int64  `json:"network_bytes_out,omitempty"`
}

// ExecutionNetwork is an execution's allowlist and its traffic through
// its egress proxy: bytes, connections made and refused, and the newest
// attempts (at most 100).
type ExecutionNetwork struct {
	Allow       []string         `json:"allow"`
	BytesIn     int64            `json:"bytes_in"`
	BytesOut    int64            `json:"bytes_out"`
	Connections int64            `json:"connections"`
	Refused     int64            `json:"refused"`
	Attempts    []NetworkAttempt `json:"attempts"`
}

// ReturnedFile is one file an execution handed back. The server always
// sends Content as base64.
type ReturnedFile struct {
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	Encoding string `json:"encoding"`
	Content  string `json:"content"`
}

// Webhook is an execution's webhook and where its delivery stands: State
// is pending, delivered or failed.
type Webhook struct {
	URL        string  `json:"url"`
	State      string  `json:"state"`
	Attempts   int     `json:"attempts"`
	LastStatus *int    `json:"last_status"`
	LastError  *string `json:"last_error"`
}

// BatchRequest is the body of POST /v1/executions/batch.
type BatchRequest struct {
	Executions []ExecutionRequest `json:"executions"`
	WebhookURL *string            `json:"webhook_url,omitempty"`
}

// BatchResponse is the answer to a batch: its executions, in order.
type BatchResponse struct {
	Executions []Execution `json:"executions"`
}

// Error is the one error shape: every refusal and failure, and the data of
// an error event.
type Error struct {
	Error     ErrorDetail `json:"error"`
	RequestID string      `json:"request_id"`
}

// ErrorDetail is what went wrong: Code is stable, Message is for people.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Usage is the body of GET /v1/usage: today's consumption (UTC) and the
// plan's limits.
type Usage struct {
	Tenant string     `json:"tenant"`
	Plan   string     `json:"plan"`
	Today  UsageToday `json:"today"`
	Limits Limits     `json:"limits"`
	// Sandboxes is there when the server serves sandboxes that stay.
	Sandboxes *SandboxUsage `json:"sandboxes,omitempty"`
}

// UsageToday counts the current UTC day.
type UsageToday struct {
	Date           string  `json:"date"` // YYYY-MM-DD, UTC
	Executions     int64   `json:"executions"`
	SandboxSeconds float64 `json:"sandbox_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	// NetworkBytesIn and NetworkBytesOut are what the egress proxies of
	// today's executions carried.
	NetworkBytesIn  int64 `json:"network_bytes_in"`
	NetworkBytesOut int64 `json:"network_bytes_out"`
}

// Limits are a plan's limits.
type Limits struct {
	ExecutionsPerDay  int64 `json:"executions_per_day"`
	RequestsPerMinute int64 `json:"requests_per_minute"`
	MaxTimeoutS       int   `json:"max_timeout_s"`
	MemoryMB          int64 `json:"memory_mb"` // per sandbox
}

// KeyRotation is the answer to POST /v1/keys/rotate. APIKey is shown only
// this once.
type KeyRotation struct {
	APIKey       string `json:"api_key"`
	KeyID        string `json:"key_id"`
	RevokedKeyID string `json:"revoked_key_id"`
	Plan         string `json:"plan"`
}

// WebhookSecret is the answer to GET /v1/webhook-secret and its rotation.
type WebhookSecret struct {
	Secret    string `json:"secret"`
	CreatedAt int64  `json:"created_at"` // Unix seconds
	RequestID string `json:"request_id"`
}

// Health is the answer to the health check.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}

// StartedEvent is the data of a stream's started event.
type StartedEvent struct {
	ID       string `json:"id"`
	Language string `json:"language"`
}

// OutputEvent is the data of a stream's stdout and stderr events.
type OutputEvent struct {
	Text string `json:"text"`
}
