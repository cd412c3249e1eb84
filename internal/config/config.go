// Package config holds the one Config of a Vertal Run server.
//
// Defaults, a JSON config file, VERTAL_* environment variables and command
// line flags all map onto the same struct, in that order of precedence
// (a flag beats the environment, which beats the file). To add a setting:
// add a field with a json tag to Config, give it a default in Default,
// check it in Validate, and add a row to settings (flags.go) if it should
// also be a flag and an environment variable (its def shows the default
// in --help, from Default). Serve-time defaults live here alone: the ones
// derived from other settings are methods (QueueSize, Node, Workers,
// RescueAfter), and the packages below take the values as given.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Default locations and values.
const (
	DefaultDataDir     = "/var/lib/vertal"
	DefaultStateDir    = "/run/vertal"
	DefaultImageDir    = "/var/lib/vertal/images/default"
	DefaultDockerImage = "vertal/default:latest"
	DefaultHost        = "127.0.0.1"
	DefaultPort        = 8080
	DefaultQueue       = 30 * time.Second

	// DefaultMaxConns and DefaultMaxConnsPerIP bound the API listener's
	// open connections; DefaultIdleTimeout closes an idle keep-alive one.
	DefaultMaxConns      = 1024
	DefaultMaxConnsPerIP = 64
	DefaultIdleTimeout   = 15 * time.Second
	// DefaultMaxUnauthConns and DefaultMaxUnauthConnsPerPrefix bound the
	// connections on which no request has passed the key check yet, in
	// total and per IPv4 /24 or IPv6 /64; DefaultHeaderTimeout closes a
	// connection that does not finish its request header in time.
	// (the total's default is a quarter of max-conns).
	DefaultMaxUnauthConnsPerPrefix = 32
	DefaultHeaderTimeout           = 10 * time.Second

	// DefaultMaxCodeBytes is the largest program accepted (512 KiB).
	DefaultMaxCodeBytes = 512 << 10
	// DefaultMaxStdinBytes is the largest stdin accepted (1 MiB).
	DefaultMaxStdinBytes = 1 << 20

	// The warm pool's sizes, for a 2-core, 4 GB host.
	DefaultPoolMin      = 1
	DefaultPoolMax      = 4
	DefaultPoolMemoryMB = 1024
	DefaultPoolPlan     = "pro"
	// DefaultSandboxPool is how many sandboxes that stay are kept
	// pre-started for each image and plan that asked for one lately.
	DefaultSandboxPool = 1

	DefaultDriver           = "oci"
	DefaultSignup           = "invite"
	DefaultNodeTimeout      = 60 * time.Second
	DefaultWebhookRetryFor  = 24 * time.Hour
	DefaultWebhookRetryBase = 10 * time.Second
	// DefaultQueuePerSlot is how many requests may wait per sandbox slot
	// when max-queue is 0.
	DefaultQueuePerSlot = 4
)

// The defaults that are derived from other settings, each applied by the
// method named and described by the text its flag's usage shows.
const (
	derivedMaxConcurrent = "CPU count, at least 2"                          // Default
	derivedMaxQueue      = "4 x max-concurrent"                             // QueueSize
	derivedNodeID        = "derived from the host name and data-dir"        // Node
	derivedAdvertiseURL  = "http://host:port when listening on one address" // AdvertiseFor
	derivedAsyncWorkers  = "half of max-concurrent, at least 1"             // Workers
	derivedRescueAfter   = "the longest plan timeout + queue-timeout + 2m"  // RescueAfter
)

// QueueSize is MaxQueue, or DefaultQueuePerSlot places per sandbox slot
// when it is 0.
func (c Config) QueueSize() int {
	if c.MaxQueue > 0 {
		return c.MaxQueue
	}
	return DefaultQueuePerSlot * c.MaxConcurrent
}

// Node is NodeID, or when it is empty a name derived from the host name
// and a hash of DataDir, so it stays the same across restarts and two
// servers on one host (each with its own data directory) differ.
func (c Config) Node() string {
	if c.NodeID != "" {
		return c.NodeID
	}
	host, _ := os.Hostname()
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		abs = c.DataDir
	}
	sum := sha256.Sum256([]byte(host + "\x00" + abs))
	return host + "-" + hex.EncodeToString(sum[:4])
}

// Workers is AsyncWorkers, or half of MaxConcurrent (at least 1) when it
// is 0, so sync requests always keep the other slots.
func (c Config) Workers() int {
	if c.AsyncWorkers > 0 {
		return c.AsyncWorkers
	}
	return max(1, c.MaxConcurrent/2)
}

