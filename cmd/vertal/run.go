package main

import "context"

// cmdRun is a placeholder until its owner lands it.
func cmdRun(_ context.Context, _ *env, _ []string) error { return errNotYet }

// cmdUsage is a placeholder until its owner lands it.
func cmdUsage(_ context.Context, _ *env, _ []string) error { return errNotYet }
