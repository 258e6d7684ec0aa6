--[[
  Register or unregister one trigger (state::register-trigger, state::unregister-trigger), and
  tell every replica: one entry in the registry stream that the dispatchers follow.
  Input:
    KEYS[1] the trigger registrations (hash: id -> registration JSON)
    KEYS[2] the registry stream (shares KEYS[1]'s hash tag)
    KEYS[3] the leased triggers (zset: id -> expires ms; shares KEYS[1]'s hash tag)
    ARGV[1] "set" or "del"    ARGV[2] trigger id    ARGV[3] registration JSON ("set" only)
    ARGV[4] most registrations kept (a "set" of a new id past it is refused)
    ARGV[5] who asks (`acl` mode: the principal, which owns what it registers), "" trusted
    ARGV[6] "1": an admin, who may replace or remove anyone's trigger, else ""
    ARGV[7] now (ms): a leased registration expired by then counts as gone (and is removed)
    ARGV[8] "set": when the registration expires (ms, its `expires_at`), "" never
    ARGV[9] "set": most bytes of all registrations' JSON together (a "set" that would pass it
            with a new or a larger registration is refused)
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, 1 when the id was registered (and live) before, 0 when not}
    {ST.CONFLICT, count}  "set" of a new id with ARGV[4] registrations already: nothing written
    {ST.CONFLICT, count, bytes, limit}  "set" that would make the registrations `bytes` of
                          JSON in all, more than ARGV[9]: nothing written (every replica
                          reloads them all on every change, and the snapshot copies them)
    {ST.FORBIDDEN, owner} the id is another owner's trigger ("" none: one registered in `off`
                          mode), and ARGV[5] is no admin: nothing written
  Events: none (no entry changes); one registry entry `kind triggers id <id>` when something
    changed (an unregister of an unknown id changes nothing).
]]
--- @include "generation"

if generation_registry_lost(KEYS[2]) then
  return {ST.STORE_LOST}
end
local held = redis.call('HGET', KEYS[1], ARGV[2])
local lapsed = false
if held then
  local expires = redis.call('ZSCORE', KEYS[3], ARGV[2])
  if expires and tonumber(expires) <= tonumber(ARGV[7]) then  -- expired: gone, whoever's it was
    redis.call('HDEL', KEYS[1], ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
    held, lapsed = false, true
  end
end
local existed = held and 1 or 0
if held and ARGV[5] ~= '' and ARGV[6] ~= '1' then
  local owner = cjson.decode(held).owner
  if owner ~= ARGV[5] then
    return {ST.FORBIDDEN, type(owner) == 'string' and owner or ''}
  end
end
if ARGV[1] == 'set' then
  if existed == 0 then
    local count = redis.call('HLEN', KEYS[1])
    if count >= tonumber(ARGV[4]) then
      if lapsed then
        redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', ARGV[2])
      end
      return {ST.CONFLICT, count}
    end
  end
  if not held or #ARGV[3] > #held then -- (grows the registry: what it holds is summed)
    local bytes = #ARGV[3] - (held and #held or 0)
    for _, registration in ipairs(redis.call('HVALS', KEYS[1])) do
      bytes = bytes + #registration
    end
    if bytes > tonumber(ARGV[9]) then
      if lapsed then
        redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', ARGV[2])
      end
      return {ST.CONFLICT, redis.call('HLEN', KEYS[1]), bytes, tonumber(ARGV[9])}
    end
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  if ARGV[8] ~= '' then
    redis.call('ZADD', KEYS[3], ARGV[8], ARGV[2])
  else
    redis.call('ZREM', KEYS[3], ARGV[2])
  end
elseif existed == 1 then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
elseif not lapsed then
  return {ST.OK, 0}
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', ARGV[2])
return {ST.OK, existed}
