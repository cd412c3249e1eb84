package doctor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/docker"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/oci"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

func requireE2E(t *testing.T) {
	e2etest.Require(t, "root, crun, runc and the rootfs, to run the doctor")
}

// TestDoctorE2E runs the whole doctor, every probe, through the real
// drivers: on oci with crun and runc, and on docker with runc, every
// essential protection must hold and the egress relay must work.
func TestDoctorE2E(t *testing.T) {
	requireE2E(t)
	for _, pair := range []struct{ driver, rt string }{{"oci", "crun"}, {"oci", "runc"}, {"docker", "runc"}} {
		rt := pair.rt
		t.Run(pair.driver+"/"+rt, func(t *testing.T) {
			ctx := context.Background()
			cfg, langs := e2eConfig(t, pair.driver, rt)
			d, pre := newE2EDriver(t, pair.driver, rt, cfg.DockerImage)
			env, err := probes.HostEnv("VERTAL_DOCTOR_CANARY")
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			env.Internet = true
			host := HostChecks(ctx, HostOptions{Driver: pair.driver, Runtime: rt, ImageDir: cfg.ImageDir})
			p := pool.New(d, pre, pool.Options{Min: 1, Max: 1, MemoryBytes: int64(cfg.PoolMemoryMB) << 20, Languages: langs, Limits: PoolLimits()})
			defer p.Close()
			rep := Run(ctx, Options{Driver: d, Languages: langs, Host: host, Probes: probes.All(env), Pool: p,
				Egress: &EgressOptions{Plans: cfg.Plans, Agent: buildAgent(t)}})
			var buf bytes.Buffer
			rep.WriteTable(&buf)
			t.Logf("\n%s", buf.String())
			for _, c := range rep.Failed() {
				t.Errorf("essential check failed on %s: %s: %s", d.Name(), c.Name, c.Detail)
			}
			warm := 0
			for _, c := range rep.Checks {
				if c.Group == "warm pool" && c.Name != "pool state" {
					warm++
					if c.Status != StatusOK {
						t.Errorf("%s on %s: %s: %s", c.Name, d.Name(), c.Status, c.Detail)
					}
				}
				if c.Group == "egress" && c.Status != StatusOK {
					t.Errorf("%s on %s: %s: %s", c.Name, d.Name(), c.Status, c.Detail)
				}
				if c.Group == "isolation" && c.Status == StatusSkipped {
					t.Errorf("probe %q skipped: %s", c.Name, c.Detail)
				}
			}
			if warm != len(langs) {
				t.Errorf("%d warm pool checks, want one per language (%d)", warm, len(langs))
			}
		})
	}
}

// e2eConfig is the default config on driver and runtime with the test
// image, and its languages.
func e2eConfig(t *testing.T, driver, rt string) (config.Config, []engine.Language) {
	t.Helper()
	cfg := config.Default()
	cfg.Driver, cfg.Runtime, cfg.ImageDir = driver, rt, e2etest.ImageDir(config.DefaultImageDir)
	if img := os.Getenv("VERTAL_DOCKER_IMAGE"); img != "" {
		cfg.DockerImage = img
	}
	langs, err := cfg.ResolveLanguages()
	if err != nil {
		t.Fatal(err)
	}
	return cfg, langs
}

// newE2EDriver creates the real driver ("oci" or "docker") on runtime rt
// ("" is the driver's default), closed when the test ends.
func newE2EDriver(t *testing.T, driver, rt, dockerImage string) (engine.Driver, pool.Prestarter) {
	t.Helper()
	ctx := context.Background()
	if driver == "oci" {
		// t.TempDir's parent is private to root; bwrap runs as the
		// sandbox's uid and must pass it.
		dir := t.TempDir()
		if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
			t.Fatal(err)
		}
		od, err := oci.New(ctx, oci.Options{Runtime: rt, StateDir: dir})
		if err != nil {
			t.Fatalf("creating oci/%s: %v", rt, err)
		}
		t.Cleanup(func() { od.Close() })
		return od, oci.NewPrestarter(od)
	}
	dd, err := docker.New(ctx, docker.Options{Runtime: rt, StateDir: t.TempDir(), Image: dockerImage})
	if err != nil {
		t.Fatalf("creating docker/%s: %v", rt, err)
	}
	t.Cleanup(func() { dd.Close() })
	return dd, docker.NewPrestarter(dd)
}

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// buildAgent builds the agent (cmd/vertal-agent), static, once per test
// binary.
func buildAgent(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "vertal-agent")
		if err != nil {
			agentErr = err
			return
		}
		agentPath = filepath.Join(dir, "vertal-agent")
		cmd := exec.Command("go", "build", "-o", agentPath, "github.com/kuboprotocol/vertal2kubo/cmd/vertal-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("building the agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentPath
}

// TestEgressE2E runs the egress group through the real drivers and the
// real agent: the default oci runtime and runsc, docker with runc and
// runsc. With a plan that allows egress the relay row is essential, and
// it must pass: the relay reaches the host's socket and nothing else
// leaves. The check's directory is gone afterwards.
func TestEgressE2E(t *testing.T) {
	requireE2E(t)
	bin := buildAgent(t)
	for _, pair := range []struct{ driver, rt string }{{"oci", ""}, {"oci", "runsc"}, {"docker", "runc"}, {"docker", "runsc"}} {
		name := pair.rt
		if name == "" {
			name = "default"
		}
		t.Run(pair.driver+"/"+name, func(t *testing.T) {
			t.Setenv("TMPDIR", t.TempDir())
			cfg, langs := e2eConfig(t, pair.driver, pair.rt)
			cfg.Plans["pro"] = config.Plan{Egress: &config.Egress{Allow: []string{"pypi.org"}}}
			d, _ := newE2EDriver(t, pair.driver, pair.rt, cfg.DockerImage)
			rep := Run(context.Background(), Options{Driver: d, Languages: langs, Probes: []probes.Probe{},
				Egress: &EgressOptions{Plans: cfg.Plans, Agent: bin}})
			var rows []Check
			for _, c := range rep.Checks {
				if c.Group == "egress" {
					rows = append(rows, c)
				}
			}
			want := []Check{
				{Group: "egress", Name: "plans with egress", Status: StatusOK, Detail: "pro: pypi.org (100 MiB in and out per sandbox)"},
				{Group: "egress", Name: "egress relay", Status: StatusOK, Detail: egressOKDetail, Essential: true},
			}
			if diff := cmp.Diff(want, rows); diff != "" {
				t.Errorf("egress rows on %s (-want +got):\n%s", d.Name(), diff)
			}
			if ents, err := os.ReadDir(os.Getenv("TMPDIR")); err != nil || len(ents) != 0 {
				t.Errorf("left in the temporary directory: %v (%v)", ents, err)
			}
		})
	}
}
