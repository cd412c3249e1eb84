package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/doctor"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/securitytest/probes"
)

func cmdDoctor(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "doctor", "doctor [flags]\n\n"+
		"Checks that the driver, runtime, cgroups and image are usable, then runs small hostile\n"+
		"programs in real sandboxes and prints which protections are enforced, with a fix for\n"+
		"each gap. Lists the plans that allow egress and proves, in a sandbox that stays, that\n"+
		"its only way out is the agent's relay to the host's proxy socket.\n"+
		"Exits 1 when an essential check fails.")
	b := config.Bind(fs, "driver", "runtime", "image-dir", "docker-image", "pool-max", "sandbox-agent", "egress")
	stateDir := fs.String("state-dir", "/run/vertal/doctor", "private state directory for the doctor's sandboxes (never a server's: it is reaped)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("verbose", false, "log every probe's output to stderr")
	hostOnly := fs.Bool("host-only", false, "check the host and image only; run no sandbox")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg, err := b.Resolve(e.Getenv)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(e.Stderr, &slog.HandlerOptions{Level: level}))

	others := map[string]string{}
	for _, name := range cfg.ImageNames()[1:] {
		others[name] = cfg.ImageDirOf(name)
	}
	host := doctor.HostChecks(ctx, doctor.HostOptions{Driver: cfg.Driver, Runtime: cfg.Runtime, ImageDir: cfg.ImageDir, Images: others})
	langs, err := cfg.ResolveLanguages()
	if err != nil {
		return err
	}
	opts := doctor.Options{Host: host, Languages: langs, Logger: log, DriverName: driverLabel(cfg.Driver, cfg.Runtime)}
	// The agent serve would run in sandboxes that stay.
	agentPath, agentErr := findAgent(cfg)
	opts.Egress = &doctor.EgressOptions{Plans: cfg.Plans, Agent: agentPath, AgentErr: agentErr}
	if *hostOnly {
		opts.HostOnly = true
	} else {
		// The probes' view of this host: listeners the network probe
		// aims at, a planted variable the sandbox must not see. The
		// doctor also tries the internet; the security suite does not.
		penv, err := probes.HostEnv("VERTAL_DOCTOR_CANARY")
		if err != nil {
			log.Warn("the network probe runs without host listeners", "err", err)
		}
		defer penv.Close()
		penv.Internet = true
		opts.Probes = probes.All(penv)

		d, pre, closeDriver, err := newDriver(ctx, cfg, *stateDir, log)
		if err != nil {
			opts.DriverErr = err
		} else {
			defer closeDriver()
			opts.Driver = d
			if cfg.PoolMax > 0 {
				// The same pool serve builds, with one sandbox per language.
				p := pool.New(d, pre, pool.Options{Min: 1, Max: 1, MemoryBytes: int64(cfg.PoolMemoryMB) << 20, Languages: langs, Limits: doctor.PoolLimits(), Logger: log})
				defer p.Close()
				opts.Pool = p
			}
		}
	}
	if !*asJSON {
		fmt.Fprintf(e.Stdout, "vertal doctor: driver %s, image %s\n\n", opts.DriverName, cfg.ImageDir)
	}
	rep := doctor.Run(ctx, opts)
	if *asJSON {
		err = rep.WriteJSON(e.Stdout)
	} else {
		err = rep.WriteTable(e.Stdout)
	}
	if err != nil {
		return err
	}
	if len(rep.Failed()) > 0 {
		return exitCode(1)
	}
	return nil
}

func driverLabel(driver, runtime string) string {
	if runtime == "" {
		if driver == "docker" {
			return "docker/runc"
		}
		return driver + "/(best installed)"
	}
	return driver + "/" + runtime
}
