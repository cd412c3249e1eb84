-- Sandboxes that stay (package sandboxes). One row per sandbox, kept after
-- it ends for the retention period. limits, metadata and env are JSON
-- objects. node is the node that holds it live (or held it last);
-- started_at is when its current live period began (created_at, then each
-- resume), from which the plan's maximum lifetime counts. archive_path and
-- archive_bytes are the saved home of a paused one.
CREATE TABLE sandboxes (
	id            TEXT PRIMARY KEY,
	tenant        TEXT NOT NULL,
	key_id        TEXT NOT NULL,
	status        TEXT NOT NULL,
	reason        TEXT NOT NULL DEFAULT '',
	message       TEXT NOT NULL DEFAULT '',
	image         TEXT NOT NULL,
	image_version TEXT NOT NULL DEFAULT '',
	limits        TEXT NOT NULL,
	metadata      TEXT NOT NULL,
	env           TEXT NOT NULL,
	on_timeout    TEXT NOT NULL,
	timeout_s     INTEGER NOT NULL,
	node          TEXT NOT NULL,
	created_at    INTEGER NOT NULL,
	started_at    INTEGER NOT NULL,
	expires_at    INTEGER NOT NULL,
	ended_at      INTEGER,
	alive_seconds REAL NOT NULL DEFAULT 0,
	cpu_seconds   REAL NOT NULL DEFAULT 0,
	archive_path  TEXT NOT NULL DEFAULT '',
	archive_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sandboxes_tenant ON sandboxes (tenant, created_at, id);
CREATE INDEX sandboxes_node ON sandboxes (node, status);
-- One row per tenant that ever created a sandbox: creating one locks it,
-- so that counting the tenant's sandboxes and inserting the new one is
-- atomic on PostgreSQL too (SQLite's write transactions are exclusive).
CREATE TABLE sandbox_locks (
	tenant  TEXT PRIMARY KEY,
	creates INTEGER NOT NULL
);
-- Sandbox metering by day, apart from the executions' sandbox_seconds.
ALTER TABLE usage_days ADD COLUMN sbx_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage_days ADD COLUMN sbx_cpu_seconds REAL NOT NULL DEFAULT 0;
