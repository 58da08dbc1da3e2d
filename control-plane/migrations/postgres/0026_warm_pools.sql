-- Warm pools: the definitions that ask for sandboxes kept ready
-- (`lifecycle.warm`), written by PutDefinition so the pool keeper reads
-- a small table instead of every definition; and the pooled sandboxes,
-- each made under a key of its own (its labels carry it) and either being
-- made (`creating`), ready, or claimed by a thread's sandbox key.
CREATE TABLE warm_pools (
    tenant        TEXT NOT NULL,
    definition_id TEXT NOT NULL,
    target        BIGINT NOT NULL,
    last_error    TEXT NOT NULL DEFAULT '',
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (tenant, definition_id)
);

CREATE TABLE warm_sandboxes (
    pool_key            TEXT PRIMARY KEY NOT NULL,
    tenant              TEXT NOT NULL,
    definition_id       TEXT NOT NULL,
    digest              TEXT NOT NULL,
    provider            TEXT NOT NULL,
    node                TEXT NOT NULL DEFAULT '',
    provider_sandbox_id TEXT NOT NULL DEFAULT '',
    state               TEXT NOT NULL,
    claimed_key         TEXT,
    created_at          BIGINT NOT NULL,
    claimed_at          BIGINT
);

CREATE INDEX warm_sandboxes_by_pool ON warm_sandboxes (tenant, definition_id, state, created_at);

-- The reaper asks whether any record points at a sandbox it found.
CREATE INDEX instances_by_provider_id ON instances (provider, provider_sandbox_id);
