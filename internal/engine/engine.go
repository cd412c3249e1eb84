// Package engine runs untrusted code in throw-away sandboxes.
//
// The engine owns the types every layer shares (the execution Spec and
// Result, Limits, the Driver and Prestarter seams, the sentinel errors) and
// the bounded pool of sandbox slots that turns overload into a fast
// ErrBusy. Drivers (internal/engine/oci, internal/engine/docker) only know
// how to create, run and destroy one hardened sandbox; what both of them
// use to do it (the policy, the execution loop, output capping, the
// working directory, cgroups) is internal/engine/sandbox.
package engine

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"
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

// CodeDir is the program's working directory in every sandbox: a tmpfs of
// its own (Limits.WorkdirBytes; noexec, nosuid, nodev, like /tmp) that the
// host fills before the code runs with the code file (root-owned, read
// only, in a sticky directory so the program cannot replace it) and the
// request's Files (owned by the sandbox's uid), and from which ReturnFiles
// are collected after the program ended.
const CodeDir = "/code"

// Limits bound one sandbox. Every field must be set (see Validate): the
// defaults are applied once, where a request becomes a Spec
// (execution.prepare, through config.Plan.Limits); below that, the
// scheduler, the pool, the drivers and the loop take Limits as given.
type Limits struct {
	MemoryBytes   int64   // RAM, swap disabled. Default 256 MiB.
	CPUs          float64 // CPU quota in cores. Default 1.
	Pids          int64   // processes+threads in the cgroup. Default 64.
	FileSizeBytes int64   // RLIMIT_FSIZE. Default 1 MiB.
	TmpBytes      int64   // size of the /tmp tmpfs. Default 16 MiB.
	OutputBytes   int     // captured per stream; the rest is discarded. Default 64 KiB.
	WorkdirBytes  int64   // size of the CodeDir tmpfs. Default 16 MiB.
	// ReturnFiles and ReturnBytes cap what Collect returns: how many files
	// and their bytes in all. Defaults 20 files, 10 MiB.
	ReturnFiles int
	ReturnBytes int64
	// Lifetime is the sandbox's own deadline, kept inside it: at this age
	// its processes are killed by the sandbox itself, even when the server
	// that started it is gone (SIGKILLed, crashed) and nothing on the host
	// would. For an execution it is its timeout plus LifetimeGrace
	// (DefaultLimits); the warm pool gives its sandboxes how long one may
	// wait plus the longest timeout it may then run (see
	// sandbox.DeadlineArgv).
	Lifetime time.Duration
}

// LifetimeGrace is added to an execution's timeout for its sandbox's own
// deadline: the host's timer, which reports timed_out, always fires first.
const LifetimeGrace = 5 * time.Second

// The engine's default limits and timeout (see DefaultLimits).
const (
	DefaultMemoryBytes   = 256 << 20
	DefaultCPUs          = 1.0
	DefaultPids          = 64
	DefaultFileSizeBytes = 1 << 20
	DefaultTmpBytes      = 16 << 20
	DefaultOutputBytes   = 64 << 10
	DefaultWorkdirBytes  = 16 << 20
	DefaultReturnFiles   = 20
	DefaultReturnBytes   = 10 << 20
	DefaultTimeout       = 10 * time.Second
)

// DefaultLimits are the limits of an execution of timeout that asks for
// nothing else: every field at its default, and the sandbox's own
// deadline timeout plus LifetimeGrace. A request's limits start from it
// (config.Plan.Limits), and so do those of the server's own executions
// (vertal doctor, the benchmarks) and of tests.
func DefaultLimits(timeout time.Duration) Limits {
	return Limits{
		MemoryBytes:   DefaultMemoryBytes,
		CPUs:          DefaultCPUs,
		Pids:          DefaultPids,
		FileSizeBytes: DefaultFileSizeBytes,
		TmpBytes:      DefaultTmpBytes,
		OutputBytes:   DefaultOutputBytes,
		WorkdirBytes:  DefaultWorkdirBytes,
		ReturnFiles:   DefaultReturnFiles,
		ReturnBytes:   DefaultReturnBytes,
		Lifetime:      timeout + LifetimeGrace,
	}
}

