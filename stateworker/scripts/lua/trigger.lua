--[[
  Register or unregister one trigger (state::register-trigger, state::unregister-trigger), and
  tell every replica: one entry in the registry stream that the dispatchers follow.
  Input:
    KEYS[1] the trigger registrations (hash: id -> registration JSON)
    KEYS[2] the registry stream (shares KEYS[1]'s hash tag)
    ARGV[1] "set" or "del"    ARGV[2] trigger id    ARGV[3] registration JSON ("set" only)
    ARGV[4] most registrations kept (a "set" of a new id past it is refused)
  Output:
    {ST.OK, 1 when the id was registered before, 0 when not}
    {ST.CONFLICT, count}  "set" of a new id with ARGV[4] registrations already: nothing written
  Events: none (no entry changes); one registry entry `kind triggers id <id>` when something
    changed (an unregister of an unknown id changes nothing).
]]
local existed = redis.call('HEXISTS', KEYS[1], ARGV[2])
if ARGV[1] == 'set' then
  if existed == 0 then
    local count = redis.call('HLEN', KEYS[1])
    if count >= tonumber(ARGV[4]) then
      return {ST.CONFLICT, count}
    end
  end
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
elseif existed == 1 then
  redis.call('HDEL', KEYS[1], ARGV[2])
else
  return {ST.OK, 0}
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'triggers', 'id', ARGV[2])
return {ST.OK, existed}
