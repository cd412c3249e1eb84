package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// accountSettings are what the account commands read besides the store:
// the public URL their links start with, and the sign-up mode.
var accountSettings = []string{"public-url", "signup"}

// operatorCommand parses an operator command with want positional
// arguments, opens the store and calls run.
func operatorCommand(ctx context.Context, e *env, args []string, name, usage string, want int,
	extra func(fs *flag.FlagSet), run func(cfg config.Config, st store.Store, pos []string) error) error {
	fs := newFlagSet(e, name, usage)
	if extra != nil {
		extra(fs)
	}
	cfg, pos, err := operatorFlags(e, fs, args, accountSettings...)
	if err != nil {
		return err
	}
	if len(pos) != want {
		return usageError(fs)
	}
	st, _, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	return run(cfg, st, pos)
}

func cmdInvite(ctx context.Context, e *env, args []string) error {
	var plan, tenant *string
	return operatorCommand(ctx, e, args, "invite", "invite EMAIL [--plan P] [--tenant T]\n\nPrints a one-time sign-up link (valid 7 days). With --tenant the account\nowns that existing tenant (one made with create-key), keeping its plan.", 1,
		func(fs *flag.FlagSet) {
			plan = fs.String("plan", "free", "the plan of the new tenant")
			tenant = fs.String("tenant", "", "attach this existing tenant instead of making a new one")
		},
		func(cfg config.Config, st store.Store, pos []string) error {
			if cfg.Signup == account.SignupClosed {
				return errors.New("sign-up is closed on this server (--signup closed): an invite would not work")
			}
			if _, ok := cfg.Plans[*plan]; !ok {
				return fmt.Errorf("unknown plan %q (configured: %v)", *plan, config.PlanNames(cfg.Plans))
			}
			svc, err := account.New(account.Options{Store: st, Signup: cfg.Signup, PublicURL: cfg.PublicURL})
			if err != nil {
				return err
			}
			link, err := svc.Invite(ctx, pos[0], *plan, *tenant)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.Stdout, link)
			return nil
		})
}

func cmdResetLink(ctx context.Context, e *env, args []string) error {
	return operatorCommand(ctx, e, args, "reset-link", "reset-link EMAIL\n\nPrints a one-time password reset link (valid one hour) for a server without SMTP.", 1, nil,
		func(cfg config.Config, st store.Store, pos []string) error {
			svc, err := account.New(account.Options{Store: st, Signup: cfg.Signup, PublicURL: cfg.PublicURL})
			if err != nil {
				return err
			}
			link, err := svc.ResetLink(ctx, pos[0])
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no account with email %s", pos[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(e.Stdout, link)
			return nil
		})
}

func cmdTenants(ctx context.Context, e *env, args []string) error {
	return operatorCommand(ctx, e, args, "tenants", "tenants", 0, nil,
		func(cfg config.Config, st store.Store, _ []string) error {
			tenants, err := st.Tenants(ctx)
			if err != nil {
				return err
			}
			accounts, err := st.ListAccounts(ctx)
			if err != nil {
				return err
			}
			owner := map[string]string{}
			for _, a := range accounts {
				owner[a.Tenant] = a.Email
			}
			day := time.Now().UTC().Format(time.DateOnly)
			tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tPLAN\tSTATUS\tACCOUNT\tTODAY (EXECUTIONS)")
			for _, t := range tenants {
				u, err := st.Usage(ctx, t.ID, day)
				if err != nil {
					return err
				}
				status := "active"
				if t.Disabled {
					status = "disabled"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d / %d\n", t.ID, t.Plan, status, owner[t.ID], u.Executions, cfg.Plans[t.Plan].ExecutionsPerDay)
			}
			return tw.Flush()
		})
}

func cmdSetPlan(ctx context.Context, e *env, args []string) error {
	return operatorCommand(ctx, e, args, "set-plan", "set-plan TENANT PLAN", 2, nil,
		func(cfg config.Config, st store.Store, pos []string) error {
			if _, ok := cfg.Plans[pos[1]]; !ok {
				return fmt.Errorf("unknown plan %q (configured: %v)", pos[1], config.PlanNames(cfg.Plans))
			}
			if err := st.SetPlan(ctx, pos[0], pos[1]); errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no tenant %s", pos[0])
			} else if err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "tenant %s is on plan %s\n", pos[0], pos[1])
			return nil
		})
}

func setDisabled(ctx context.Context, e *env, args []string, name string, disabled bool) error {
	return operatorCommand(ctx, e, args, name, name+" TENANT\n\nTakes effect on the next request, on every node.", 1, nil,
		func(_ config.Config, st store.Store, pos []string) error {
			if err := st.SetTenantDisabled(ctx, pos[0], disabled); errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no tenant %s", pos[0])
			} else if err != nil {
				return err
			}
			state := "enabled"
			if disabled {
				state = "disabled"
			}
			fmt.Fprintf(e.Stdout, "tenant %s %s\n", pos[0], state)
			return nil
		})
}

func cmdDisableTenant(ctx context.Context, e *env, args []string) error {
	return setDisabled(ctx, e, args, "disable-tenant", true)
}

func cmdEnableTenant(ctx context.Context, e *env, args []string) error {
	return setDisabled(ctx, e, args, "enable-tenant", false)
}

func cmdMakeOperator(ctx context.Context, e *env, args []string) error {
	return operatorCommand(ctx, e, args, "make-operator", "make-operator EMAIL", 1, nil,
		func(_ config.Config, st store.Store, pos []string) error {
			a, err := st.AccountByEmail(ctx, pos[0])
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("no account with email %s", pos[0])
			}
			if err != nil {
				return err
			}
			if err := st.SetRole(ctx, a.ID, store.RoleOperator); err != nil {
				return err
			}
			fmt.Fprintf(e.Stdout, "%s is an operator\n", a.Email)
			return nil
		})
}
