-- The execution a running idempotency claim has accepted and not yet
-- finished, so that settling that execution after a crash (AbortExecution)
-- also completes the claim, and a retry replays the settled result rather
-- than waiting for the claim to be abandoned. '' when none.
ALTER TABLE idempotency ADD COLUMN pending_id TEXT NOT NULL DEFAULT '';
