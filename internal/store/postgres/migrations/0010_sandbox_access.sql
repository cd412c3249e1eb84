-- The E2B-compatible data plane's per-sandbox token (envdAccessToken):
-- handed to the owner on create and connect, and checked on every call a
-- client sends to the sandbox with it. Empty for a sandbox made through
-- /v1, which the E2B data plane then refuses.
ALTER TABLE sandboxes ADD COLUMN access_token TEXT NOT NULL DEFAULT '';
