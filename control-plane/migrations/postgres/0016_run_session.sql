-- The harness session a run worked in (its <harness>.session-id event):
-- the thread's next run of the same harness continues it.
ALTER TABLE runs ADD COLUMN session_id TEXT;
