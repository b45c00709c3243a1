-- keybrake's store on PostgreSQL, version 1: one table per bucket of the
-- vault's engine, each entry a key and a value in the engine's own encoding
-- (JSON documents, a 33-byte counter, ids), sealed where they hold a secret;
-- and one sequence per bucket (event and audit ids, fencing tokens).
-- Keys sort bytewise, as bbolt's do.
CREATE TABLE keybrake_meta        (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_upstreams   (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_keys        (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_key_tokens  (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_key_names   (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_idem        (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_hold_index  (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_counters    (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_events      (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_audit       (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_objects     (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_claims      (k bytea PRIMARY KEY, v bytea NOT NULL);

CREATE SEQUENCE keybrake_meta_seq;
CREATE SEQUENCE keybrake_upstreams_seq;
CREATE SEQUENCE keybrake_keys_seq;
CREATE SEQUENCE keybrake_key_tokens_seq;
CREATE SEQUENCE keybrake_key_names_seq;
CREATE SEQUENCE keybrake_idem_seq;
CREATE SEQUENCE keybrake_hold_index_seq;
CREATE SEQUENCE keybrake_counters_seq;
CREATE SEQUENCE keybrake_events_seq;
CREATE SEQUENCE keybrake_audit_seq;
CREATE SEQUENCE keybrake_objects_seq;
CREATE SEQUENCE keybrake_claims_seq;