// RescueAfter is QueueRescueAfter, or when it is 0 the longest plan
// timeout plus QueueTimeout plus 2 minutes: a job running longer than
// any execution can is handed to another node.
func (c Config) RescueAfter() time.Duration {
	if d := c.QueueRescueAfter.D(); d > 0 {
		return d
	}
	return time.Duration(c.MaxTimeoutS())*time.Second + c.QueueTimeout.D() + 2*time.Minute
}

// Config is everything `vertal serve` and the operator commands need.
type Config struct {
	// Host and Port are where the API listens. Port 0 picks a free port.
	Host string `json:"host"`
	Port int    `json:"port"`
	// MaxConcurrent sandboxes run at once; QueueTimeout bounds the wait for
	// a free one; MaxQueue bounds how many may wait (0: 4×MaxConcurrent;
	// QueueSize).
	MaxConcurrent int      `json:"max_concurrent"`
	QueueTimeout  Duration `json:"queue_timeout"`
	MaxQueue      int      `json:"max_queue"`
	// The warm pool keeps sandboxes pre-started per language: at least
	// PoolMin ready when idle, at most PoolMax per language and limits,
	// all of them holding at most PoolMemoryMB. PoolMax 0 turns it off.
	// PoolPlan names the plan whose limits the idle pool is kept for;
	// other plans get a pool when their traffic asks for one.
	PoolMin      int    `json:"pool_min"`
	PoolMax      int    `json:"pool_max"`
	PoolMemoryMB int    `json:"pool_memory_mb"`
	PoolPlan     string `json:"pool_plan"`
	// Driver is "oci" (default, no daemon) or "docker"; Runtime is crun,
	// runc, runsc or bwrap (oci only), empty for the best one installed.
	Driver  string `json:"driver"`
	Runtime string `json:"runtime"`
	// DataDir holds the SQLite database. It must survive restarts.
	DataDir string `json:"data_dir"`
	// StateDir holds sandbox runtime state (OCI bundles, runtime state,
	// the docker driver's instance locks): one locked instance directory
	// per server under StateDir/<driver>, so servers may share it. It
	// should be a tmpfs (/run): nothing in it outlives a reboot.
	StateDir string `json:"state_dir"`
	// SandboxAgent is the agent binary that sandboxes that stay run
	// (cmd/vertal-agent, static); empty: vertal-agent next to the vertal
	// executable, then on PATH.
	SandboxAgent string `json:"sandbox_agent"`
	// SandboxMemoryMB bounds the memory limits of this server's live
	// sandboxes that stay, together (a create or resume past it gets 503);
	// 0: three quarters of the host's memory.
	SandboxMemoryMB int `json:"sandbox_memory_mb"`
	// SandboxPool is how many sandboxes that stay are kept pre-started for
	// each image and plan a create asked for in the last ten minutes, so
	// that the next create takes one at once (0: none). They count toward
	// SandboxMemoryMB, and a create that needs their room gets it.
	SandboxPool int `json:"sandbox_pool"`
	// DatabaseURL, when it is a postgres:// URL, selects PostgreSQL instead
	// of SQLite at DataDir/vertal.db.
	DatabaseURL string `json:"database_url"`
	// MaxConns bounds the connections the API listener keeps open, from
	// all clients; MaxConnsPerIP from one client address (0: no per-address
	// cap, for a server behind a proxy). A connection over either limit is
	// answered 503 and closed. IdleTimeout closes keep-alive connections
	// that sit idle, so idle clients do not hold places for long.
	MaxConns      int      `json:"max_conns"`
	MaxConnsPerIP int      `json:"max_conns_per_ip"`
	IdleTimeout   Duration `json:"idle_timeout"`
	// MaxConnsPerTenant (0: a quarter of MaxConns) bounds the
	// authenticated connections one tenant holds at once.
	MaxConnsPerTenant int `json:"max_conns_per_tenant"`
	// MaxUnauthConns (0: a quarter of MaxConns) and
	// MaxUnauthConnsPerPrefix (per IPv4 /24 or IPv6 /64; 0: no per-prefix
	// cap) bound the connections no request has
	// authenticated yet; a newcomer over them takes the place of the
	// oldest idle one. HeaderTimeout bounds the wait for a request header.
	// ProxyCIDRs are the peers of a reverse proxy in front: exempt from
	// the per-address and unauthenticated caps, counted in MaxConns.
	MaxUnauthConns          int      `json:"max_unauth_conns"`
	MaxUnauthConnsPerPrefix int      `json:"max_unauth_conns_per_prefix"`
	HeaderTimeout           Duration `json:"header_timeout"`
	ProxyCIDRs              []string `json:"proxy_cidrs"`
	// MetricsAddr is host:port of the Prometheus listener; empty disables it.
	MetricsAddr string `json:"metrics_addr"`
	// EdgeSecret, when set, must arrive in X-Vertal-Edge-Secret on every
	// request but /health.
	EdgeSecret string `json:"edge_secret"`
	// Signup is who may create a dashboard account: open, invite (the
	// default) or closed.
	Signup string `json:"signup"`
	// SMTPURL (smtp://[user:pass@]host:port?from=ADDR) sends verification
	// and password-reset emails; empty: no email.
	SMTPURL string `json:"smtp_url"`
	// PublicURL is the server's address as browsers see it
	// (https://vertalrun.com); it builds links and snippets. Required with
	// SMTPURL: mailed links are built from it only. Empty: snippets take
	// it from each request, and no link is mailed.
	PublicURL string `json:"public_url"`
	// Dev creates tenant "local" on plan "pro" and prints its key on the
	// first start.
	Dev bool `json:"dev"`
	// ImageDir holds rootfs/ (oci driver) and versions.json.
	ImageDir string `json:"image_dir"`
	// NodeID names this server among the nodes of one database (executions
	// it runs are owned by it); "" derives one from the host name and
	// DataDir, stable across restarts (Node).
	NodeID string `json:"node_id"`
	// AdvertiseURL is the base URL other nodes reach this one at, sent
	// with its heartbeats: a sandbox call that reaches another node is
	// forwarded there. "" derives it from the listening address when that
	// is one address (not all interfaces); without one, calls for this
	// node's sandboxes that reach another node are 503 (AdvertiseFor).
	AdvertiseURL string `json:"advertise_url"`
	// AsyncWorkers is how many async executions this node runs at once
	// (0: half of MaxConcurrent, at least 1; Workers), so sync requests
	// always keep the other slots.
	AsyncWorkers int `json:"async_workers"`
	// NodeTimeout: a node without a heartbeat this long is taken for
	// stopped (0: 60 s). QueueRescueAfter: a queue job running this long
	// goes to another node (0: the longest plan timeout + QueueTimeout +
	// 2 min; RescueAfter).
	NodeTimeout      Duration `json:"node_timeout"`
	QueueRescueAfter Duration `json:"queue_rescue_after"`
	// WebhookAllowCIDRs are ranges webhooks may reach although they are
	// not public (a receiver on the operator's network), over http too.
	WebhookAllowCIDRs []string `json:"webhook_allow_cidrs"`
	// WebhookRetryFor bounds a delivery's retries (0: 24 h);
	// WebhookRetryBase is the first wait (0: 10 s).
	WebhookRetryFor  Duration `json:"webhook_retry_for"`
	WebhookRetryBase Duration `json:"webhook_retry_base"`
	// EgressDNS is the DNS server (host:port) the egress proxy resolves
	// sandboxes' names with; "" is the host's resolver.
	EgressDNS string `json:"egress_dns"`
	// DockerImage is the image every language uses with the docker driver.
	DockerImage string `json:"docker_image"`
	// MaxCodeBytes and MaxStdinBytes cap one request (413 above them).
	MaxCodeBytes  int `json:"max_code_bytes"`
	MaxStdinBytes int `json:"max_stdin_bytes"`
	// Plans by name; the file may override single fields of the built-in
	// plans or add new ones.
	Plans map[string]Plan `json:"plans"`
	// Languages override the built-in definitions per canonical name.
	Languages map[string]LanguageOverride `json:"languages"`
	// Images are the images requests may choose besides "default"
	// (ImageDir, DockerImage), by name; --image NAME adds one with the
	// conventional directory and tag.
	Images map[string]ImageConfig `json:"images"`
}

