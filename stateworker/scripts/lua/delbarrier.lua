--[[
  Delete one barrier (state::delete-barrier), complete or not, with every payload it holds.
  Input:
    KEYS[1] the barrier's hash (keys: PartitionKeys.barrier)
    KEYS[2] the partition's set of changed barriers (keys: PartitionKeys.barriers_changed):
            the deletion is a change the snapshot in PostgreSQL stores (it deletes the row),
            marked when a snapshot follows the partition (lua/includes/barriermarks.lua)
    KEYS[3] the partition's barrier write counter (keys: PartitionKeys.barrier_writes):
            raised to the deleted barrier's `w`, so the next barrier of that id is newer
    KEYS[4] the partition's barrier index (keys: PartitionKeys.barriers): the barrier leaves it
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, 1}        deleted
    {ST.OK, 0}        there was no such barrier: nothing written
  Events: none (a barrier is not an entry).
]]
--- @include "generation"
--- @include "barriermarks"

--- @per-call
local barrier = KEYS[1]
if generation_lost(string.sub(KEYS[2], 1, -17)) then -- (KEYS[2]: <tag> .. "barriers_changed")
  return {ST.STORE_LOST}
end
local w = redis.call('HGET', barrier, 'w')
if not w then
  return {ST.OK, 0}
end
if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(w) then
  redis.call('SET', KEYS[3], w)
end
redis.call('DEL', barrier)
redis.call('ZREM', KEYS[4], barrier)
barriermarks_mark(KEYS[2], barrier)
return {ST.OK, 1}
