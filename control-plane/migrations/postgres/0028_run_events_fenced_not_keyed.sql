-- An append to the event log is fenced: the group commit reads each run's
-- row (FOR SHARE, held to its COMMIT) before it inserts, and refuses a run
-- that is not there. The foreign key's check of every inserted row was a
-- second look-up of that same row, 17% of PostgreSQL's time under group
-- commit (docs/benchmarks.md). Runs are deleted only once ended (their logs
-- get nothing more), and the store deletes a run's events with it.
DO $$
DECLARE
    constraint_name text;
BEGIN
    FOR constraint_name IN
        SELECT conname FROM pg_constraint WHERE conrelid = 'run_events'::regclass AND contype = 'f'
    LOOP
        EXECUTE format('ALTER TABLE run_events DROP CONSTRAINT %I', constraint_name);
    END LOOP;
END
$$;
