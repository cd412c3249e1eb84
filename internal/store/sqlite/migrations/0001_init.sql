-- Times are Unix microseconds (UTC); days are "2006-01-02" in UTC.

CREATE TABLE tenants (
	id         TEXT PRIMARY KEY,
	plan       TEXT NOT NULL,
	created_at INTEGER NOT NULL
);

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	tenant     TEXT NOT NULL REFERENCES tenants (id),
	hash       BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
	created_at INTEGER NOT NULL,
	revoked_at INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant, created_at);

-- stdout and stderr are BLOBs because user code may print any bytes.
CREATE TABLE executions (
	id                TEXT PRIMARY KEY,
	tenant            TEXT NOT NULL,
	key_id            TEXT NOT NULL,
	request_id        TEXT NOT NULL,
	language          TEXT NOT NULL,
	status            TEXT NOT NULL,
	stdout            BLOB NOT NULL,
	stderr            BLOB NOT NULL,
	exit_code         INTEGER NOT NULL,
	duration_ms       INTEGER NOT NULL,
	truncated         INTEGER NOT NULL,
	sandbox_seconds   REAL NOT NULL,
	cpu_seconds       REAL NOT NULL,
	peak_memory_bytes INTEGER NOT NULL,
	created_at        INTEGER NOT NULL,
	purged            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX executions_unpurged ON executions (created_at) WHERE purged = 0;

-- executions counts quota reservations; the seconds come from saved executions.
CREATE TABLE usage_days (
	tenant          TEXT NOT NULL,
	day             TEXT NOT NULL,
	executions      INTEGER NOT NULL DEFAULT 0,
	sandbox_seconds REAL NOT NULL DEFAULT 0,
	cpu_seconds     REAL NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant, day)
);

CREATE TABLE rate_windows (
	tenant       TEXT NOT NULL,
	window_start INTEGER NOT NULL,
	requests     INTEGER NOT NULL,
	PRIMARY KEY (tenant, window_start)
);
CREATE INDEX rate_windows_start ON rate_windows (window_start);

CREATE TABLE idempotency (
	tenant       TEXT NOT NULL,
	idem_key     TEXT NOT NULL,
	body_hash    TEXT NOT NULL,
	execution_id TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL,
	PRIMARY KEY (tenant, idem_key)
);
CREATE INDEX idempotency_created_at ON idempotency (created_at);
