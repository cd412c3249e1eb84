package main

import "context"

// cmdBench is a placeholder until its owner lands it.
func cmdBench(_ context.Context, _ *env, _ []string) error { return errNotYet }
