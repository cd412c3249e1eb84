package main

import "context"

// cmdDoctor is a placeholder until its owner lands it.
func cmdDoctor(_ context.Context, _ *env, _ []string) error { return errNotYet }
