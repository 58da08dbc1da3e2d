-- The definition a run started under (its spec's `definition_id`), in a
-- column of its own: the reaper removes a definition made from a run's
-- flags (`def-...`) once no sandbox, unfinished run or thread's newest run
-- names it, and asks that without reading every spec.
ALTER TABLE runs ADD COLUMN definition_id TEXT;
UPDATE runs SET definition_id = spec::jsonb ->> 'definition_id'
WHERE spec IS NOT NULL AND spec LIKE '{%';
CREATE INDEX runs_by_definition ON runs (tenant, definition_id);
