-- Async executions (issue 11). An async execution keeps its request (the
-- user's code, blanked by Purge) so a queue worker on any node can run it.
-- owner is the node running it, '' while it waits in the queue; reason says
-- why it ended without running to its end. webhook_url is NULL when the
-- execution has no webhook; the other webhook_ columns are its delivery.
ALTER TABLE executions ADD COLUMN async INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN request BLOB;
ALTER TABLE executions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN reason TEXT NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN webhook_url TEXT;
ALTER TABLE executions ADD COLUMN webhook_delivery_id TEXT NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN webhook_state TEXT NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN webhook_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN webhook_last_status INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN webhook_last_error TEXT NOT NULL DEFAULT '';

-- OwnedExecutions and QueuedAsync read only unfinished rows; their queries
-- repeat these WHERE clauses word for word so SQLite uses the indexes.
CREATE INDEX executions_owned ON executions (owner) WHERE status IN ('queued', 'running');
CREATE INDEX executions_queued_async ON executions (created_at, id) WHERE async = 1 AND status = 'queued';

-- The last heartbeat of each node; a node silent too long is settled by
-- another one (its owned executions aborted).
CREATE TABLE nodes (
	id      TEXT PRIMARY KEY,
	seen_at INTEGER NOT NULL
);

-- Each tenant's webhook signing secret, made on first use.
CREATE TABLE webhook_secrets (
	tenant     TEXT PRIMARY KEY,
	secret     TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
