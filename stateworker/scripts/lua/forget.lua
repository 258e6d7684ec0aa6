--[[
  Forget the barriers the snapshot has stored, each only if it has not changed since it was
  read (the snapshotter: snapshot/barriers.py). A barrier written again meanwhile stays in
  the set and is stored at the next round.
  Input:
    KEYS[1] the partition's set of changed barriers (keys: PartitionKeys.barriers_changed)
    KEYS[2..] the barrier hashes stored (keys: PartitionKeys.barrier, same partition)
    ARGV[1..] the write count `w` stored in PostgreSQL for each of KEYS[2..], in order; ""
            for one stored as gone (its hash was absent when read)
  Output:
    {ST.OK, number forgotten}
  Events: none.
]]
local forgotten = 0
for i = 2, #KEYS do
  local w = redis.call('HGET', KEYS[i], 'w')
  -- (absent now and when read: nothing left to store; absent now but read present: deleted
  -- since, the deletion is still to store, and a delete-barrier's kept reply waits for it)
  if (w or '') == ARGV[i - 1] then
    forgotten = forgotten + redis.call('SREM', KEYS[1], KEYS[i])
  end
end
return {ST.OK, forgotten}
