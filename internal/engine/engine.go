// Package engine runs untrusted code in throw-away sandboxes.
//
// The engine owns what every driver shares: the execution Spec and Result
// types, the Driver seam, output capping, status classification, and the
// bounded pool of sandbox slots that turns overload into a fast ErrBusy.
// Drivers (internal/engine/oci, internal/engine/docker) only know how to
// create, run and destroy one hardened sandbox.
package engine

import (
	"context"
	"time"
)

// Status is the outcome of an execution as the API reports it.
type Status string

const (
	StatusSucceeded      Status = "succeeded"       // exit code 0
	StatusFailed         Status = "failed"          // non-zero exit or killed by a signal other than ours
	StatusTimedOut       Status = "timed_out"       // wall-clock timeout hit; every process killed
	StatusMemoryExceeded Status = "memory_exceeded" // OOM kill seen in the cgroup or reported by the engine
	StatusError          Status = "error"           // the platform failed, not the user's code
)

// Language is one runnable language as configured by the operator.
type Language struct {
	// Name is the canonical name: "python", "javascript" or "bash".
	Name string
	// Image is driver specific: a root filesystem directory for the oci
	// driver, an image reference for the docker driver.
	Image string
	// File is the name the code is stored under inside the sandbox, in
	// CodeDir (e.g. "main.py"). Tracebacks show CodeDir/File.
	File string
	// Command runs the code file. Its last argument may be the code path
	// (CodeDir/File, as the built-in languages have it) or be left out;
	// drivers run Argv, which has it exactly once.
	Command []string
	// Version is the interpreter's real version, as recorded when the
	// image was built (e.g. "3.11.2"). Empty when unknown.
	Version string
}

// Argv is the command a sandbox runs: Command ending with the code path.
func (l Language) Argv() []string {
	file := CodeDir + "/" + l.File
	argv := append([]string(nil), l.Command...)
	if len(argv) == 0 || argv[len(argv)-1] != file {
		argv = append(argv, file)
	}
	return argv
}

// CodeDir is where the code file is mounted, read-only, in every sandbox.
const CodeDir = "/code"

// Limits bound one sandbox. Zero values mean "use the default".
type Limits struct {
	MemoryBytes   int64   // RAM, swap disabled. Default 256 MiB.
	CPUs          float64 // CPU quota in cores. Default 1.
	Pids          int64   // processes+threads in the cgroup. Default 64.
	FileSizeBytes int64   // RLIMIT_FSIZE. Default 1 MiB.
	TmpBytes      int64   // size of the /tmp tmpfs. Default 16 MiB.
	OutputBytes   int     // captured per stream; the rest is discarded. Default 64 KiB.
}

// Defaults used by WithDefaults.
const (
	DefaultMemoryBytes   = 256 << 20
	DefaultCPUs          = 1.0
	DefaultPids          = 64
	DefaultFileSizeBytes = 1 << 20
	DefaultTmpBytes      = 16 << 20
	DefaultOutputBytes   = 64 << 10
	DefaultTimeout       = 10 * time.Second
)

// WithDefaults fills zero fields with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.CPUs <= 0 {
		l.CPUs = DefaultCPUs
	}
	if l.Pids <= 0 {
		l.Pids = DefaultPids
	}
	if l.FileSizeBytes <= 0 {
		l.FileSizeBytes = DefaultFileSizeBytes
	}
	if l.TmpBytes <= 0 {
		l.TmpBytes = DefaultTmpBytes
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	return l
}

// Spec is one execution request as a driver sees it.
type Spec struct {
	// ID names the sandbox (container name, bundle directory); unique per
	// execution, e.g. "exe_<32 hex>".
	ID       string
	Language Language
	Code     string
	Stdin    string
	Timeout  time.Duration
	Limits   Limits
}

// Usage is what one execution consumed.
type Usage struct {
	SandboxSeconds  float64 // wall-clock time the user's code ran
	CPUSeconds      float64 // user+system CPU time of the sandbox's cgroup
	PeakMemoryBytes int64   // peak memory of the sandbox's cgroup; 0 if unknown
}

// Result is a finished execution. A Result is returned for every outcome
// of the user's code, including timeouts and OOM kills; a driver returns an
// error (and no Result) only when the platform itself failed.
type Result struct {
	Status    Status
	Stdout    string
	Stderr    string
	ExitCode  int // exit status, or 128+signal when killed
	Duration  time.Duration
	Truncated bool // true if either stream went over Limits.OutputBytes
	Usage     Usage
}

// Driver creates, runs and destroys one hardened sandbox per Run.
// Implementations must leave nothing behind (container, bundle, cgroup,
// mount, process) whatever the outcome, including ctx being cancelled.
type Driver interface {
	// Run executes spec in a fresh sandbox and destroys it.
	Run(ctx context.Context, spec Spec) (Result, error)
	// Reap removes whatever earlier processes of this driver left behind
	// (after a crash or SIGKILL). It is called at start-up.
	Reap(ctx context.Context) (removed int, err error)
	// Name identifies driver and runtime, e.g. "oci/crun" or "docker/runsc".
	Name() string
}
