-- Accounts and the dashboard (issue 13). A tenant may be disabled by an
-- operator; a key remembers when it was last used (to the minute). An
-- account owns one tenant. Sessions and one-time tokens are stored as the
-- SHA-256 of their secret only.
ALTER TABLE tenants ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;

CREATE TABLE accounts (
	id            TEXT PRIMARY KEY,
	email         TEXT NOT NULL UNIQUE,
	name          TEXT NOT NULL,
	password_hash TEXT NOT NULL,
	tenant        TEXT NOT NULL UNIQUE REFERENCES tenants (id),
	role          TEXT NOT NULL,
	verified_at   INTEGER,
	created_at    INTEGER NOT NULL
);

CREATE TABLE sessions (
	hash       BLOB PRIMARY KEY CHECK (length(hash) = 32),
	account_id TEXT NOT NULL REFERENCES accounts (id),
	csrf       TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL
);
CREATE INDEX sessions_account ON sessions (account_id);

CREATE TABLE tokens (
	hash       BLOB PRIMARY KEY CHECK (length(hash) = 32),
	kind       TEXT NOT NULL,
	email      TEXT NOT NULL,
	account_id TEXT NOT NULL,
	tenant     TEXT NOT NULL,
	plan       TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	used_at    INTEGER
);
