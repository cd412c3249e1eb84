-- An execution is stored when it is accepted (queued or running) and
-- updated when it finishes. started_at and finished_at are NULL until then;
-- rows from before this migration get them from created_at and duration.
ALTER TABLE executions ADD COLUMN started_at TIMESTAMPTZ;
ALTER TABLE executions ADD COLUMN finished_at TIMESTAMPTZ;
ALTER TABLE executions ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT false;
UPDATE executions SET started_at = created_at, finished_at = created_at + duration_ms * interval '1 millisecond';