// WebhookAllow parses WebhookAllowCIDRs.
func (c Config) WebhookAllow() ([]netip.Prefix, error) { return parseCIDRs(c.WebhookAllowCIDRs) }

// Proxies parses ProxyCIDRs.
func (c Config) Proxies() ([]netip.Prefix, error) { return parseCIDRs(c.ProxyCIDRs) }

// parseCIDRs reads ranges, a bare address being its own range and an
// IPv4-mapped IPv6 range the IPv4 range it maps.
func parseCIDRs(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			if a, aerr := netip.ParseAddr(s); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				return nil, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8 or an address", s)
			}
		}
		// ::ffff:10.0.0.1 is the IPv4 address that peers are matched as.
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Default returns the built-in configuration.
func Default() Config {
	return Config{
		Signup:        DefaultSignup,
		Host:          DefaultHost,
		Port:          DefaultPort,
		MaxConcurrent: max(2, runtime.NumCPU()),
		QueueTimeout:  Duration(DefaultQueue),
		MaxConns:      DefaultMaxConns,
		MaxConnsPerIP: DefaultMaxConnsPerIP,
		IdleTimeout:   Duration(DefaultIdleTimeout),

		MaxUnauthConnsPerPrefix: DefaultMaxUnauthConnsPerPrefix,
		HeaderTimeout:           Duration(DefaultHeaderTimeout),

		PoolMin:       DefaultPoolMin,
		PoolMax:       DefaultPoolMax,
		PoolMemoryMB:  DefaultPoolMemoryMB,
		PoolPlan:      DefaultPoolPlan,
		SandboxPool:   DefaultSandboxPool,
		Driver:        DefaultDriver,
		DataDir:       DefaultDataDir,
		StateDir:      DefaultStateDir,
		ImageDir:      DefaultImageDir,
		DockerImage:   DefaultDockerImage,
		MaxCodeBytes:  DefaultMaxCodeBytes,
		MaxStdinBytes: DefaultMaxStdinBytes,
		Plans:         DefaultPlans(),

		NodeTimeout:      Duration(DefaultNodeTimeout),
		WebhookRetryFor:  Duration(DefaultWebhookRetryFor),
		WebhookRetryBase: Duration(DefaultWebhookRetryBase),
	}
}

