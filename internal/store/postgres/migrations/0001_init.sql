-- Days are "2006-01-02" in UTC, kept as text so both stores agree on them.

CREATE TABLE tenants (
	id         TEXT PRIMARY KEY,
	plan       TEXT NOT NULL,
	created_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE api_keys (
	id         TEXT PRIMARY KEY,
	tenant     TEXT NOT NULL REFERENCES tenants (id),
	hash       BYTEA NOT NULL UNIQUE CHECK (length(hash) = 32),
	created_at TIMESTAMPTZ NOT NULL,
	revoked_at TIMESTAMPTZ
);
CREATE INDEX api_keys_tenant ON api_keys (tenant, created_at);

-- stdout and stderr are BYTEA because user code may print NUL bytes and
-- invalid UTF-8, which TEXT rejects.
CREATE TABLE executions (
	id                TEXT PRIMARY KEY,
	tenant            TEXT NOT NULL,
	key_id            TEXT NOT NULL,
	request_id        TEXT NOT NULL,
	language          TEXT NOT NULL,
	status            TEXT NOT NULL,
	stdout            BYTEA NOT NULL,
	stderr            BYTEA NOT NULL,
	exit_code         INTEGER NOT NULL,
	duration_ms       BIGINT NOT NULL,
	truncated         BOOLEAN NOT NULL,
	sandbox_seconds   DOUBLE PRECISION NOT NULL,
	cpu_seconds       DOUBLE PRECISION NOT NULL,
	peak_memory_bytes BIGINT NOT NULL,
	created_at        TIMESTAMPTZ NOT NULL,
	purged            BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX executions_unpurged ON executions (created_at) WHERE NOT purged;

-- executions counts quota reservations; the seconds come from saved executions.
CREATE TABLE usage_days (
	tenant          TEXT NOT NULL,
	day             TEXT NOT NULL,
	executions      BIGINT NOT NULL DEFAULT 0,
	sandbox_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
	cpu_seconds     DOUBLE PRECISION NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant, day)
);

CREATE TABLE rate_windows (
	tenant       TEXT NOT NULL,
	window_start TIMESTAMPTZ NOT NULL,
	requests     BIGINT NOT NULL,
	PRIMARY KEY (tenant, window_start)
);
CREATE INDEX rate_windows_start ON rate_windows (window_start);

CREATE TABLE idempotency (
	tenant       TEXT NOT NULL,
	idem_key     TEXT NOT NULL,
	body_hash    TEXT NOT NULL,
	execution_id TEXT NOT NULL DEFAULT '',
	created_at   TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (tenant, idem_key)
);
CREATE INDEX idempotency_created_at ON idempotency (created_at);
