-- A run copied into another thread by a snapshot fork names the run it was
-- copied from (the copy has its own id, record and event log).
ALTER TABLE runs ADD COLUMN forked_from_run TEXT;
