-- What started a run (harness, definition, durability; never a secret or the
-- prompt), as JSON, so that any replica can take the run over and describe it.
ALTER TABLE runs ADD COLUMN spec TEXT;
