-- The files an execution returned (its return_files matches), as JSON with
-- base64 contents (store.MarshalFiles); NULL when there are none or after
-- Purge. Rows from before this migration returned none.
ALTER TABLE executions ADD COLUMN files BLOB;
ALTER TABLE executions ADD COLUMN files_truncated INTEGER NOT NULL DEFAULT 0;
