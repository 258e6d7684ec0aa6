--[[
  Delete up to a batch of expired entries of one partition (the TTL reaper).
  Input:
    KEYS[1] partition ttl index (zset)  KEYS[2] partition scopes (zset)
    KEYS[3] partition event stream
    ARGV[1] now (epoch ms)              ARGV[2] batch size
    ARGV[3] partition tag prefix (e.g. "sw:{sw:p3}:"); entry = tag .. "e:" .. member,
            scope indexes = tag .. "k:" / "u:" / "t:" .. scope
    ARGV[4] event stream MAXLEN
    ARGV[5] most bytes of the entries it reads (each deleted value goes into its event): it
            stops before the entry that would pass them, unless it is the first (64 of 1 MiB
            held Redis 0.42 s in one batch)
  Entry hashes and scope indexes are derived from the ttl members; they share the partition's
  hash tag, so the script stays on one cluster slot.
  Output:
    {ST.OK, number deleted, 1 when more expired entries remain else 0}
    {ST.STORE_LOST}   the partition's generation marker is gone (generation.lua): a wiped
                      Redis, or a restore running; nothing deleted
  Events: state:deleted for each entry deleted (by = "").
]]
--- @include "entry"

-- A restore writes entries whose expiry passed for this script to delete once it ended: an
-- event written before it moved the positions to the streams' ends would be skipped (no
-- trigger called, the row left in PostgreSQL).
if generation_lost(ARGV[3]) then
  return {ST.STORE_LOST}
end
local now = tonumber(ARGV[1])
local batch = tonumber(ARGV[2])
local tag = ARGV[3]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch + 1)
local deleted, budget, stopped = 0, tonumber(ARGV[5]), false
for i = 1, math.min(#due, batch) do
  local member = due[i]
  local colon = string.find(member, ':', 1, true)
  local len = tonumber(string.sub(member, 1, colon - 1))
  local scope = string.sub(member, colon + 1, colon + len)
  local ctx = {
    entry = tag .. 'e:' .. member, keyIndex = tag .. 'k:' .. scope,
    updIndex = tag .. 'u:' .. scope, topicIndex = tag .. 't:' .. scope,
    scopes = KEYS[2], ttl = KEYS[1], events = KEYS[3],
    scope = scope, key = string.sub(member, colon + len + 1), member = member,
    now = now, stamp = ARGV[1], maxlen = ARGV[4], by = '',
  }
  -- An expired entry is deleted with its event, within the budget (its size read first: the
  -- entry is read whole). A member whose entry is gone is stale and dropped; a live entry is
  -- re-indexed at its real expiry so it cannot block the batch.
  local size = redis.call('STRLEN', ctx.entry)
  if i > 1 and size > budget then
    stopped = true
    break
  end
  local cur, expired = entry_load(ctx)
  budget = budget - size
  if cur and expired then
    entry_drop_expired(ctx, cur)
    deleted = deleted + 1
  end
  if cur and not expired and cur[3] then
    redis.call('ZADD', KEYS[1], cur[3], member)
  else
    redis.call('ZREM', KEYS[1], member)
  end
end
return {ST.OK, deleted, (stopped or #due > batch) and 1 or 0}
