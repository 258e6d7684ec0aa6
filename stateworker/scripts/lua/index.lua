--[[
  A scope's value index (state::create-index, drop-index; state/query/indexes.py): define it, build
  it for the entries it does not hold yet in bounded batches, or drop it. Writes keep every
  defined index true themselves (includes/indexes.lua), building or ready, so a build only
  has to reach the keys that existed before: each batch reads the next keys of the key index
  after the last one built.
  Input:
    KEYS[1] the scope's index definitions (hash)   KEYS[2] the scope's key index
    KEYS[3] the pointer's index (zset)
    KEYS[4] the partition's indexes building (zset: "<len>:<scope><pointer>", score 0)
    ARGV[1] create | build | drop                  ARGV[2] pointer
    ARGV[3] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[4] create: most indexes of a scope; build: most keys of a batch
    ARGV[5] the index's member in KEYS[4]
    ARGV[6] build: most bytes of entries a batch reads (max_call_bytes): it ends after the
            entry that reaches them (1,000 entries of 1 MiB would be a second of Redis)
  Output:
    create: {ST.OK, 1 defined now | 0 defined already | -1 the scope has ARGV[4] indexes}
    build:  {ST.OK, 1 ready | 0 more to build | 2 the index was dropped meanwhile}
    drop:   {ST.OK, 1 dropped | 0 none}
  Events: none.
]]
--- @include "indexes"
--- @include "packed"

local op, pointer = ARGV[1], ARGV[2]
if op == 'create' then
  if redis.call('HEXISTS', KEYS[1], pointer) == 1 then
    return {ST.OK, 0}
  end
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
    return {ST.OK, -1}
  end
  redis.call('HSET', KEYS[1], pointer, 'b')
  redis.call('ZADD', KEYS[4], '0', ARGV[5])
  return {ST.OK, 1}
end
if op == 'drop' then
  local dropped = redis.call('HDEL', KEYS[1], pointer)
  redis.call('UNLINK', KEYS[3]) -- (freed in the background: a large scope's is O(n) to free)
  redis.call('ZREM', KEYS[4], ARGV[5])
  return {ST.OK, dropped}
end
local state = redis.call('HGET', KEYS[1], pointer)
if not state then
  redis.call('ZREM', KEYS[4], ARGV[5])
  return {ST.OK, 2}
end
if state == 'r' then
  return {ST.OK, 1}
end
local batch = tonumber(ARGV[4])
local low = state == 'b' and '-' or '(' .. string.sub(state, 2)
local keys = redis.call('ZRANGE', KEYS[2], low, '+', 'BYLEX', 'LIMIT', 0, batch)
local parts = indexes_parts(pointer)
local budget, bytes, built = tonumber(ARGV[6]), 0, 0
for _, key in ipairs(keys) do
  local stored = redis.call('GET', ARGV[3] .. key)
  local member = indexes_member(stored and packed_value(stored) or false, parts, key)
  if member then
    redis.call('ZADD', KEYS[3], '0', member)
  end
  built = built + 1
  bytes = bytes + (stored and #stored or 0)
  if bytes >= budget then
    break
  end
end
if #keys < batch and built == #keys then
  redis.call('HSET', KEYS[1], pointer, 'r')
  redis.call('ZREM', KEYS[4], ARGV[5])
  return {ST.OK, 1}
end
redis.call('HSET', KEYS[1], pointer, 'c' .. keys[built])
return {ST.OK, 0}