// UnauthConns is the cap on unauthenticated connections in effect.
func (c Config) UnauthConns() int {
	if c.MaxUnauthConns > 0 {
		return c.MaxUnauthConns
	}
	return max(1, c.MaxConns/4)
}

// TenantConns is the cap on one tenant's connections in effect.
func (c Config) TenantConns() int {
	if c.MaxConnsPerTenant > 0 {
		return c.MaxConnsPerTenant
	}
	return max(1, c.MaxConns/4)
}

// Addr is the API listen address.
func (c Config) Addr() string {
	return net.JoinHostPort(c.Host, fmt.Sprint(c.Port))
}

// clipValue shortens a configured value quoted in an error.
func clipValue(v string) string {
	if len(v) <= 80 {
		return v
	}
	return v[:80] + "…"
}

// AdvertiseFor is AdvertiseURL, or when it is empty one derived from the
// address the server listens at (addr, its port resolved): http://host:port
// for one address, "" when listening on every interface, which names no
// address another node could use.
func (c Config) AdvertiseFor(addr net.Addr) string {
	if c.AdvertiseURL != "" {
		return strings.TrimRight(c.AdvertiseURL, "/")
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		return ""
	}
	return "http://" + tcp.String()
}

// UsesPostgres reports whether DatabaseURL selects PostgreSQL.
func (c Config) UsesPostgres() bool {
	return strings.HasPrefix(c.DatabaseURL, "postgres://") || strings.HasPrefix(c.DatabaseURL, "postgresql://")
}

