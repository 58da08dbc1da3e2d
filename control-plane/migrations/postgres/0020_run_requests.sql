-- The requests of each run (issue 33): an index into its event log, so that
-- listing and answering read the requests themselves instead of the whole
-- log. A row per request, written in the append's transaction: the offset of
-- the chunk that asked and, once answered, of the chunk that answered (the
-- first of each, like a reader of the log would keep). Runs started before
-- this index have no rows.
CREATE TABLE run_requests (
    tenant       TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    asked_seq    BIGINT NOT NULL,
    answered_seq BIGINT,
    PRIMARY KEY (tenant, run_id, request_id),
    FOREIGN KEY (tenant, run_id) REFERENCES runs (tenant, run_id) ON DELETE CASCADE
);

CREATE INDEX run_requests_pending ON run_requests (tenant, run_id, asked_seq) WHERE answered_seq IS NULL;
CREATE INDEX run_requests_asked ON run_requests (tenant, run_id, asked_seq);
