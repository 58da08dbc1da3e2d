-- Portable snapshots: one row per thread (head and writer fence), one per
-- checkpoint (its manifest), and the blobs each checkpoint references.
-- Pins protect the blobs of a save in progress from garbage collection.

CREATE TABLE snapshot_threads (
    tenant       TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    head         TEXT,
    writer_epoch BIGINT NOT NULL DEFAULT 0,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (tenant, thread_id)
);

CREATE TABLE snapshot_checkpoints (
    checkpoint_id  TEXT PRIMARY KEY NOT NULL,
    tenant         TEXT NOT NULL,
    thread_id      TEXT NOT NULL,
    parent_id      TEXT,
    run_id         TEXT NOT NULL,
    label          TEXT NOT NULL,
    forked_from    TEXT,
    manifest       BYTEA NOT NULL,
    file_count     BIGINT NOT NULL,
    dir_count      BIGINT NOT NULL,
    total_bytes    BIGINT NOT NULL,
    uploaded_bytes BIGINT NOT NULL,
    -- 1, 2, ... per thread: the order of checkpoints (timestamps can tie).
    seq            BIGINT NOT NULL,
    created_at     BIGINT NOT NULL
);

CREATE INDEX snapshot_checkpoints_by_thread ON snapshot_checkpoints (tenant, thread_id, seq);

CREATE TABLE snapshot_blob_refs (
    checkpoint_id TEXT NOT NULL REFERENCES snapshot_checkpoints (checkpoint_id) ON DELETE CASCADE,
    sha256        TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, sha256)
);

CREATE INDEX snapshot_blob_refs_by_blob ON snapshot_blob_refs (sha256);

CREATE TABLE snapshot_blob_pins (
    pin_id    TEXT NOT NULL,
    sha256    TEXT NOT NULL,
    pinned_at BIGINT NOT NULL,
    PRIMARY KEY (pin_id, sha256)
);

CREATE INDEX snapshot_blob_pins_by_blob ON snapshot_blob_pins (sha256);

-- The PostgreSQL blob store (the directory store keeps files instead).
CREATE TABLE snapshot_blobs (
    sha256     TEXT PRIMARY KEY NOT NULL,
    size       BIGINT NOT NULL,
    data       BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);
