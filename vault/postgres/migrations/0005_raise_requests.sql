-- Version 4: raise requests. raise_requests keeps each request a vault key
-- made for a raise of one of its caps, by id (ids sort by creation);
-- raise_pending lists each key's pending requests, so that the limit on them
-- is counted under the key's lock without reading the others.
CREATE TABLE keybrake_raise_requests (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_raise_pending  (k bytea PRIMARY KEY, v bytea NOT NULL);

CREATE SEQUENCE keybrake_raise_requests_seq;
CREATE SEQUENCE keybrake_raise_pending_seq;
