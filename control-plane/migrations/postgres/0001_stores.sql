-- Run records, event logs, sandbox instances, definitions and API tokens.
-- Timestamps are milliseconds since the Unix epoch.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY NOT NULL,
    thread_id        TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    status           TEXT NOT NULL
        CHECK (status IN ('running', 'interrupted', 'completed', 'failed', 'aborted')),
    started_at       BIGINT NOT NULL,
    finished_at      BIGINT,
    error_code       TEXT,
    error_message    TEXT,
    usage            TEXT,
    sandbox_key      TEXT,
    detached_since   BIGINT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    driver_epoch     BIGINT NOT NULL,
    sentinel_key     TEXT NOT NULL,
    log_closed       BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at       BIGINT NOT NULL
);

CREATE INDEX runs_by_thread ON runs (tenant, thread_id, started_at);
CREATE INDEX runs_detached ON runs (detached_since) WHERE status = 'running';

-- seq is minted per run by the append (1, 2, ...); it is the offset.
CREATE TABLE run_events (
    run_id      TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    epoch       BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    payload     BYTEA NOT NULL,
    appended_at BIGINT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE instances (
    sandbox_key         TEXT PRIMARY KEY NOT NULL,
    tenant              TEXT NOT NULL,
    provider            TEXT NOT NULL,
    provider_sandbox_id TEXT NOT NULL,
    native_snapshot     TEXT,
    created_at          BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL
);

CREATE INDEX instances_by_tenant ON instances (tenant, sandbox_key);

CREATE TABLE definitions (
    tenant     TEXT NOT NULL,
    id         TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- Only the SHA-256 of a token is stored.
CREATE TABLE api_tokens (
    token_sha256 TEXT PRIMARY KEY NOT NULL,
    tenant       TEXT NOT NULL,
    created_at   BIGINT NOT NULL
);

-- Wake tailers in every process: one notification per run per append
-- statement, delivered at commit (so a woken reader finds the rows).
CREATE FUNCTION sandhold_notify_run_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sandhold_run_events', r.run_id)
    FROM (SELECT DISTINCT run_id FROM appended) AS r;
    RETURN NULL;
END
$$;

CREATE TRIGGER run_events_notify
    AFTER INSERT ON run_events
    REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION sandhold_notify_run_events();
