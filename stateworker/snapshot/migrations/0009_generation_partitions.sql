-- The partition count of the Redis dataset the snapshot follows (decision 0073): written with
-- the generation (adopted, or by a restore; a row from before this column by the first
-- snapshotter that confirms its generation). A restore, or the repair at start, with another
-- count is refused (snapshot/repair.py); NULL: not known yet (then the rows tell it).
ALTER TABLE sw_generations ADD COLUMN partitions integer;
