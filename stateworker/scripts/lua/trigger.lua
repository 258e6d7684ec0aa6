--[[
  Register or unregister one trigger (state::register-trigger, state::unregister-trigger), and
  tell every replica: one entry in the registry stream that the dispatchers follow.
  Input:
    KEYS[1] the trigger registrations (hash: id -> registration JSON)
    KEYS[2] the registry stream (shares KEYS[1]'s hash tag)
    KEYS[3] the leased triggers (zset: id -> expires ms; shares KEYS[1]'s hash tag)
    KEYS[4] the owners' shares (hash, lua/includes/shares.lua; shares KEYS[1]'s hash tag)
    ARGV[1] "set" or "del"    ARGV[2] trigger id    ARGV[3] registration JSON ("set" only)
    ARGV[4] most registrations kept (a "set" of a new id past it is refused)
    ARGV[5] who asks (`acl` mode: the principal, which owns what it registers), "" trusted
    ARGV[6] "1": an admin, who may replace or remove anyone's trigger, else ""
    ARGV[7] now (ms): a leased registration expired by then counts as gone (and is removed)
    ARGV[8] "set": when the registration expires (ms, its `expires_at`), "" never
    ARGV[9] "set": most bytes of all registrations' JSON together (a "set" that would pass it
            with a new or a larger registration is refused)
    ARGV[10] "set": most registrations of one owner (the `owner` of the registration's JSON;
             none in `off` mode): a "set" that would give its owner one more is refused
    ARGV[11] "set": most bytes of one owner's registrations' JSON together
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, 1 when the id was registered (and live) before, 0 when not}
    {ST.CONFLICT, count}  "set" of a new id with ARGV[4] registrations already: nothing written
    {ST.CONFLICT, count, bytes, limit}  "set" that would make the registrations `bytes` of
                          JSON in all, more than ARGV[9]: nothing written (a replica may
                          reload them all, and the snapshot copies them)
    {ST.CONFLICT, count, bytes, limit, owner, "count" | "bytes"}  "set" past the owner's share:
                          `owner` holds `count` registrations of `bytes` bytes of JSON (this
                          one's counted in), past its `limit` (ARGV[10] for "count", ARGV[11]
                          for "bytes"): nothing written (docs/decisions/0064)
    {ST.FORBIDDEN, owner} the id is another owner's trigger ("" none: one registered in `off`
                          mode), and ARGV[5] is no admin: nothing written
  Events: none (no entry changes); one registry entry `kind triggers id <id>` when something
    changed (an unregister of an unknown id changes nothing); each replica's dispatcher
    rereads that id alone (reactive/dispatcher.py).
]]
--- @include "generation"
--- @include "shares"

if generation_registry_lost(KEYS[2]) then
  return {ST.STORE_LOST}
end
shares_ready(KEYS[4], KEYS[1])
local held = redis.call('HGET', KEYS[1], ARGV[2])
local lapsed = false
if held then
  local expires = redis.call('ZSCORE', KEYS[3], ARGV[2])
  if expires and tonumber(expires) <= tonumber(ARGV[7]) then  -- expired: gone, whoever's it was
    redis.call('HDEL', KEYS[1], ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[2])
    shares_add(KEYS[4], shares_owner_of(held), -1, -#held)
    held, lapsed = false, true
  end
end
local existed = held and 1 or 0
local held_owner = held and shares_owner_of(held) or nil
if held and ARGV[5] ~= '' and ARGV[6] ~= '1' and held_owner ~= ARGV[5] then
  return {ST.FORBIDDEN, held_owner or ''}
end

-- A refusal: nothing written, but an expired registration removed on the way is told.
local function refused(reply)
  if lapsed then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', ARGV[2])
  end
  return reply
end

if ARGV[1] == 'set' then
  if existed == 0 then
    local count = redis.call('HLEN', KEYS[1])
    if count >= tonumber(ARGV[4]) then
      return refused({ST.CONFLICT, count})
    end
  end
  if not held or #ARGV[3] > #held then -- (grows the registry: what it holds is summed)
    local bytes = #ARGV[3] - (held and #held or 0)
    for _, registration in ipairs(redis.call('HVALS', KEYS[1])) do
      bytes = bytes + #registration
    end
    if bytes > tonumber(ARGV[9]) then
      return refused({ST.CONFLICT, redis.call('HLEN', KEYS[1]), bytes, tonumber(ARGV[9])})
    end
  end
  local owner = shares_owner_of(ARGV[3])
  if owner then  -- its owner's share: one more registration (unless it replaces its own)
    local count, bytes = shares_of(KEYS[4], owner)
    local own = held and held_owner == owner
    local more, grown = own and 0 or 1, bytes + #ARGV[3] - (own and #held or 0)
    if count + more > tonumber(ARGV[10]) then
      return refused({ST.CONFLICT, count, bytes, tonumber(ARGV[10]), owner, 'count'})
    end
    if grown > bytes and grown > tonumber(ARGV[11]) then
      return refused({ST.CONFLICT, count + more, grown, tonumber(ARGV[11]), owner, 'bytes'})
    end
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  if held then
    shares_add(KEYS[4], held_owner, -1, -#held)
  end
  shares_add(KEYS[4], owner, 1, #ARGV[3])
  if ARGV[8] ~= '' then
    redis.call('ZADD', KEYS[3], ARGV[8], ARGV[2])
  else
    redis.call('ZREM', KEYS[3], ARGV[2])
  end
elseif existed == 1 then
  redis.call('HDEL', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
  shares_add(KEYS[4], held_owner, -1, -#held)
elseif not lapsed then
  return {ST.OK, 0}
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', ARGV[2])
return {ST.OK, existed}