var planName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// Validate reports every problem in c at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Host == "" {
		bad("host must not be empty")
	}
	if c.Port < 0 || c.Port > 65535 {
		bad("port %d is not in 0..65535", c.Port)
	}
	if c.EgressDNS != "" {
		if _, err := netip.ParseAddrPort(c.EgressDNS); err != nil {
			bad("egress-dns %q is not an address and port (203.0.113.53:53, [2001:db8::53]:53)", c.EgressDNS)
		}
	}
	if c.MaxConcurrent < 1 || c.MaxConcurrent > 4096 {
		bad("max-concurrent %d is not in 1..4096", c.MaxConcurrent)
	}
	if c.QueueTimeout.D() <= 0 || c.QueueTimeout.D() > 10*time.Minute {
		bad("queue-timeout %s is not in (0, 10m]", c.QueueTimeout.D())
	}
	if c.MaxQueue < 0 {
		bad("max-queue must not be negative")
	}
	if c.MaxConns < 1 || c.MaxConns > 1<<20 {
		bad("max-conns %d is not in 1..%d", c.MaxConns, 1<<20)
	}
	if c.MaxConnsPerIP < 0 || c.MaxConnsPerIP > c.MaxConns {
		bad("max-conns-per-ip %d is not in 0..max-conns (%d); 0 turns the per-address cap off", c.MaxConnsPerIP, c.MaxConns)
	}
	if c.MaxConnsPerTenant < 0 || c.MaxConnsPerTenant > c.MaxConns {
		bad("max-conns-per-tenant %d is not in 0..max-conns (%d); 0 is a quarter of max-conns", c.MaxConnsPerTenant, c.MaxConns)
	}
	if c.IdleTimeout.D() <= 0 || c.IdleTimeout.D() > 10*time.Minute {
		bad("idle-timeout %s is not in (0, 10m]", c.IdleTimeout.D())
	}
	if c.MaxUnauthConns < 0 || c.MaxUnauthConns > c.MaxConns {
		bad("max-unauth-conns %d is not in 0..max-conns (%d); 0 is a quarter of max-conns", c.MaxUnauthConns, c.MaxConns)
	}
	if c.MaxUnauthConnsPerPrefix < 0 {
		bad("max-unauth-conns-per-prefix must not be negative; 0 turns the per-prefix cap off")
	}
	if c.HeaderTimeout.D() <= 0 || c.HeaderTimeout.D() > 10*time.Minute {
		bad("header-timeout %s is not in (0, 10m]", c.HeaderTimeout.D())
	}
	if _, err := c.Proxies(); err != nil {
		bad("proxy-cidr: %v", err)
	}
	// pool-max 0 turns the pool off whatever pool-min says, so
	// `--pool-max 0` alone works although pool-min defaults to 1.
	if c.PoolMin < 0 || c.PoolMax < 0 || c.PoolMax > 64 || (c.PoolMax > 0 && c.PoolMin > c.PoolMax) {
		bad("pool-min %d and pool-max %d must satisfy 0 <= pool-min <= pool-max <= 64 (pool-max 0 turns the pool off)", c.PoolMin, c.PoolMax)
	}
	if c.SandboxPool < 0 || c.SandboxPool > 16 {
		bad("sandbox-pool %d must be from 0 to 16", c.SandboxPool)
	}
	if c.PoolMax > 0 && c.PoolMemoryMB < 1 {
		bad("pool-memory-mb must be positive while the pool is on")
	}
	if _, ok := c.Plans[c.PoolPlan]; c.PoolMax > 0 && !ok {
		bad("pool-plan %q is not a plan", c.PoolPlan)
	}
	switch c.Driver {
	case "oci":
		if c.Runtime != "" && c.Runtime != "crun" && c.Runtime != "runc" && c.Runtime != "runsc" && c.Runtime != "bwrap" {
			bad("runtime %q is not crun, runc, runsc or bwrap", c.Runtime)
		}
	case "docker":
		if c.Runtime != "" && c.Runtime != "runc" && c.Runtime != "runsc" {
			bad("runtime %q is not runc or runsc for the docker driver", c.Runtime)
		}
	default:
		bad("driver %q is not oci or docker", c.Driver)
	}
	if c.DataDir == "" {
		bad("data-dir must not be empty")
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		bad("state-dir %q must be an absolute path", c.StateDir)
	}
	if c.DatabaseURL != "" && !c.UsesPostgres() {
		bad("database-url must start with postgres:// or postgresql:// (leave it empty for SQLite)")
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			bad("metrics-addr %q is not host:port", c.MetricsAddr)
		} else if c.Port != 0 && c.MetricsAddr == c.Addr() {
			bad("metrics-addr must differ from the API address")
		}
	}
	if c.Signup != "open" && c.Signup != "invite" && c.Signup != "closed" {
		bad("signup %q is not open, invite or closed", c.Signup)
	}
	if c.PublicURL != "" && !strings.HasPrefix(c.PublicURL, "http://") && !strings.HasPrefix(c.PublicURL, "https://") {
		bad("public-url %q must start with http:// or https://", c.PublicURL)
	}
	if c.AdvertiseURL != "" {
		// Checked here, not at the first forwarded call: a node whose
		// address others cannot use would otherwise start and answer 503
		// for its sandboxes on every other node.
		u, err := url.Parse(c.AdvertiseURL)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "":
			bad("advertise-url %q must be an http:// or https:// URL with a host, e.g. http://10.0.0.5:8080", clipValue(c.AdvertiseURL))
		case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
			bad("advertise-url %q must hold no user, query or fragment", clipValue(c.AdvertiseURL))
		}
	}
	if c.SMTPURL != "" && !strings.HasPrefix(c.SMTPURL, "smtp://") {
		bad("smtp-url must start with smtp://")
	}
	if c.SMTPURL != "" && c.PublicURL == "" {
		// The mailed links (verification, reset) would otherwise need a
		// request's Host header, which whoever sends the request chooses.
		bad("smtp-url needs public-url: the links in verification and reset emails are built from it, never from a request's Host header; set --public-url (or VERTAL_PUBLIC_URL) to the address browsers use, e.g. https://vertalrun.com")
	}
	if c.EdgeSecret != "" && len(c.EdgeSecret) < 16 {
		bad("edge-secret must be at least 16 characters")
	}
	if c.AsyncWorkers < 0 || c.AsyncWorkers > c.MaxConcurrent {
		bad("async-workers %d is not in 0..max-concurrent (%d); 0 means half of max-concurrent", c.AsyncWorkers, c.MaxConcurrent)
	}
	for _, d := range []struct {
		name string
		d    Duration
	}{{"node-timeout", c.NodeTimeout}, {"queue-rescue-after", c.QueueRescueAfter}, {"webhook-retry-for", c.WebhookRetryFor}, {"webhook-retry-base", c.WebhookRetryBase}} {
		if d.d.D() < 0 {
			bad("%s must not be negative", d.name)
		}
	}
	if _, err := c.WebhookAllow(); err != nil {
		bad("webhook-allow-cidr: %v", err)
	}
	if c.ImageDir == "" && c.Driver == "oci" {
		bad("image-dir must not be empty")
	}
	if c.DockerImage == "" && c.Driver == "docker" {
		bad("docker-image must not be empty")
	}
	if c.MaxCodeBytes < 1 || c.MaxCodeBytes > 16<<20 {
		bad("max_code_bytes %d is not in 1..16 MiB", c.MaxCodeBytes)
	}
	if c.MaxStdinBytes < 0 || c.MaxStdinBytes > 16<<20 {
		bad("max_stdin_bytes %d is not in 0..16 MiB", c.MaxStdinBytes)
	}
	if len(c.Plans) == 0 {
		bad("at least one plan is needed")
	}
	for _, name := range PlanNames(c.Plans) {
		if !planName.MatchString(name) {
			bad("plan name %q must be 1-32 of a-z, 0-9, _ and -", name)
		}
		if err := c.Plans[name].validate(); err != nil {
			bad("plan %s: %w", name, err)
		}
	}
	validateImages(c, bad)
	for name, o := range c.Languages {
		if _, ok := builtinLanguage(name); !ok {
			bad("language %q is not python, javascript or bash", name)
		}
		if o.File != "" && strings.ContainsAny(o.File, "/\\") {
			bad("language %s: file %q must be a plain file name", name, o.File)
		}
	}
	return errors.Join(errs...)
}

