-- How many reads of each partition the snapshot has counted in Redis (lua/snapread.lua) and
-- committed here: a Redis whose count is below it is a copy made before a read whose data
-- PostgreSQL holds (snapshot/behind.py). Only the snapshot counts, so writes on an older copy
-- never bring it up.
CREATE TABLE sw_reads (
    prefix      text    NOT NULL,
    partition   integer NOT NULL,
    reads       bigint  NOT NULL,
    PRIMARY KEY (prefix, partition)
);