// WithDefaults fills the zero fields of l from DefaultLimits(timeout), for
// a caller that describes limits by what differs from the defaults (the
// security probes).
func (l Limits) WithDefaults(timeout time.Duration) Limits {
	d := DefaultLimits(timeout)
	fill := func(v *int64, def int64) {
		if *v <= 0 {
			*v = def
		}
	}
	fill(&l.MemoryBytes, d.MemoryBytes)
	fill(&l.Pids, d.Pids)
	fill(&l.FileSizeBytes, d.FileSizeBytes)
	fill(&l.TmpBytes, d.TmpBytes)
	fill(&l.WorkdirBytes, d.WorkdirBytes)
	fill(&l.ReturnBytes, d.ReturnBytes)
	if l.CPUs <= 0 {
		l.CPUs = d.CPUs
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = d.OutputBytes
	}
	if l.ReturnFiles <= 0 {
		l.ReturnFiles = d.ReturnFiles
	}
	if l.Lifetime <= 0 {
		l.Lifetime = d.Lifetime
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
	// Files are placed in CodeDir before the code runs. Paths are
	// validated by the caller (relative, slash-separated, no "..", no
	// duplicates); drivers check them again and refuse a bad one.
	Files []File
	// Env is added to the sandbox's fixed environment (sandbox.EnvFor);
	// names are validated by the caller and never replace PATH, HOME, LANG, PWD or
	// NODE_OPTIONS.
	Env map[string]string
	// Args follow the code file on the command line (sys.argv[1:],
	// process.argv.slice(2), $1...).
	Args []string
	// ReturnFiles are globs relative to CodeDir ("*.png", "out/**") whose
	// regular files come back in Result.Files, capped by Limits.
	ReturnFiles []string
	// Output, if set, receives the program's output as it arrives: the
	// same bytes that end up in Result.Stdout and Result.Stderr (what is
	// over the cap is not passed on), one call at a time, in order per
	// stream. It must not block for long: the sandbox's pipe waits.
	Output func(s Stream, p []byte)
	// EgressDir, if set, gives this one-shot sandbox the network of
	// package egress, as LiveSpec.EgressDir does a live one: the host
	// directory is bind-mounted read-only, nosuid, nodev and noexec at
	// EgressDir (the constant), the caller already listens on
	// EgressSocket in it, the agent binary (Agent) is mounted read-only at
	// AgentPath, and the program runs under RelayArgv with ProxyEnv added
	// to its environment. Under runsc the driver lets the sandbox open
	// host unix sockets (--host-uds=open). The warm pool passes such a
	// Spec to its cold driver: a pre-started sandbox has no egress mount.
	EgressDir string
	// Agent is the host path of the agent binary; required with
	// EgressDir.
	Agent string
}

// RelayPids is what the relay of a one-shot sandbox with egress
// (RelayArgv) takes of its process limit, threads included (five, and
// one to spare): execution.prepare adds it to the plan's Pids, so the
// program may still have as many as without a network.
const RelayPids = 6

// RelayArgv runs argv, a one-shot sandbox's program, under the agent's
// relay: `vertal-agent relay` listens on 127.0.0.1:EgressPort, relays
// each connection to EgressSocket, and then execs argv in its own place
// (same pid, same exit status), leaving a small process of its own to
// relay until the sandbox ends.
func RelayArgv(argv []string) []string {
	return append([]string{AgentPath, "relay", "--socket", EgressSocket, "--port", strconv.Itoa(EgressPort), "--"}, argv...)
}

// ProxyEnv is the environment that points a sandbox's programs at its
// egress proxy: curl, pip, Python's urllib and requests, and Node's fetch
// (with NODE_USE_ENV_PROXY) read it.
func ProxyEnv() map[string]string {
	u := "http://127.0.0.1:" + strconv.Itoa(EgressPort)
	return map[string]string{
		"HTTP_PROXY": u, "HTTPS_PROXY": u, "http_proxy": u, "https_proxy": u,
		"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1",
		"NODE_USE_ENV_PROXY": "1",
	}
}

// Validate refuses a Limits with a field that is not set: nothing below
// execution.prepare fills one in, and a zero limit would mean no limit.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"MemoryBytes", l.MemoryBytes > 0}, {"CPUs", l.CPUs > 0}, {"Pids", l.Pids > 0},
		{"FileSizeBytes", l.FileSizeBytes > 0}, {"TmpBytes", l.TmpBytes > 0}, {"OutputBytes", l.OutputBytes > 0},
		{"WorkdirBytes", l.WorkdirBytes > 0}, {"ReturnFiles", l.ReturnFiles > 0}, {"ReturnBytes", l.ReturnBytes > 0},
		{"Lifetime", l.Lifetime > 0},
	} {
		if !f.set {
			return fmt.Errorf("engine: limit %s is not set", f.name)
		}
	}
	return nil
}

// Validate refuses a Spec that is not complete: a driver calls it before
// it creates anything, and takes the Spec as given once it passed.
func (s Spec) Validate() error {
	if s.Timeout <= 0 {
		return fmt.Errorf("engine: execution %s has no timeout", s.ID)
	}
	if err := s.Limits.Validate(); err != nil {
		return fmt.Errorf("execution %s: %w", s.ID, err)
	}
	if s.EgressDir != "" && s.Agent == "" {
		return fmt.Errorf("engine: execution %s has an egress directory but no agent", s.ID)
	}
	if s.Limits.Lifetime < s.Timeout {
		return fmt.Errorf("engine: execution %s: the sandbox's lifetime %v is shorter than its timeout %v", s.ID, s.Limits.Lifetime, s.Timeout)
	}
	return nil
}

// Stream names one of the program's output streams.
type Stream int

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// File is one file of a Spec (in) or a Result (out), relative to CodeDir.
type File struct {
	Path    string
	Content []byte
	// Mode is the permission bits of a file in (0 means 0644); for a file
	// out, what the program left.
	Mode fs.FileMode
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
	// Files are the regular files matching Spec.ReturnFiles, in path
	// order; FilesTruncated is set when some were left out for the caps.
	Files          []File
	FilesTruncated bool
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
