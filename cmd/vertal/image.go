package main

import "context"

// cmdImage is a placeholder until its owner lands it.
func cmdImage(_ context.Context, _ *env, _ []string) error { return errNotYet }
