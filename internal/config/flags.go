package config

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// setting is one value reachable as --name and as env.
type setting struct {
	name  string // flag name without dashes
	env   string // environment variable
	usage string
	// def shows the setting's default in --help, "(default ...)", from
	// Default; derived, "(default: ...)", says what an empty value means:
	// for one derived from other settings, the rule of the method that
	// derives it (config.go).
	def     func(c Config) string
	derived string
	bool    bool
	// repeat: the flag may be given several times; the values reach set
	// joined by commas, as the environment variable gives them.
	repeat bool
	set    func(c *Config, v string) error
}

func str(dst func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *dst(c) = v; return nil }
}

func integer(dst func(c *Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%q is not an integer", v)
		}
		*dst(c) = n
		return nil
	}
}

func duration(dst func(c *Config) *Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := ParseDuration(v)
		*dst(c) = d
		return err
	}
}

// list appends the comma-separated values of a repeatable setting.
func list(dst func(c *Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				*dst(c) = append(*dst(c), p)
			}
		}
		return nil
	}
}

func boolean(dst func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%q is not a boolean", v)
		}
		*dst(c) = b
		return nil
	}
}

// shortDuration shows d as a flag's default: 30s, 10m, 24h.
func shortDuration(d Duration) string {
	s := d.D().String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// settings lists every flag/environment setting. The config file path
// (--config, VERTAL_CONFIG) is handled apart because it is read first.
var settings = []setting{
	{name: "host", env: "VERTAL_HOST", usage: "address to listen on", def: func(c Config) string { return c.Host },
		set: str(func(c *Config) *string { return &c.Host })},
	{name: "port", env: "VERTAL_PORT", usage: "port to listen on; 0 picks a free one", def: func(c Config) string { return strconv.Itoa(c.Port) },
		set: integer(func(c *Config) *int { return &c.Port })},
	{name: "max-concurrent", env: "VERTAL_MAX_CONCURRENT", usage: "sandboxes that may run at once", derived: derivedMaxConcurrent,
		set: integer(func(c *Config) *int { return &c.MaxConcurrent })},
	{name: "queue-timeout", env: "VERTAL_QUEUE_TIMEOUT", usage: "longest wait for a free sandbox before 503, e.g. 30s or 30", def: func(c Config) string { return shortDuration(c.QueueTimeout) },
		set: func(c *Config, v string) error {
			d, err := ParseDuration(v)
			c.QueueTimeout = d
			return err
		}},
	{name: "max-queue", env: "VERTAL_MAX_QUEUE", usage: "requests that may wait for a sandbox", derived: derivedMaxQueue,
		set: integer(func(c *Config) *int { return &c.MaxQueue })},
	{name: "max-conns", env: "VERTAL_MAX_CONNS", usage: "most client connections open at once; more are answered 503 and closed", def: func(c Config) string { return strconv.Itoa(c.MaxConns) },
		set: integer(func(c *Config) *int { return &c.MaxConns })},
	{name: "max-conns-per-ip", env: "VERTAL_MAX_CONNS_PER_IP", usage: "most connections open at once from one client address (an IPv4 address, an IPv6 /64); 0 turns this cap off, e.g. behind a proxy", def: func(c Config) string { return strconv.Itoa(c.MaxConnsPerIP) },
		set: integer(func(c *Config) *int { return &c.MaxConnsPerIP })},
	{name: "max-conns-per-tenant", env: "VERTAL_MAX_CONNS_PER_TENANT", usage: "most authenticated connections one tenant holds at once; its next one takes the place of its own idle one, else its request is answered 503", derived: "a quarter of max-conns",
		set: integer(func(c *Config) *int { return &c.MaxConnsPerTenant })},
	{name: "idle-timeout", env: "VERTAL_IDLE_TIMEOUT", usage: "close a keep-alive connection idle this long, e.g. 15s or 15", def: func(c Config) string { return shortDuration(c.IdleTimeout) },
		set: func(c *Config, v string) error {
			d, err := ParseDuration(v)
			c.IdleTimeout = d
			return err
		}},
	{name: "max-unauth-conns", env: "VERTAL_MAX_UNAUTH_CONNS", usage: "most connections open at once on which no request has passed the key check; a new one over it takes the place of the oldest idle one", derived: "a quarter of max-conns",
		set: integer(func(c *Config) *int { return &c.MaxUnauthConns })},
	{name: "max-unauth-conns-per-prefix", env: "VERTAL_MAX_UNAUTH_CONNS_PER_PREFIX", usage: "most such unauthenticated connections from one IPv4 /24 or IPv6 /64; 0 turns this cap off", def: func(c Config) string { return strconv.Itoa(c.MaxUnauthConnsPerPrefix) },
		set: integer(func(c *Config) *int { return &c.MaxUnauthConnsPerPrefix })},
	{name: "header-timeout", env: "VERTAL_HEADER_TIMEOUT", usage: "close a connection that does not send a whole request header within this, e.g. 10s or 10", def: func(c Config) string { return shortDuration(c.HeaderTimeout) },
		set: duration(func(c *Config) *Duration { return &c.HeaderTimeout })},
	{name: "proxy-cidr", env: "VERTAL_PROXY_CIDR", repeat: true, usage: "connections from this range are a reverse proxy's: exempt from the per-address and unauthenticated caps, still counted in max-conns; repeatable, or comma-separated", derived: "none",
		set: list(func(c *Config) *[]string { return &c.ProxyCIDRs })},
	{name: "pool-min", env: "VERTAL_POOL_MIN", usage: "warm sandboxes kept ready per language when idle", def: func(c Config) string { return strconv.Itoa(c.PoolMin) },
		set: integer(func(c *Config) *int { return &c.PoolMin })},
	{name: "pool-max", env: "VERTAL_POOL_MAX", usage: "most warm sandboxes per language and plan; 0 turns the warm pool off", def: func(c Config) string { return strconv.Itoa(c.PoolMax) },
		set: integer(func(c *Config) *int { return &c.PoolMax })},
	{name: "pool-memory-mb", env: "VERTAL_POOL_MEMORY_MB", usage: "memory all waiting warm sandboxes may hold together, in MiB", def: func(c Config) string { return strconv.Itoa(c.PoolMemoryMB) },
		set: integer(func(c *Config) *int { return &c.PoolMemoryMB })},
	{name: "pool-plan", env: "VERTAL_POOL_PLAN", usage: "plan whose limits the idle warm pool is kept for, for executions and sandboxes that stay", def: func(c Config) string { return c.PoolPlan },
		set: str(func(c *Config) *string { return &c.PoolPlan })},
	{name: "driver", env: "VERTAL_DRIVER", usage: "sandbox driver: oci or docker", def: func(c Config) string { return c.Driver },
		set: str(func(c *Config) *string { return &c.Driver })},
	{name: "runtime", env: "VERTAL_RUNTIME", usage: "OCI runtime: bwrap (bubblewrap), crun, runc or runsc; bwrap is for the oci driver only", derived: "bwrap where the host allows unprivileged user namespaces, else crun, else runc",
		set: str(func(c *Config) *string { return &c.Runtime })},
	{name: "data-dir", env: "VERTAL_DATA_DIR", usage: "directory for the SQLite database", def: func(c Config) string { return c.DataDir },
		set: str(func(c *Config) *string { return &c.DataDir })},
	{name: "state-dir", env: "VERTAL_STATE_DIR", usage: "directory for sandbox runtime state, best on a tmpfs; each server locks its own instance directory in it", def: func(c Config) string { return c.StateDir },
		set: str(func(c *Config) *string { return &c.StateDir })},
	{name: "sandbox-agent", env: "VERTAL_SANDBOX_AGENT", usage: "the agent binary that sandboxes that stay run (built from cmd/vertal-agent)", derived: "vertal-agent next to this executable, else on PATH",
		set: str(func(c *Config) *string { return &c.SandboxAgent })},
	{name: "sandbox-memory-mb", env: "VERTAL_SANDBOX_MEMORY_MB", usage: "memory limits all live sandboxes that stay may hold together, in MiB; past it a create or resume gets 503", derived: "three quarters of the host's memory",
		set: integer(func(c *Config) *int { return &c.SandboxMemoryMB })},
	{name: "sandbox-pool", env: "VERTAL_SANDBOX_POOL", usage: "sandboxes that stay kept pre-started per image and plan asked for in the last ten minutes, and for pool-plan's plan from start-up (0 turns it off)", def: func(c Config) string { return strconv.Itoa(c.SandboxPool) },
		set: integer(func(c *Config) *int { return &c.SandboxPool })},
	{name: "database-url", env: "VERTAL_DATABASE_URL", usage: "postgres://... to share one PostgreSQL database between nodes", derived: "SQLite in data-dir",
		set: str(func(c *Config) *string { return &c.DatabaseURL })},
	{name: "metrics-addr", env: "VERTAL_METRICS_ADDR", usage: "host:port for Prometheus /metrics", derived: "off",
		set: str(func(c *Config) *string { return &c.MetricsAddr })},
	{name: "edge-secret", env: "VERTAL_EDGE_SECRET", usage: "require this value in X-Vertal-Edge-Secret on every request but /health (prefer the environment variable: flags show in ps)",
		set: str(func(c *Config) *string { return &c.EdgeSecret })},
	{name: "signup", env: "VERTAL_SIGNUP", usage: "who may create a dashboard account: open, invite (links from vertal invite) or closed", def: func(c Config) string { return c.Signup },
		set: str(func(c *Config) *string { return &c.Signup })},
	{name: "smtp-url", env: "VERTAL_SMTP_URL", usage: "smtp://[user:pass@]host:port?from=ADDR for verification and reset emails; needs --public-url", derived: "none; vertal reset-link prints reset links",
		set: str(func(c *Config) *string { return &c.SMTPURL })},
	{name: "public-url", env: "VERTAL_PUBLIC_URL", usage: "the server's URL as browsers see it; every link in mail is built from it, so --smtp-url needs it", derived: "snippets take it from each request",
		set: str(func(c *Config) *string { return &c.PublicURL })},
	{name: "dev", env: "VERTAL_DEV", usage: "development mode: create tenant 'local' (plan pro) and print its key on first start", bool: true,
		set: boolean(func(c *Config) *bool { return &c.Dev })},
	{name: "image-dir", env: "VERTAL_IMAGE_DIR", usage: "sandbox image directory with rootfs/ and versions.json", def: func(c Config) string { return c.ImageDir },
		set: str(func(c *Config) *string { return &c.ImageDir })},
	{name: "image", env: "VERTAL_IMAGES", repeat: true, usage: "also offer this image, built with vertal image build --name NAME next to image-dir (NAME or NAME=DIR); repeatable, or comma-separated",
		set: func(c *Config, v string) error {
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); p == "" {
					continue
				}
				name, dir, _ := strings.Cut(p, "=")
				if c.Images == nil {
					c.Images = map[string]ImageConfig{}
				}
				ic := c.Images[name]
				if dir != "" {
					ic.Dir = dir
				}
				c.Images[name] = ic
			}
			return nil
		}},
	{name: "node-id", env: "VERTAL_NODE_ID", usage: "this server's name among the nodes sharing a database; keep it across restarts", derived: derivedNodeID,
		set: str(func(c *Config) *string { return &c.NodeID })},
	{name: "advertise-url", env: "VERTAL_ADVERTISE_URL", usage: "the base URL other nodes reach this one at, to forward calls for the sandboxes it holds", derived: derivedAdvertiseURL,
		set: str(func(c *Config) *string { return &c.AdvertiseURL })},
	{name: "async-workers", env: "VERTAL_ASYNC_WORKERS", usage: "async executions this node runs at once, out of max-concurrent", derived: derivedAsyncWorkers,
		set: integer(func(c *Config) *int { return &c.AsyncWorkers })},
	{name: "node-timeout", env: "VERTAL_NODE_TIMEOUT", usage: "a node silent this long is taken for stopped and its unfinished executions are settled", def: func(c Config) string { return shortDuration(c.NodeTimeout) },
		set: duration(func(c *Config) *Duration { return &c.NodeTimeout })},
	{name: "queue-rescue-after", env: "VERTAL_QUEUE_RESCUE_AFTER", usage: "a queue job running this long is handed to another node, its worker presumed dead", derived: derivedRescueAfter,
		set: duration(func(c *Config) *Duration { return &c.QueueRescueAfter })},
	{name: "webhook-allow-cidr", env: "VERTAL_WEBHOOK_ALLOW_CIDR", repeat: true, usage: "let webhooks reach addresses in this range (private, loopback...), over http too; repeatable, or comma-separated", derived: "public addresses only, https only",
		set: list(func(c *Config) *[]string { return &c.WebhookAllowCIDRs })},
	{name: "webhook-retry-for", env: "VERTAL_WEBHOOK_RETRY_FOR", usage: "how long a webhook delivery is retried after its first attempt before it is failed", def: func(c Config) string { return shortDuration(c.WebhookRetryFor) },
		set: duration(func(c *Config) *Duration { return &c.WebhookRetryFor })},
	{name: "webhook-retry-base", env: "VERTAL_WEBHOOK_RETRY_BASE", usage: "the first wait between webhook attempts, doubled each time up to 1h", def: func(c Config) string { return shortDuration(c.WebhookRetryBase) },
		set: duration(func(c *Config) *Duration { return &c.WebhookRetryBase })},
	{name: "egress", env: "VERTAL_EGRESS", repeat: true, usage: "let PLAN's executions and sandboxes that stay reach RULE (a name, *.suffix or CIDR) through the egress proxy, as PLAN:RULE; repeatable, or comma-separated; adds to the config file's egress.allow", derived: "no network for any plan",
		set: func(c *Config, v string) error {
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); p == "" {
					continue
				}
				name, rule, ok := strings.Cut(p, ":")
				if !ok || name == "" || rule == "" {
					return fmt.Errorf("%q is not PLAN:RULE", p)
				}
				plan, ok := c.Plans[name]
				if !ok {
					return fmt.Errorf("%q: no plan %q", p, name)
				}
				e := Egress{}
				if plan.Egress != nil {
					e = *plan.Egress
				}
				e.Allow = append(slices.Clone(e.Allow), rule)
				plan.Egress = &e
				c.Plans[name] = plan
			}
			return nil
		}},
	{name: "egress-dns", env: "VERTAL_EGRESS_DNS", usage: "host:port of the DNS server the egress proxy resolves sandboxes' names with (e.g. a filtering resolver)", derived: "the host's resolver",
		set: str(func(c *Config) *string { return &c.EgressDNS })},
	{name: "docker-image", env: "VERTAL_DOCKER_IMAGE", usage: "image for the docker driver", def: func(c Config) string { return c.DockerImage },
		set: str(func(c *Config) *string { return &c.DockerImage })},
}

