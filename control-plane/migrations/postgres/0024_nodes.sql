-- The fleet's sandbox hosts (`sandhold node`), as they registered and last
-- heartbeated. Their state (ready, draining, unreachable, lost) is derived
-- from `draining` and the heartbeat's age when read. A removed node keeps
-- its row so that it cannot register again under that name.
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    -- JSON object of KEY: VALUE labels.
    labels TEXT NOT NULL,
    -- JSON array of the providers it offers and what each can do.
    providers TEXT NOT NULL,
    memory_bytes BIGINT NOT NULL,
    cpus BIGINT NOT NULL,
    sandbox_slots BIGINT NOT NULL,
    free_memory_bytes BIGINT NOT NULL,
    sandboxes BIGINT NOT NULL,
    version TEXT NOT NULL,
    draining BIGINT NOT NULL DEFAULT 0,
    removed BIGINT NOT NULL DEFAULT 0,
    registered_at BIGINT NOT NULL,
    last_heartbeat BIGINT NOT NULL
);

-- The node a sandbox lives on; empty: the server's own providers.
ALTER TABLE instances ADD COLUMN node TEXT NOT NULL DEFAULT '';
