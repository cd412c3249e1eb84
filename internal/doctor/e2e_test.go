package doctor

import (
	"bytes"
	"context"
	"os"
	"testing"

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
// essential protection must hold.
func TestDoctorE2E(t *testing.T) {
	requireE2E(t)
	for _, pair := range []struct{ driver, rt string }{{"oci", "crun"}, {"oci", "runc"}, {"docker", "runc"}} {
		rt := pair.rt
		t.Run(pair.driver+"/"+rt, func(t *testing.T) {
			ctx := context.Background()
			cfg := config.Default()
			cfg.Driver, cfg.Runtime, cfg.ImageDir = pair.driver, rt, e2etest.ImageDir(config.DefaultImageDir)
			if img := os.Getenv("VERTAL_DOCKER_IMAGE"); img != "" {
				cfg.DockerImage = img
			}
			langs, err := cfg.ResolveLanguages()
			if err != nil {
				t.Fatal(err)
			}
			var d engine.Driver
			var pre pool.Prestarter
			if pair.driver == "oci" {
				var od *oci.Driver
				od, err = oci.New(ctx, oci.Options{Runtime: rt, StateDir: t.TempDir()})
				if err == nil {
					defer od.Close()
					d, pre = od, oci.NewPrestarter(od)
				}
			} else {
				var dd *docker.Driver
				dd, err = docker.New(ctx, docker.Options{Runtime: rt, StateDir: t.TempDir(), Image: cfg.DockerImage})
				if err == nil {
					defer dd.Close()
					d, pre = dd, docker.NewPrestarter(dd)
				}
			}
			if err != nil {
				t.Fatalf("creating %s/%s: %v", pair.driver, rt, err)
			}
			env, err := probes.HostEnv("VERTAL_DOCTOR_CANARY")
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			env.Internet = true
			host := HostChecks(ctx, HostOptions{Driver: pair.driver, Runtime: rt, ImageDir: cfg.ImageDir})
			p := pool.New(d, pre, pool.Options{Min: 1, Max: 1, MemoryBytes: int64(cfg.PoolMemoryMB) << 20, Languages: langs, Limits: PoolLimits()})
			defer p.Close()
			rep := Run(ctx, Options{Driver: d, Languages: langs, Host: host, Probes: probes.All(env), Pool: p})
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
