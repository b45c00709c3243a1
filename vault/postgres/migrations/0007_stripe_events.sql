-- Version 7: Stripe's events. stripe_events keeps the id of each event applied
-- (upstream NUL event id) for the retention; object_keys lists the keys that
-- count each money object; unknown_keys maps the upstream idempotency key of
-- each unknown hold to the hold.
CREATE TABLE keybrake_stripe_events (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_object_keys   (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_unknown_keys  (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE SEQUENCE keybrake_stripe_events_seq;
CREATE SEQUENCE keybrake_object_keys_seq;
CREATE SEQUENCE keybrake_unknown_keys_seq;
