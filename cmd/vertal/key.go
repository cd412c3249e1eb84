package main

import (
	"context"
	"flag"
	"fmt"
)

// cmdKey is the short form the self-hosting docs use on a server
// (`vertal key acme pro`); it is create-key with the plan positional.
func cmdKey(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("vertal key", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(e.Stderr, "usage: vertal key TENANT [PLAN]\n\nMakes an API key for TENANT on PLAN (default %s; also free, pro, enterprise or one\n"+
			"from the config file; it moves every key of the tenant to PLAN) and prints it on stdout, once.\nSame as create-key TENANT --plan PLAN.\n\nflags:\n", defaultKeyPlan)
		fs.PrintDefaults()
	}
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		fs.Usage()
		return exitCode(2)
	}
	plan := defaultKeyPlan
	if len(pos) == 2 {
		plan = pos[1]
	}
	return createKey(ctx, e, cfg, pos[0], plan, len(pos) == 2)
}
