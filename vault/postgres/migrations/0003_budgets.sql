-- Version 3: budgets that several keys draw from, and the times of the last
-- holds each velocity limit counted. A budget's counters live in
-- keybrake_counters under its id.
CREATE TABLE keybrake_budgets  (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_velocity (k bytea PRIMARY KEY, v bytea NOT NULL);

CREATE SEQUENCE keybrake_budgets_seq;
CREATE SEQUENCE keybrake_velocity_seq;
