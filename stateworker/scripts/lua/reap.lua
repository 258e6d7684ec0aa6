--[[
  Delete up to a batch of expired entries of one partition (the TTL reaper).
  Input:
    KEYS[1] partition ttl index (zset)  KEYS[2] partition scopes (zset)
    KEYS[3] partition event stream
    ARGV[1] now (epoch ms)              ARGV[2] batch size
    ARGV[3] partition tag prefix (e.g. "sw:{sw:p3}:"); entry = tag .. "e:" .. member,
            scope indexes = tag .. "k:" / "u:" / "t:" .. scope
    ARGV[4] event stream MAXLEN
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
local deleted = 0
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
  -- entry_load_live deletes an expired entry with its event. A member whose entry is gone is
  -- stale and dropped; a live entry is re-indexed at its real expiry so it cannot block the
  -- batch.
  local existed = redis.call('EXISTS', ctx.entry) == 1
  local live = entry_load_live(ctx)
  if live and live[3] then
    redis.call('ZADD', KEYS[1], live[3], member)
  else
    redis.call('ZREM', KEYS[1], member)
    if existed and not live then
      deleted = deleted + 1
    end
  end
end
return {ST.OK, deleted, #due > batch and 1 or 0}