// Binding collects the flags of one command until Resolve.
type Binding struct {
	used       []setting
	values     map[string]string
	order      []string
	configPath string
}

// Bind registers --config and the named settings (all when names is
// empty) on fs. Call Resolve after fs.Parse.
func Bind(fs *flag.FlagSet, names ...string) *Binding {
	b := &Binding{values: map[string]string{}}
	fs.StringVar(&b.configPath, "config", "", "JSON config file (also VERTAL_CONFIG)")
	for _, s := range settings {
		if len(names) > 0 && !contains(names, s.name) {
			continue
		}
		b.used = append(b.used, s)
		name := s.name
		repeat := s.repeat
		record := func(v string) error {
			old, seen := b.values[name]
			if !seen {
				b.order = append(b.order, name)
			}
			if repeat && seen {
				v = old + "," + v
			}
			b.values[name] = v
			return nil
		}
		usage := s.usage
		switch {
		case s.def != nil:
			usage += " (default " + s.def(Default()) + ")"
		case s.derived != "":
			usage += " (default: " + s.derived + ")"
		}
		usage += " [" + s.env + "]"
		if s.bool {
			fs.BoolFunc(name, usage, func(v string) error { return record(v) })
		} else {
			fs.Func(name, usage, record)
		}
	}
	return b
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Resolve builds the Config: defaults, then the config file, then the
// environment, then the flags given, and validates it.
func (b *Binding) Resolve(getenv func(string) string) (Config, error) {
	c := Default()
	path := b.configPath
	if path == "" {
		path = getenv("VERTAL_CONFIG")
	}
	if path != "" {
		if err := c.LoadFile(path); err != nil {
			return Config{}, err
		}
	}
	for _, s := range b.used {
		if v := getenv(s.env); v != "" {
			if err := s.set(&c, v); err != nil {
				return Config{}, fmt.Errorf("%s: %w", s.env, err)
			}
		}
	}
	for _, name := range b.order {
		for _, s := range b.used {
			if s.name == name {
				if err := s.set(&c, b.values[name]); err != nil {
					return Config{}, fmt.Errorf("--%s: %w", name, err)
				}
			}
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration: %w", err)
	}
	return c, nil
}
