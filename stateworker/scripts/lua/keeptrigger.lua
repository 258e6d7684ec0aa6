--[[
  A leased trigger's lifetime (state::keep-trigger), and the end of the expired ones (the
  reaper). Each change tells every replica: one registry entry, as trigger.lua writes.
  Input:
    KEYS[1] the trigger registrations (hash: id -> registration JSON)
    KEYS[2] the registry stream (shares KEYS[1]'s hash tag)
    KEYS[3] the leased triggers (zset: id -> expires ms; shares KEYS[1]'s hash tag)
    KEYS[4] the owners' shares (hash, lua/includes/shares.lua; shares KEYS[1]'s hash tag):
            a renewal's change of bytes and each removal are counted there, once it is built
    ARGV[1] "keep" or "reap"    ARGV[2] now (ms)
    "keep": ARGV[3] trigger id  ARGV[4] its registration as read (JSON)
            ARGV[5] the registration renewed (JSON: its new `expires_at`)  ARGV[6] expires ms
    "reap": ARGV[3] most triggers removed in one call, ARGV[4..6] "" (unread)
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    "keep": {ST.OK, 1} renewed; {ST.OK, 0} the id is not registered, or its lease expired by
            ARGV[2] (nothing written); {ST.CONFLICT, 0} its registration is no longer ARGV[4]
            (changed since it was read: read it again), nothing written
    "reap": {ST.OK, removed, 1 when more expired ones remain else 0}
  Events: none (no entry changes); one registry entry `kind triggers id <id>` per trigger
    renewed or removed (each replica's dispatcher rereads that id alone: a renewal's new
    `expires_at` is what its matching checks, reactive/matching.py).
]]
--- @include "generation"
--- @include "shares"

if generation_registry_lost(KEYS[2]) then
  return {ST.STORE_LOST}
end
local now = tonumber(ARGV[2])
-- (not built yet: the next trigger.lua builds it from the registrations as they are then)
local shares = redis.call('HEXISTS', KEYS[4], '.') == 1 and KEYS[4] or nil

local function tell(id)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', id)
end

if ARGV[1] == 'keep' then
  local id = ARGV[3]
  local held = redis.call('HGET', KEYS[1], id)
  local expires = redis.call('ZSCORE', KEYS[3], id)
  if not held or not expires or tonumber(expires) <= now then
    return {ST.OK, 0}
  end
  if held ~= ARGV[4] then
    return {ST.CONFLICT, 0}
  end
  redis.call('HSET', KEYS[1], id, ARGV[5])
  redis.call('ZADD', KEYS[3], ARGV[6], id)
  if shares and #ARGV[5] ~= #held then
    shares_add(shares, shares_owner_of(held), 0, #ARGV[5] - #held)
  end
  tell(id)
  return {ST.OK, 1}
end

local batch = tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, batch + 1)
local removed = 0
for i = 1, math.min(#due, batch) do
  local held = redis.call('HGET', KEYS[1], due[i])
  if shares and held then
    shares_add(shares, shares_owner_of(held), -1, -#held)
  end
  redis.call('HDEL', KEYS[1], due[i])
  redis.call('ZREM', KEYS[3], due[i])
  tell(due[i])
  removed = removed + 1
end
return {ST.OK, removed, #due > batch and 1 or 0}
