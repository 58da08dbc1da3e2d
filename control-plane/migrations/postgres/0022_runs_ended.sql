-- Retention (`--retain-runs`) removes the runs that ended longest ago
-- first: an index on when they ended, over ended runs only.
CREATE INDEX runs_ended ON runs (finished_at) WHERE status IN ('completed', 'failed', 'aborted');
