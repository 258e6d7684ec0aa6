-- The highest write count `w` PostgreSQL holds of a partition's barriers, read once a round
-- and with each store of barriers: a Redis whose barrier write counter is below it is an older
-- copy of its data (snapshot/behind.py). The index keeps that read to one probe a partition.
CREATE INDEX sw_barriers_partition_w ON sw_barriers (prefix, partition, w);
