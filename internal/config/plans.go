package config

import (
	"errors"
	"sort"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Plan is what a tenant may use. Every plan shares the fixed sandbox limits
// of the engine (1 CPU, 64 processes, 16 MB /tmp, 1 MB files, 64 KB output
// per stream); plans differ in volume, rate, time and memory.
type Plan struct {
	ExecutionsPerDay  int64 `json:"executions_per_day"`
	RequestsPerMinute int64 `json:"requests_per_minute"`
	MaxTimeoutS       int   `json:"max_timeout_s"`
	MemoryMB          int64 `json:"memory_mb"`
	// MaxConcurrent is how many sandboxes one tenant may hold at once on
	// a node (and 4 queue places for each, with the default queue size),
	// so that no tenant can take every slot.
	MaxConcurrent int `json:"max_concurrent"`
	// MaxFiles and MaxFilesMB cap a request's files (how many, and their
	// decoded bytes in all) and the files returned to it. Zero (a custom
	// plan that names neither) means the free plan's caps.
	MaxFiles   int   `json:"max_files"`
	MaxFilesMB int64 `json:"max_files_mb"`
	// Images are the images a tenant on this plan may name besides the
	// default one; empty: every configured image (see AllowsImage).
	Images []string `json:"images,omitempty"`
	// Sandboxes that stay (package sandboxes): how many one tenant may
	// hold at once (running or paused), the longest a live one may run
	// (from its start or resume; no extension passes it), the size of its
	// home, and the largest saved home of a paused one. Zero (a custom
	// plan that names none) means the free plan's.
	MaxSandboxes        int   `json:"max_sandboxes"`
	MaxSandboxLifetimeS int   `json:"max_sandbox_lifetime_s"`
	SandboxHomeMB       int64 `json:"sandbox_home_mb"`
	PausedStorageMB     int64 `json:"paused_storage_mb"`
	// Egress is the network this plan's sandboxes that stay may reach
	// (package egress); nil, the default of every built-in plan, is none.
	Egress *Egress `json:"egress,omitempty"`
}

// Egress is a plan's allowlist: domain names ("pypi.org"), wildcards
// ("*.pythonhosted.org") and address prefixes ("203.0.113.0/24"), and
// the bytes in and out one sandbox's connections may carry in all (0
// means DefaultEgressMaxBytes).
type Egress struct {
	Allow    []string `json:"allow"`
	MaxBytes int64    `json:"max_bytes,omitempty"`
}

// DefaultEgressMaxBytes is the byte cap of a plan's egress that names
// none: a few package installs.
const DefaultEgressMaxBytes = 100 << 20

// EgressPolicy is the network p's sandboxes may reach; the zero Policy
// (nothing) when p has no egress. The config was validated at load, so
// the allowlist parses.
func (p Plan) EgressPolicy() egress.Policy {
	if p.Egress == nil {
		return egress.Policy{}
	}
	pol, err := p.Egress.policy()
	if err != nil {
		return egress.Policy{}
	}
	return pol
}

func (e *Egress) policy() (egress.Policy, error) {
	return egress.Parse(e.Allow, orDefault(e.MaxBytes, DefaultEgressMaxBytes))
}

// The free plan's file caps, which a plan without its own gets.
const (
	DefaultMaxFiles   = 10
	DefaultMaxFilesMB = 1
)

// The free plan's sandbox limits, which a plan without its own gets.
const (
	DefaultMaxSandboxes        = 1
	DefaultMaxSandboxLifetimeS = 600
	DefaultSandboxHomeMB       = 64
	DefaultPausedStorageMB     = 64
)

// The built-in plans. pro is the documented one; free keeps the documented
// daily quota of 100 and a low rate so a leaked free key costs little;
// enterprise is ten times pro in volume and allows longer jobs.
func DefaultPlans() map[string]Plan {
	return map[string]Plan{
		"free": {ExecutionsPerDay: 100, RequestsPerMinute: 20, MaxTimeoutS: 10, MemoryMB: 256, MaxConcurrent: 1,
			MaxFiles: DefaultMaxFiles, MaxFilesMB: DefaultMaxFilesMB,
			MaxSandboxes: DefaultMaxSandboxes, MaxSandboxLifetimeS: DefaultMaxSandboxLifetimeS,
			SandboxHomeMB: DefaultSandboxHomeMB, PausedStorageMB: DefaultPausedStorageMB},
		"pro": {ExecutionsPerDay: 10000, RequestsPerMinute: 120, MaxTimeoutS: 60, MemoryMB: 512, MaxConcurrent: 4,
			MaxFiles: 50, MaxFilesMB: 10,
			MaxSandboxes: 4, MaxSandboxLifetimeS: 3600, SandboxHomeMB: 256, PausedStorageMB: 1024},
		"enterprise": {ExecutionsPerDay: 100000, RequestsPerMinute: 1200, MaxTimeoutS: 300, MemoryMB: 1024, MaxConcurrent: 16,
			MaxFiles: 200, MaxFilesMB: 50,
			MaxSandboxes: 16, MaxSandboxLifetimeS: 86400, SandboxHomeMB: 1024, PausedStorageMB: 10240},
	}
}

// DefaultTimeoutS is the timeout of a request that names none, capped by
// the plan's maximum.
const DefaultTimeoutS = 10

// DefaultTimeout returns the timeout used when a request names none.
func (p Plan) DefaultTimeout() float64 { return float64(min(DefaultTimeoutS, p.MaxTimeoutS)) }

// MemoryBytes is the sandbox memory limit in bytes.
func (p Plan) MemoryBytes() int64 { return p.MemoryMB << 20 }

// FilesLimit is how many files a request may send (and get back).
func (p Plan) FilesLimit() int {
	if p.MaxFiles <= 0 {
		return DefaultMaxFiles
	}
	return p.MaxFiles
}

// FilesBytes is the total decoded size a request's files may have (and
// the files returned to it).
func (p Plan) FilesBytes() int64 {
	if p.MaxFilesMB <= 0 {
		return DefaultMaxFilesMB << 20
	}
	return p.MaxFilesMB << 20
}

// SandboxLimit is how many sandboxes a tenant may hold at once.
func (p Plan) SandboxLimit() int { return orDefault(p.MaxSandboxes, DefaultMaxSandboxes) }

// SandboxLifetime is the longest a live sandbox may run.
func (p Plan) SandboxLifetime() time.Duration {
	return time.Duration(orDefault(p.MaxSandboxLifetimeS, DefaultMaxSandboxLifetimeS)) * time.Second
}

// SandboxHomeBytes is the size of a sandbox's home.
func (p Plan) SandboxHomeBytes() int64 { return orDefault(p.SandboxHomeMB, DefaultSandboxHomeMB) << 20 }

// PausedStorageBytes caps the saved home of a paused sandbox.
func (p Plan) PausedStorageBytes() int64 {
	return orDefault(p.PausedStorageMB, DefaultPausedStorageMB) << 20
}

func orDefault[T int | int64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Limits are the sandbox limits of an execution of timeout on p: the
// engine's defaults with the plan's memory and file caps. It is the one
// place a request's limits are decided (execution.prepare calls it), and
// the warm pool is kept for the pool plan's.
func (p Plan) Limits(timeout time.Duration) engine.Limits {
	l := engine.DefaultLimits(timeout)
	l.MemoryBytes = p.MemoryBytes()
	// Fixed per plan, so warm sandboxes of a plan are alike: room for the
	// largest files in plus what /tmp gets.
	l.WorkdirBytes = p.FilesBytes() + engine.DefaultTmpBytes
	l.ReturnFiles = p.FilesLimit()
	l.ReturnBytes = p.FilesBytes()
	return l
}

func (p Plan) validate() error {
	var errs []error
	if p.ExecutionsPerDay < 1 {
		errs = append(errs, errors.New("executions_per_day must be at least 1"))
	}
	if p.RequestsPerMinute < 1 {
		errs = append(errs, errors.New("requests_per_minute must be at least 1"))
	}
	if p.MaxTimeoutS < 1 || p.MaxTimeoutS > 3600 {
		errs = append(errs, errors.New("max_timeout_s must be in 1..3600"))
	}
	if p.MemoryMB < 32 || p.MemoryMB > 64<<10 {
		errs = append(errs, errors.New("memory_mb must be in 32..65536"))
	}
	if p.MaxConcurrent < 1 || p.MaxConcurrent > 1024 {
		errs = append(errs, errors.New("max_concurrent must be in 1..1024"))
	}
	if p.MaxFiles < 0 || p.MaxFiles > 10000 {
		errs = append(errs, errors.New("max_files must be in 0..10000 (0: the free plan's)"))
	}
	if p.MaxFilesMB < 0 || p.MaxFilesMB > 1024 {
		errs = append(errs, errors.New("max_files_mb must be in 0..1024 (0: the free plan's)"))
	}
	if p.MaxSandboxes < 0 || p.MaxSandboxes > 1024 {
		errs = append(errs, errors.New("max_sandboxes must be in 0..1024 (0: the free plan's)"))
	}
	if p.MaxSandboxLifetimeS < 0 || p.MaxSandboxLifetimeS > 7*86400 {
		errs = append(errs, errors.New("max_sandbox_lifetime_s must be in 0..604800 (0: the free plan's)"))
	}
	if p.SandboxHomeMB < 0 || p.SandboxHomeMB > 64<<10 {
		errs = append(errs, errors.New("sandbox_home_mb must be in 0..65536 (0: the free plan's)"))
	}
	if p.PausedStorageMB < 0 || p.PausedStorageMB > 1<<20 {
		errs = append(errs, errors.New("paused_storage_mb must be in 0..1048576 (0: the free plan's)"))
	}
	if p.Egress != nil {
		if _, err := p.Egress.policy(); err != nil {
			errs = append(errs, err)
		} else if p.Egress.MaxBytes < 0 {
			errs = append(errs, errors.New("egress: max_bytes must not be negative (0: 100 MiB)"))
		} else if len(p.Egress.Allow) == 0 {
			errs = append(errs, errors.New("egress: allow is empty; leave egress out for no network"))
		}
	}
	return errors.Join(errs...)
}

// PlanNames returns the plan names in a stable order.
func PlanNames(plans map[string]Plan) []string {
	names := make([]string, 0, len(plans))
	for n := range plans {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// MaxTimeoutS is the longest timeout any plan allows; the server sizes its
// write timeout and idempotency waits from it.
func (c Config) MaxTimeoutS() int {
	m := 0
	for _, p := range c.Plans {
		m = max(m, p.MaxTimeoutS)
	}
	return m
}
