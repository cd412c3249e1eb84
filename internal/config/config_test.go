package config

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

func resolve(t *testing.T, args []string, env map[string]string, names ...string) (Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	b := Bind(fs, names...)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	return b.Resolve(func(k string) string { return env[k] })
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vertal.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	c, err := resolve(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr() != "127.0.0.1:8080" || c.Driver != "oci" || c.DataDir != "/var/lib/vertal" || c.QueueTimeout.D() != 30*time.Second || c.UsesPostgres() {
		t.Errorf("defaults %+v", c)
	}
	want := map[string]Plan{
		"free": {ExecutionsPerDay: 100, RequestsPerMinute: 20, MaxTimeoutS: 10, MemoryMB: 256, MaxConcurrent: 1, MaxFiles: 10, MaxFilesMB: 1,
			MaxSandboxes: 1, MaxSandboxLifetimeS: 600, SandboxHomeMB: 64, PausedStorageMB: 64},
		"pro": {ExecutionsPerDay: 10000, RequestsPerMinute: 120, MaxTimeoutS: 60, MemoryMB: 512, MaxConcurrent: 4, MaxFiles: 50, MaxFilesMB: 10,
			MaxSandboxes: 4, MaxSandboxLifetimeS: 3600, SandboxHomeMB: 256, PausedStorageMB: 1024},
		"enterprise": {ExecutionsPerDay: 100000, RequestsPerMinute: 1200, MaxTimeoutS: 300, MemoryMB: 1024, MaxConcurrent: 16, MaxFiles: 200, MaxFilesMB: 50,
			MaxSandboxes: 16, MaxSandboxLifetimeS: 86400, SandboxHomeMB: 1024, PausedStorageMB: 10240},
	}
	if diff := cmp.Diff(want, c.Plans); diff != "" {
		t.Errorf("plans (-want +got):\n%s", diff)
	}
}

// TestPrecedence: flag > environment > file > default, per setting.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, `{"host": "10.0.0.1", "port": 9000, "max_concurrent": 3, "queue_timeout": "5s", "runtime": "runc",
		"plans": {"pro": {"executions_per_day": 20000}, "team": {"executions_per_day": 500, "requests_per_minute": 60, "max_timeout_s": 30, "memory_mb": 256, "max_concurrent": 2}}}`)
	c, err := resolve(t,
		[]string{"--config", file, "--port", "9100", "--dev", "--queue-timeout", "7"},
		map[string]string{"VERTAL_PORT": "9050", "VERTAL_MAX_CONCURRENT": "6", "VERTAL_EDGE_SECRET": "0123456789abcdef", "VERTAL_DATABASE_URL": "postgres://u:p@db/vertal"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{
		"host": c.Host, "port": c.Port, "max": c.MaxConcurrent, "queue": c.QueueTimeout.D(), "runtime": c.Runtime,
		"dev": c.Dev, "edge": c.EdgeSecret, "pg": c.UsesPostgres(),
		"pro": c.Plans["pro"], "team": c.Plans["team"], "free": c.Plans["free"],
	}
	want := map[string]any{
		"host": "10.0.0.1", "port": 9100, "max": 6, "queue": 7 * time.Second, "runtime": "runc",
		"dev": true, "edge": "0123456789abcdef", "pg": true,
		"pro": Plan{ExecutionsPerDay: 20000, RequestsPerMinute: 120, MaxTimeoutS: 60, MemoryMB: 512, MaxConcurrent: 4, MaxFiles: 50, MaxFilesMB: 10,
			MaxSandboxes: 4, MaxSandboxLifetimeS: 3600, SandboxHomeMB: 256, PausedStorageMB: 1024},
		"team": Plan{ExecutionsPerDay: 500, RequestsPerMinute: 60, MaxTimeoutS: 30, MemoryMB: 256, MaxConcurrent: 2},
		"free": DefaultPlans()["free"],
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// A plan without file caps gets the free plan's.
	if team := c.Plans["team"]; team.FilesLimit() != 10 || team.FilesBytes() != 1<<20 {
		t.Errorf("team file caps = %d files, %d bytes; want the free plan's 10, 1 MiB", team.FilesLimit(), team.FilesBytes())
	}
	// VERTAL_CONFIG names the file when --config does not.
	c, err = resolve(t, nil, map[string]string{"VERTAL_CONFIG": file})
	if err != nil || c.Port != 9000 {
		t.Errorf("VERTAL_CONFIG: %v %d", err, c.Port)
	}
}

func TestBindSubset(t *testing.T) {
	c, err := resolve(t, []string{"--data-dir", "/tmp/x"}, map[string]string{"VERTAL_PORT": "notanumber"}, "data-dir", "database-url")
	if err != nil || c.DataDir != "/tmp/x" {
		t.Fatalf("%v %+v", err, c)
	}
	if _, err := resolve(t, []string{"--port", "1"}, nil, "data-dir"); err == nil {
		t.Errorf("unbound flag accepted")
	}
}

// TestPoolOff checks that --pool-max 0 alone turns the pool off, as its
// help says, although pool-min defaults to 1.
func TestPoolOff(t *testing.T) {
	c, err := resolve(t, []string{"--pool-max", "0"}, nil)
	if err != nil {
		t.Fatalf("--pool-max 0: %v", err)
	}
	if c.PoolMax != 0 {
		t.Errorf("PoolMax = %d, want 0", c.PoolMax)
	}
}

// TestEgress: plans have no network by default; the config file and
// --egress (or VERTAL_EGRESS) give a plan an allowlist, the flag adding to
// the file's, and a plan's cap defaults to DefaultEgressMaxBytes.
func TestEgress(t *testing.T) {
	c, err := resolve(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range c.Plans {
		if p.Egress != nil || p.EgressPolicy().Enabled() {
			t.Errorf("plan %s has egress by default: %+v", name, p.Egress)
		}
	}
	file := writeFile(t, `{"plans": {"pro": {"egress": {"allow": ["pypi.org", "*.pythonhosted.org"], "max_bytes": 1048576}}}}`)
	c, err = resolve(t, []string{"--config", file, "--egress", "pro:203.0.113.0/24", "--egress", "free:example.com,free:example.org"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pro, free := c.Plans["pro"].EgressPolicy(), c.Plans["free"].EgressPolicy()
	if got := pro.Strings(); !slices.Equal(got, []string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24"}) || pro.MaxBytes != 1<<20 {
		t.Errorf("pro's egress = %q, %d bytes", got, pro.MaxBytes)
	}
	if got := free.Strings(); !slices.Equal(got, []string{"example.com", "example.org"}) || free.MaxBytes != DefaultEgressMaxBytes {
		t.Errorf("free's egress = %q, %d bytes", got, free.MaxBytes)
	}
	if c.Plans["enterprise"].Egress != nil {
		t.Errorf("enterprise got egress: %+v", c.Plans["enterprise"].Egress)
	}
}

func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		file string
		want string
	}{
		{"bad driver", []string{"--driver", "lxc"}, nil, "", `driver "lxc"`},
		{"bad runtime", []string{"--runtime", "kata"}, nil, "", `runtime "kata"`},
		{"crun on docker", []string{"--driver", "docker", "--runtime", "crun"}, nil, "", "docker driver"},
		{"port", []string{"--port", "70000"}, nil, "", "port 70000"},
		{"port not a number", nil, map[string]string{"VERTAL_PORT": "http"}, "", "VERTAL_PORT"},
		{"queue", []string{"--queue-timeout", "soon"}, nil, "", "invalid duration"},
		{"zero concurrency", []string{"--max-concurrent", "0"}, nil, "", "max-concurrent"},
		{"mysql", []string{"--database-url", "mysql://x"}, nil, "", "database-url"},
		{"short edge secret", []string{"--edge-secret", "short"}, nil, "", "edge-secret"},
		{"metrics addr", []string{"--metrics-addr", "9090"}, nil, "", "metrics-addr"},
		{"metrics on api port", []string{"--metrics-addr", "127.0.0.1:8080"}, nil, "", "must differ"},
		{"dev not bool", nil, map[string]string{"VERTAL_DEV": "maybe"}, "", "VERTAL_DEV"},
		{"unknown file key", nil, nil, `{"hots": "x"}`, "unknown field"},
		{"unknown plan key", nil, nil, `{"plans": {"pro": {"executions": 1}}}`, "unknown field"},
		{"bad plan", nil, nil, `{"plans": {"pro": {"max_timeout_s": 0}}}`, "plan pro: max_timeout_s"},
		{"new plan missing fields", nil, nil, `{"plans": {"team": {"executions_per_day": 5}}}`, "plan team"},
		{"plan name", nil, nil, `{"plans": {"Team X": {"executions_per_day": 5, "requests_per_minute": 1, "max_timeout_s": 1, "memory_mb": 64, "max_concurrent": 1}}}`, "plan name"},
		{"plan max_concurrent", nil, nil, `{"plans": {"pro": {"max_concurrent": 0}}}`, "plan pro: max_concurrent must be in 1..1024"},
		{"plan max_sandboxes", nil, nil, `{"plans": {"pro": {"max_sandboxes": -1}}}`, "plan pro: max_sandboxes must be in 0..1024"},
		{"plan sandbox lifetime", nil, nil, `{"plans": {"pro": {"max_sandbox_lifetime_s": 604801}}}`, "plan pro: max_sandbox_lifetime_s"},
		{"egress dns not an address", []string{"--egress-dns", "dns.example:53"}, nil, "", "egress-dns"},
		{"egress without allow", nil, nil, `{"plans": {"pro": {"egress": {"allow": []}}}}`, "plan pro: egress: allow is empty"},
		{"egress bad rule", nil, nil, `{"plans": {"pro": {"egress": {"allow": ["https://pypi.org"]}}}}`, "plan pro: egress"},
		{"egress negative cap", nil, nil, `{"plans": {"pro": {"egress": {"allow": ["pypi.org"], "max_bytes": -1}}}}`, "plan pro: egress"},
		{"egress unknown key", nil, nil, `{"plans": {"pro": {"egress": {"allow": ["pypi.org"], "deny": ["x.org"]}}}}`, "unknown field"},
		{"egress flag without plan", []string{"--egress", "pypi.org"}, nil, "", "PLAN:RULE"},
		{"egress flag unknown plan", []string{"--egress", "team:pypi.org"}, nil, "", `no plan "team"`},
		{"egress flag bad rule", nil, map[string]string{"VERTAL_EGRESS": "pro:*.org"}, "", "plan pro: egress"},
		{"unknown language", nil, nil, `{"languages": {"ruby": {"image": "ruby:3"}}}`, `language "ruby"`},
		{"file with path", nil, nil, `{"languages": {"python": {"file": "../main.py"}}}`, "plain file name"},
		{"bad duration in file", nil, nil, `{"queue_timeout": true}`, "duration"},
		{"relative state dir", []string{"--state-dir", "run/vertal"}, nil, "", "state-dir"},
		{"pool min over max", []string{"--pool-min", "3", "--pool-max", "2"}, nil, "", "pool-min 3"},
		{"zero max conns", []string{"--max-conns", "0"}, nil, "", "max-conns 0"},
		{"per-ip over total", []string{"--max-conns", "10", "--max-conns-per-ip", "11"}, nil, "", "max-conns-per-ip 11"},
		{"negative per-ip", nil, map[string]string{"VERTAL_MAX_CONNS_PER_IP": "-1"}, "", "max-conns-per-ip -1"},
		{"per-ip not a number", nil, map[string]string{"VERTAL_MAX_CONNS_PER_IP": "many"}, "", "VERTAL_MAX_CONNS_PER_IP"},
		{"zero idle timeout", []string{"--idle-timeout", "0"}, nil, "", "idle-timeout"},
		{"long idle timeout in file", nil, nil, `{"idle_timeout": "1h"}`, "idle-timeout 1h0m0s"},
		{"advertise url without scheme", []string{"--advertise-url", "10.0.0.5:8080"}, nil, "", "advertise-url"},
		{"advertise url ftp", nil, map[string]string{"VERTAL_ADVERTISE_URL": "ftp://10.0.0.5"}, "", "advertise-url"},
		{"advertise url without host", []string{"--advertise-url", "http://:8080"}, nil, "", "with a host"},
		{"advertise url with user", []string{"--advertise-url", "http://u:p@10.0.0.5:8080"}, nil, "", "no user"},
		{"advertise url with query", nil, nil, `{"advertise_url": "http://10.0.0.5:8080/?x=1"}`, "no user, query"},
		// Mailed links come from public-url only, never from a request's Host.
		{"smtp without public url", []string{"--smtp-url", "smtp://127.0.0.1:25?from=a@b.c"}, nil, "", "smtp-url needs public-url"},
		{"smtp in env without public url", nil, map[string]string{"VERTAL_SMTP_URL": "smtp://127.0.0.1:25"}, "", "set --public-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, tc.file)}, args...)
			}
			_, err := resolve(t, args, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestResolveLanguages(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, VersionsFile), []byte(`{"python":"3.11.2","javascript":"22.23.5","bash":"5.2.15"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.ImageDir = dir
	got, err := c.ResolveLanguages()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	want := []engine.Language{
		{Name: "python", Image: root, File: "main.py", Command: []string{"python3", "/code/main.py"}, Version: "3.11.2"},
		{Name: "javascript", Image: root, File: "main.js", Command: []string{"node", "/code/main.js"}, Version: "22.23.5"},
		{Name: "bash", Image: root, File: "main.sh", Command: []string{"bash", "/code/main.sh"}, Version: "5.2.15"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("oci (-want +got):\n%s", diff)
	}

	c.Driver = "docker"
	c.Languages = map[string]LanguageOverride{
		"python": {Image: "python:3.12-slim", Version: "3.12.7"},
		"bash":   {File: "run.bash"},
	}
	got, err = c.ResolveLanguages()
	if err != nil {
		t.Fatal(err)
	}
	want = []engine.Language{
		{Name: "python", Image: "python:3.12-slim", File: "main.py", Command: []string{"python3", "/code/main.py"}, Version: "3.12.7"},
		{Name: "javascript", Image: DefaultDockerImage, File: "main.js", Command: []string{"node", "/code/main.js"}, Version: "22.23.5"},
		{Name: "bash", Image: DefaultDockerImage, File: "run.bash", Command: []string{"bash", "/code/run.bash"}, Version: "5.2.15"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("docker with overrides (-want +got):\n%s", diff)
	}

	// No versions file: versions are unknown, not an error.
	c = Default()
	c.ImageDir = t.TempDir()
	got, err = c.ResolveLanguages()
	if err != nil || got[0].Version != "" {
		t.Errorf("%v %+v", err, got)
	}
	// A broken versions file is an error.
	os.WriteFile(filepath.Join(c.ImageDir, VersionsFile), []byte("{"), 0o644)
	if _, err := c.ResolveLanguages(); err == nil {
		t.Errorf("broken versions.json accepted")
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"30s": 30 * time.Second, "1m30s": 90 * time.Second, "30": 30 * time.Second, "0.5": 500 * time.Millisecond, " 2 ": 2 * time.Second} {
		got, err := ParseDuration(in)
		if err != nil || got.D() != want {
			t.Errorf("%q: %v %v", in, got.D(), err)
		}
	}
	for _, in := range []string{"", "soon", "NaN", "Inf", "1x"} {
		if _, err := ParseDuration(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// TestConnectionLimits: defaults, and each way of setting them.
func TestConnectionLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		env   map[string]string
		file  string
		conns int
		perIP int
		idle  time.Duration
	}{
		{name: "defaults", conns: DefaultMaxConns, perIP: DefaultMaxConnsPerIP, idle: DefaultIdleTimeout},
		{name: "flags", args: []string{"--max-conns", "100", "--max-conns-per-ip", "0", "--idle-timeout", "5s"}, conns: 100, perIP: 0, idle: 5 * time.Second},
		{name: "environment", env: map[string]string{"VERTAL_MAX_CONNS": "200", "VERTAL_MAX_CONNS_PER_IP": "8", "VERTAL_IDLE_TIMEOUT": "30"}, conns: 200, perIP: 8, idle: 30 * time.Second},
		{name: "file", file: `{"max_conns": 300, "max_conns_per_ip": 9, "idle_timeout": "1m"}`, conns: 300, perIP: 9, idle: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, tc.file)}, args...)
			}
			c, err := resolve(t, args, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			if c.MaxConns != tc.conns || c.MaxConnsPerIP != tc.perIP || c.IdleTimeout.D() != tc.idle {
				t.Errorf("got %d, %d, %s; want %d, %d, %s", c.MaxConns, c.MaxConnsPerIP, c.IdleTimeout.D(), tc.conns, tc.perIP, tc.idle)
			}
		})
	}
}

