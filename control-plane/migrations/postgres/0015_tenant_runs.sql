-- Run ids are a namespace per tenant: a run is (tenant, run_id), and so is
-- its event log. Two tenants may each have a run `r1`; neither can tell
-- whether the other has one. Existing runs keep their tenant, and their
-- events get it. Log wake-ups name the run as `<tenant>:<run_id>`.

ALTER TABLE run_events ADD COLUMN tenant TEXT;
UPDATE run_events e SET tenant = r.tenant FROM runs r WHERE r.run_id = e.run_id;
ALTER TABLE run_events ALTER COLUMN tenant SET NOT NULL;

ALTER TABLE run_events DROP CONSTRAINT run_events_run_id_fkey;
ALTER TABLE run_events DROP CONSTRAINT run_events_pkey;
ALTER TABLE runs DROP CONSTRAINT runs_pkey;
ALTER TABLE runs ADD PRIMARY KEY (tenant, run_id);
ALTER TABLE run_events ADD PRIMARY KEY (tenant, run_id, seq);
ALTER TABLE run_events ADD FOREIGN KEY (tenant, run_id) REFERENCES runs (tenant, run_id) ON DELETE CASCADE;

CREATE OR REPLACE FUNCTION sandhold_notify_run_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sandhold_run_events', r.tenant || ':' || r.run_id)
    FROM (SELECT DISTINCT tenant, run_id FROM appended) AS r;
    RETURN NULL;
END
$$;
