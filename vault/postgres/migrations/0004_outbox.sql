-- Version 4: webhooks out. The endpoints, one delivery per event and
-- endpoint with the body it sends, the pending deliveries by due time, the
-- finished ones by completion time (for pruning), and the marks of events
-- sent once per window or threshold.
CREATE TABLE keybrake_webhooks      (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_deliveries    (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_delivery_due  (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_delivery_done (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_event_marks   (k bytea PRIMARY KEY, v bytea NOT NULL);

CREATE SEQUENCE keybrake_webhooks_seq;
CREATE SEQUENCE keybrake_deliveries_seq;
CREATE SEQUENCE keybrake_delivery_due_seq;
CREATE SEQUENCE keybrake_delivery_done_seq;
CREATE SEQUENCE keybrake_event_marks_seq;