// TestUnauthConnLimits: the caps on unauthenticated connections, the
// header timeout and the proxy ranges come from flags, environment and
// file; a bad value is an error naming the setting.
func TestUnauthConnLimits(t *testing.T) {
	type limits struct {
		Unauth, PerPrefix int
		Header            time.Duration
		Proxies           []string
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		file string
		want limits
		err  string
	}{
		{name: "defaults", want: limits{DefaultMaxConns / 4, DefaultMaxUnauthConnsPerPrefix, DefaultHeaderTimeout, nil}},
		{name: "a quarter of max-conns", args: []string{"--max-conns", "100"}, want: limits{25, DefaultMaxUnauthConnsPerPrefix, DefaultHeaderTimeout, nil}},
		{name: "flags", args: []string{"--max-unauth-conns", "50", "--max-unauth-conns-per-prefix", "0", "--header-timeout", "3s", "--proxy-cidr", "10.0.0.0/8", "--proxy-cidr", "::1"},
			want: limits{50, 0, 3 * time.Second, []string{"10.0.0.0/8", "::1"}}},
		{name: "environment", env: map[string]string{"VERTAL_MAX_UNAUTH_CONNS": "60", "VERTAL_MAX_UNAUTH_CONNS_PER_PREFIX": "6", "VERTAL_HEADER_TIMEOUT": "4", "VERTAL_PROXY_CIDR": "127.0.0.1, 192.168.0.0/16"},
			want: limits{60, 6, 4 * time.Second, []string{"127.0.0.1", "192.168.0.0/16"}}},
		{name: "file", file: `{"max_unauth_conns": 70, "max_unauth_conns_per_prefix": 7, "header_timeout": "5s", "proxy_cidrs": ["172.16.0.0/12"]}`,
			want: limits{70, 7, 5 * time.Second, []string{"172.16.0.0/12"}}},
		{name: "over max-conns", args: []string{"--max-conns", "10", "--max-unauth-conns", "11"}, err: "max-unauth-conns 11 is not in 0..max-conns (10)"},
		{name: "negative per prefix", args: []string{"--max-unauth-conns-per-prefix", "-1"}, err: "max-unauth-conns-per-prefix must not be negative"},
		{name: "no header timeout", args: []string{"--header-timeout", "0s"}, err: "header-timeout 0s is not in (0, 10m]"},
		{name: "bad proxy", args: []string{"--proxy-cidr", "proxy.example"}, err: `proxy-cidr: "proxy.example" is not a CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, tc.file)}, args...)
			}
			c, err := resolve(t, args, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := limits{c.UnauthConns(), c.MaxUnauthConnsPerPrefix, c.HeaderTimeout.D(), c.ProxyCIDRs}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
			if _, err := c.Proxies(); err != nil {
				t.Errorf("proxies: %v", err)
			}
		})
	}
}

// TestProxiesUnmapped: a proxy given as an IPv4-mapped IPv6 address is the
// IPv4 address that its connections are matched as.
func TestProxiesUnmapped(t *testing.T) {
	c := Default()
	c.ProxyCIDRs = []string{"::ffff:10.0.0.1", "::ffff:192.168.0.0/112", "2001:db8::/32"}
	got, err := c.Proxies()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.1/32", "192.168.0.0/16", "2001:db8::/32"}
	var s []string
	for _, p := range got {
		s = append(s, p.String())
	}
	if strings.Join(s, " ") != strings.Join(want, " ") {
		t.Errorf("Proxies() = %v, want %v", got, want)
	}
}
