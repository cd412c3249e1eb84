package main

import "context"

// cmdMCP is a placeholder until its owner lands it.
func cmdMCP(_ context.Context, _ *env, _ []string) error { return errNotYet }
