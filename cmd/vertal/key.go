package main

import (
	"context"
)

// cmdKey is the short form the self-hosting docs use on a server
// (`vertal key acme pro`); it is create-key with the plan positional.
func cmdKey(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "key", "key TENANT [PLAN]\n\nMakes an API key for TENANT on PLAN (default "+defaultKeyPlan+"; also free, pro, enterprise or one\n"+
		"from the config file; it moves every key of the tenant to PLAN) and prints it on stdout, once.\nSame as create-key TENANT --plan PLAN.")
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		return usageError(fs)
	}
	plan := defaultKeyPlan
	if len(pos) == 2 {
		plan = pos[1]
	}
	return createKey(ctx, e, cfg, pos[0], plan, len(pos) == 2)
}
