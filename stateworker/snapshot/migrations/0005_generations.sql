-- The generation of the Redis dataset the snapshot follows (state/generation.py): written by
-- the first snapshotter that finds none, and by every restore. The snapshotter commits
-- nothing read from a Redis whose markers are not this generation (snapshot/generation.py).
CREATE TABLE sw_generations (
    prefix      text    PRIMARY KEY,
    generation  text    NOT NULL,
    cause       text    NOT NULL,  -- adopted (found in Redis) | restore
    begun_ms    bigint  NOT NULL,
    -- entries ever added to the registry stream when the registry was last copied: a Redis
    -- whose stream has had fewer is an older copy, and its registry never replaces this one
    registry_n  bigint  NOT NULL DEFAULT 0
);
