package main

import "context"

// cmdCreateKey is a placeholder until its owner lands it.
func cmdCreateKey(_ context.Context, _ *env, _ []string) error { return errNotYet }

// cmdRevokeKey is a placeholder until its owner lands it.
func cmdRevokeKey(_ context.Context, _ *env, _ []string) error { return errNotYet }

// cmdListKeys is a placeholder until its owner lands it.
func cmdListKeys(_ context.Context, _ *env, _ []string) error { return errNotYet }

// cmdPurge is a placeholder until its owner lands it.
func cmdPurge(_ context.Context, _ *env, _ []string) error { return errNotYet }
