-- Version 4: approvals. approvals keeps each approval under its id;
-- approvals_open lists the pending and approved ones with their expiry, which
-- the reaper walks.
CREATE TABLE keybrake_approvals      (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_approvals_open (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE SEQUENCE keybrake_approvals_seq;
CREATE SEQUENCE keybrake_approvals_open_seq;
