-- Version 2: the buckets of the engine's schema version 2. inflight lists the
-- requests in flight, so that recovery reads no other record; completions
-- lists completed records by completion time, so that the reaper reads only
-- the expired ones; rollups keeps the sums of the ledger events the retention
-- removed.
CREATE TABLE keybrake_inflight    (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_completions (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_rollups     (k bytea PRIMARY KEY, v bytea NOT NULL);

CREATE SEQUENCE keybrake_inflight_seq;
CREATE SEQUENCE keybrake_completions_seq;
CREATE SEQUENCE keybrake_rollups_seq;

-- The records bucket, where a store that appends its records keeps them
-- (bbolt); PostgreSQL keeps each record under its key in keybrake_idem.
CREATE TABLE keybrake_records     (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE SEQUENCE keybrake_records_seq;
