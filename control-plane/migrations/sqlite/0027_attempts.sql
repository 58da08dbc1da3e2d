-- Attempt sets: one task fanned out to N runs, each in a thread forked
-- from the set's thread at its base checkpoint. An attempt's evaluation
-- (diff, test, tokens, duration) is JSON written once its run has ended;
-- `promoted_run_id` is set once, by the first promote.
CREATE TABLE attempt_sets (
    set_id             TEXT PRIMARY KEY NOT NULL,
    tenant             TEXT NOT NULL,
    thread_id          TEXT NOT NULL,
    definition_id      TEXT NOT NULL,
    base_checkpoint_id TEXT NOT NULL,
    promoted_run_id    TEXT,
    created_at         INTEGER NOT NULL
);

CREATE TABLE attempts (
    set_id     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    tenant     TEXT NOT NULL,
    run_id     TEXT NOT NULL,
    thread_id  TEXT NOT NULL,
    harness    TEXT NOT NULL,
    model      TEXT NOT NULL,
    evaluation TEXT,
    PRIMARY KEY (set_id, attempt)
);

CREATE INDEX attempts_unevaluated ON attempts (set_id) WHERE evaluation IS NULL;
