-- The image an execution ran in (the name the request resolved, the
-- default image's when it named none) and that image's build id when it
-- was accepted ('' when unknown). Rows from before this migration keep ''
-- in both: which image ran them was not recorded, and the API shows null.
ALTER TABLE executions ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN image_version TEXT NOT NULL DEFAULT '';
