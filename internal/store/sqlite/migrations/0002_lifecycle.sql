-- An execution is stored when it is accepted (queued or running) and
-- updated when it finishes. started_at and finished_at are NULL until then;
-- rows from before this migration get them from created_at and duration.
ALTER TABLE executions ADD COLUMN started_at INTEGER;
ALTER TABLE executions ADD COLUMN finished_at INTEGER;
ALTER TABLE executions ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
UPDATE executions SET started_at = created_at, finished_at = created_at + duration_ms * 1000;
