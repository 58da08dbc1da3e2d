-- Whether a run's request index (0020) is complete. A run created from now
-- on is indexed by its appends from its first chunk; a run that existed
-- before may hold requests in its log that no index row points at (its
-- appends before 0020 indexed nothing, and an answer appended since to a
-- request asked before found no row). Those are marked here, and the first
-- read of their requests builds the index from their log once.
ALTER TABLE runs ADD COLUMN requests_indexed BOOLEAN NOT NULL DEFAULT TRUE;
UPDATE runs SET requests_indexed = FALSE;
