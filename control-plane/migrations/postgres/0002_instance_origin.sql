-- Which definition and thread a sandbox was ensured for, so that any replica
-- (and one restarted since) can describe it and filter by thread.
ALTER TABLE instances ADD COLUMN definition_id TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN thread_id TEXT NOT NULL DEFAULT '';
