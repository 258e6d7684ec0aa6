-- Bus call records (snapshot/calls.py): the records of calls that changed an entry, stored
-- once the partition's position is past the change, so a restore brings back the records of
-- exactly the changes it brings back and a late retry is not applied twice. `field` is the
-- record's field (12 bytes of the call id's SHA-1), `value` its digest and reply as Redis
-- held them; `at_ms` the call's time (its record's time slice); rows older than the dedupe
-- window are pruned.
CREATE TABLE sw_calls (
    prefix        text    NOT NULL,
    field         bytea   NOT NULL,
    partition     integer NOT NULL,
    value         bytea   NOT NULL,
    revision_ms   bigint  NOT NULL,
    revision_seq  bigint  NOT NULL,
    at_ms         bigint  NOT NULL,
    PRIMARY KEY (prefix, field)
);
CREATE INDEX sw_calls_at ON sw_calls (prefix, at_ms);
