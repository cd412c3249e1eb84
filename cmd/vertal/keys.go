package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// The operator commands reach the store directly (no running server
// needed) with the same --data-dir / --database-url / --config as serve.
var storeSettings = []string{"data-dir", "database-url"}

// operatorFlags parses args, which may mix flags and positional arguments
// (`create-key acme --plan pro`), and returns the configuration and the
// positional arguments. extra names settings beyond the store's that the
// command reads too.
func operatorFlags(e *env, fs *flag.FlagSet, args []string, extra ...string) (config.Config, []string, error) {
	b := config.Bind(fs, append(extra, storeSettings...)...)
	pos, rest, err := parseInterspersed(fs, args)
	if err != nil {
		return config.Config{}, nil, parseError(err)
	}
	cfg, err := b.Resolve(e.Getenv)
	return cfg, append(pos, rest...), err
}

// defaultKeyPlan is the plan a key gets when none is named: the least
// privileged, so a forgotten argument never hands out a paid plan.
const defaultKeyPlan = "free"

func cmdCreateKey(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "create-key", "create-key TENANT [--plan P]\n\nPrints the new key on stdout, once; details go to stderr.")
	plan := fs.String("plan", defaultKeyPlan, "the tenant's plan (free, pro, enterprise or one from the config file); given for an existing tenant, changes its plan")
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs)
	}
	planSet := false
	fs.Visit(func(f *flag.Flag) { planSet = planSet || f.Name == "plan" })
	return createKey(ctx, e, cfg, pos[0], *plan, planSet)
}

// createKey makes a key for tenant on plan and prints it, once, alone on
// stdout (so KEY=$(vertal create-key ...) works); details go to stderr.
// planSet: the operator named the plan, so an existing tenant moves to it.
func createKey(ctx context.Context, e *env, cfg config.Config, tenant, plan string, planSet bool) error {
	if _, ok := cfg.Plans[plan]; !ok {
		return fmt.Errorf("unknown plan %q (configured: %v)", plan, config.PlanNames(cfg.Plans))
	}
	st, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	// The key creates the tenant on the plan; a plan the operator named
	// for an existing tenant is a plan change and goes through SetPlan,
	// the only writer of an existing tenant's plan.
	secret, k, err := api.CreateKey(ctx, st, tenant, plan, time.Now())
	if err == nil && planSet && k.Plan != plan {
		if err = st.SetPlan(ctx, k.Tenant, plan); err == nil {
			k.Plan = plan
		}
	}
	if errors.Is(err, store.ErrTooManyKeys) {
		return fmt.Errorf("tenant %s already has %d active keys; revoke one first (vertal list-keys %s)", tenant, store.MaxActiveKeys, tenant)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, secret)
	fmt.Fprintf(e.Stderr, "created key %s for tenant %s (plan %s); it is shown only once, store it now\n", k.ID, k.Tenant, k.Plan)
	return nil
}

func cmdRevokeKey(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "revoke-key", "revoke-key KEY_ID\n\nThe key stops working at once, on every node.")
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs)
	}
	if !api.ValidKeyID(pos[0]) {
		return fmt.Errorf("%q is not a key id (key_ and 12 hex digits; see vertal list-keys)", pos[0])
	}
	st, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.RevokeKey(ctx, pos[0], time.Now()); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("no active key %s", pos[0])
	} else if err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "revoked %s\n", pos[0])
	return nil
}

type keyJSON struct {
	ID        string `json:"key_id"`
	Tenant    string `json:"tenant"`
	Plan      string `json:"plan"`
	CreatedAt int64  `json:"created_at"`
	RevokedAt *int64 `json:"revoked_at"`
}

func cmdListKeys(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "list-keys", "list-keys [TENANT] [--json]\n\nLists key ids, never the keys themselves.")
	asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageError(fs)
	}
	tenant := ""
	if len(pos) == 1 {
		tenant = pos[0]
	}
	st, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	keys, err := st.ListKeys(ctx, tenant)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.Stdout)
		for _, k := range keys {
			j := keyJSON{ID: k.ID, Tenant: k.Tenant, Plan: k.Plan, CreatedAt: k.CreatedAt.Unix()}
			if !k.RevokedAt.IsZero() {
				r := k.RevokedAt.Unix()
				j.RevokedAt = &r
			}
			if err := enc.Encode(j); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY ID\tTENANT\tPLAN\tCREATED (UTC)\tSTATUS")
	for _, k := range keys {
		status := "active"
		if !k.RevokedAt.IsZero() {
			status = "revoked " + k.RevokedAt.UTC().Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Tenant, k.Plan, k.CreatedAt.UTC().Format(time.DateTime), status)
	}
	return tw.Flush()
}

func cmdPurge(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "purge", "purge --days N")
	days := fs.Int("days", 0, "delete stored stdout/stderr of executions, and the records of ended sandboxes, older than this many days (at least 1); metering is kept")
	cfg, pos, err := operatorFlags(e, fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *days < 1 {
		return usageError(fs)
	}
	st, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	before := time.Now().UTC().Add(-time.Duration(*days) * 24 * time.Hour)
	n, err := st.Purge(ctx, before)
	if err != nil {
		return err
	}
	// An ended sandbox's record is readable for as long as an execution's
	// output is kept: the same cutoff ends both.
	var m int64
	if ss, ok := st.(store.Sandboxes); ok {
		if m, err = ss.PurgeSandboxes(ctx, before); err != nil {
			return err
		}
	}
	fmt.Fprintf(e.Stdout, "purged the output of %d executions created before %s and the records of %d sandboxes that ended before then; metering kept\n",
		n, before.Format(time.RFC3339), m)
	return nil
}
