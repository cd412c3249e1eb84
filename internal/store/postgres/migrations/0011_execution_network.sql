-- What an execution with a network reached: its allowlist, bytes,
-- connections and last attempts (JSON, execution.NetworkRecord); empty
-- for the executions without one, which is all of them before egress.
ALTER TABLE executions ADD COLUMN network TEXT NOT NULL DEFAULT '';
