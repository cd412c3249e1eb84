-- Async executions (issue 11). An async execution keeps its request (the
-- user's code, blanked by Purge) so a queue worker on any node can run it.
-- owner is the node running it, '' while it waits in the queue; reason says
-- why it ended without running to its end. webhook_url is NULL when the
-- execution has no webhook; the other webhook_ columns are its delivery.
ALTER TABLE executions
	ADD COLUMN async               BOOLEAN NOT NULL DEFAULT false,
	ADD COLUMN request             BYTEA,
	ADD COLUMN owner               TEXT NOT NULL DEFAULT '',
	ADD COLUMN reason              TEXT NOT NULL DEFAULT '',
	ADD COLUMN webhook_url         TEXT,
	ADD COLUMN webhook_delivery_id TEXT NOT NULL DEFAULT '',
	ADD COLUMN webhook_state       TEXT NOT NULL DEFAULT '',
	ADD COLUMN webhook_attempts    INTEGER NOT NULL DEFAULT 0,
	ADD COLUMN webhook_last_status INTEGER NOT NULL DEFAULT 0,
	ADD COLUMN webhook_last_error  TEXT NOT NULL DEFAULT '';

-- OwnedExecutions and QueuedAsync read only unfinished rows.
CREATE INDEX executions_owned ON executions (owner) WHERE status IN ('queued', 'running');
CREATE INDEX executions_queued_async ON executions (created_at, id) WHERE async AND status = 'queued';

-- The last heartbeat of each node; a node silent too long is settled by
-- another one (its owned executions aborted).
CREATE TABLE nodes (
	id      TEXT PRIMARY KEY,
	seen_at TIMESTAMPTZ NOT NULL
);

-- Each tenant's webhook signing secret, made on first use.
CREATE TABLE webhook_secrets (
	tenant     TEXT PRIMARY KEY,
	secret     TEXT NOT NULL,
	created_at TIMESTAMPTZ NOT NULL
);