// LoadFile applies a JSON config file onto c. Unknown keys are errors, so
// a typo does not silently fall back to a default. Plans and languages
// given in the file are merged field by field onto the ones already in c.
func (c *Config) LoadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading config file: %w", err)
	}
	type plain Config // same fields, no methods
	var aux struct {
		*plain
		Plans     map[string]json.RawMessage `json:"plans"`
		Languages map[string]json.RawMessage `json:"languages"`
	}
	aux.plain = (*plain)(c)
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&aux); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if c.Plans == nil {
		c.Plans = map[string]Plan{}
	}
	for name, raw := range aux.Plans {
		p := c.Plans[name]
		if err := strictUnmarshal(raw, &p); err != nil {
			return fmt.Errorf("config file %s: plan %s: %w", path, name, err)
		}
		c.Plans[name] = p
	}
	if len(aux.Languages) > 0 && c.Languages == nil {
		c.Languages = map[string]LanguageOverride{}
	}
	for name, raw := range aux.Languages {
		o := c.Languages[name]
		if err := strictUnmarshal(raw, &o); err != nil {
			return fmt.Errorf("config file %s: language %s: %w", path, name, err)
		}
		c.Languages[name] = o
	}
	return nil
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Duration is a time.Duration that reads "30s" or a number of seconds
// from JSON and the environment.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// ParseDuration reads "30s", "1m30s" or a plain number of seconds.
func ParseDuration(s string) (Duration, error) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		return Duration(d), nil
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 30s or 30)", s)
	}
	return Duration(secs * float64(time.Second)), nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n float64
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds")
		}
		*d = Duration(n * float64(time.Second))
		return nil
	}
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}
