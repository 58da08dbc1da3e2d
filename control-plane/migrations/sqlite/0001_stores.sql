-- Run records, event logs, sandbox instances, definitions and API tokens.
-- Timestamps are milliseconds since the Unix epoch.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY NOT NULL,
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
    updated_at       INTEGER NOT NULL
);

CREATE INDEX runs_by_thread ON runs (tenant, thread_id, started_at);
CREATE INDEX runs_detached ON runs (detached_since) WHERE status = 'running';

-- seq is minted per run by the append (1, 2, ...); it is the offset.
CREATE TABLE run_events (
    run_id      TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    payload     BLOB NOT NULL,
    appended_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE instances (
    sandbox_key         TEXT PRIMARY KEY NOT NULL,
    tenant              TEXT NOT NULL,
    provider            TEXT NOT NULL,
    provider_sandbox_id TEXT NOT NULL,
    native_snapshot     TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL
);

CREATE INDEX instances_by_tenant ON instances (tenant, sandbox_key);

CREATE TABLE definitions (
    tenant     TEXT NOT NULL,
    id         TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
);

-- Only the SHA-256 of a token is stored.
CREATE TABLE api_tokens (
    token_sha256 TEXT PRIMARY KEY NOT NULL,
    tenant       TEXT NOT NULL,
    created_at   INTEGER NOT NULL
);
