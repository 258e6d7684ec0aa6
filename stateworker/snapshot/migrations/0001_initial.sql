-- The snapshot's tables. Every table carries the key prefix, so several prefixes (several
-- deployments, or the tests' fresh prefix per test) share one database.

-- One row per live entry; a delete removes the row. `value_text` is the exact JSON text
-- Redis holds (what restore writes back); `value` is the same as jsonb, for queries (NULL
-- for the rare text jsonb refuses: a \u0000 inside a string). The revision is the change
-- event's stream id as two numbers, so rows compare: a row never goes back to an older one.
CREATE TABLE sw_entries (
    prefix        text    NOT NULL,
    scope         text    NOT NULL,
    key           text    NOT NULL,
    partition     integer NOT NULL,
    value         jsonb,
    value_text    text    NOT NULL,
    version       bigint  NOT NULL,
    hash          text,
    topic         text,
    created_ms    bigint,
    updated_ms    bigint,
    expires_ms    bigint,
    updated_by    text,
    revision_ms   bigint  NOT NULL,
    revision_seq  bigint  NOT NULL,
    plain         boolean NOT NULL DEFAULT false,  -- Redis's `s` mark (no bracket in a string)
    PRIMARY KEY (prefix, scope, key)
);
CREATE INDEX sw_entries_partition ON sw_entries (prefix, partition);

-- How far the snapshot has applied each partition's event stream: written in the same
-- transaction as the rows. `n` is the event's ordinal in the stream (entries ever added).
CREATE TABLE sw_positions (
    prefix      text    NOT NULL,
    partition   integer NOT NULL,
    last_id     text    NOT NULL,
    last_ms     bigint  NOT NULL,
    last_seq    bigint  NOT NULL,
    n           bigint  NOT NULL,
    updated_ms  bigint  NOT NULL,
    PRIMARY KEY (prefix, partition)
);

-- Trigger registrations (id -> the registration's JSON) and namespace claims.
CREATE TABLE sw_triggers (
    prefix        text NOT NULL,
    id            text NOT NULL,
    registration  text NOT NULL,
    PRIMARY KEY (prefix, id)
);

CREATE TABLE sw_claims (
    prefix     text NOT NULL,
    scope      text NOT NULL,
    namespace  text NOT NULL,
    PRIMARY KEY (prefix, scope)
);
