package main

import "context"

// cmdServe is a placeholder until its owner lands it.
func cmdServe(_ context.Context, _ *env, _ []string) error { return errNotYet }
