-- Version 8: renewals. object_links links the objects a key created
-- indirectly (upstream NUL object id); renewal_pauses keeps the
-- auto_advance=false calls owed to Stripe until it accepts them.
CREATE TABLE keybrake_object_links   (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE keybrake_renewal_pauses (k bytea PRIMARY KEY, v bytea NOT NULL);
CREATE SEQUENCE keybrake_object_links_seq;
CREATE SEQUENCE keybrake_renewal_pauses_seq;
