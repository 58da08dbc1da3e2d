-- Run ids are a namespace per tenant: a run is (tenant, run_id), and so is
-- its event log. Two tenants may each have a run `r1`; neither can tell
-- whether the other has one. Existing runs keep their tenant, and their
-- events get it.
--
-- SQLite cannot change a primary key: both tables are made anew and the
-- rows copied. Renaming `runs_new` to `runs` also renames the reference of
-- `run_events_new` to it.

CREATE TABLE runs_new (
    run_id           TEXT NOT NULL,
    thread_id        TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    status           TEXT NOT NULL
        CHECK (status IN ('running', 'interrupted', 'completed', 'failed', 'aborted')),
    started_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    error_code       TEXT,
    error_message    TEXT,
    usage            TEXT,
    sandbox_key      TEXT,
    detached_since   INTEGER,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    driver_epoch     INTEGER NOT NULL,
    sentinel_key     TEXT NOT NULL,
    log_closed       BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at       INTEGER NOT NULL,
    spec             TEXT,
    forked_from_run  TEXT,
    PRIMARY KEY (tenant, run_id)
);

INSERT INTO runs_new (run_id, thread_id, tenant, status, started_at, finished_at, error_code, error_message,
    usage, sandbox_key, detached_since, cancel_requested, driver_epoch, sentinel_key, log_closed, updated_at,
    spec, forked_from_run)
SELECT run_id, thread_id, tenant, status, started_at, finished_at, error_code, error_message,
    usage, sandbox_key, detached_since, cancel_requested, driver_epoch, sentinel_key, log_closed, updated_at,
    spec, forked_from_run
FROM runs;

-- seq is minted per run by the append (1, 2, ...); it is the offset.
CREATE TABLE run_events_new (
    tenant      TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    payload     BLOB NOT NULL,
    appended_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, run_id, seq),
    FOREIGN KEY (tenant, run_id) REFERENCES runs_new (tenant, run_id) ON DELETE CASCADE
) WITHOUT ROWID;

INSERT INTO run_events_new (tenant, run_id, seq, epoch, kind, payload, appended_at)
SELECT r.tenant, e.run_id, e.seq, e.epoch, e.kind, e.payload, e.appended_at
FROM run_events e JOIN runs r ON r.run_id = e.run_id;

DROP TABLE run_events;
DROP TABLE runs;
ALTER TABLE runs_new RENAME TO runs;
ALTER TABLE run_events_new RENAME TO run_events;

CREATE INDEX runs_by_thread ON runs (tenant, thread_id, started_at);
CREATE INDEX runs_detached ON runs (detached_since) WHERE status = 'running';
