--[[
  Count one snapshot read of a partition, sent after the read's commands in the same
  pipeline: a copy of Redis made before it has a lower count than the read's, which
  PostgreSQL keeps with the data it commits (snapshot/behind.py). Only the snapshot counts,
  and only while the count is not below what PostgreSQL holds: a snapshotter reading an older
  copy (fenced) must not bring its count up to PostgreSQL's.
  Input:
    KEYS[1] the partition's snapshot read counter (keys: PartitionKeys.snapshot_reads)
    ARGV[1] the highest count PostgreSQL holds of the partition (0: none)
  Output:
    {ST.OK, count}    counted: the read's count (above every count before it)
    {ST.OK, -count}   the counter (`count`, 0 when absent) is below ARGV[1]: nothing written
  Events: none.
]]
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count < tonumber(ARGV[1]) then
  return {ST.OK, -count}
end
return {ST.OK, redis.call('INCR', KEYS[1])}
