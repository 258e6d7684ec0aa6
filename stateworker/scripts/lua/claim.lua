--[[
  Claim scopes for a private namespace (state::claim-namespace): all or nothing, and the
  first claimant of a scope keeps it. The prefix, the caller and the scopes' names are
  checked by the caller; ownership is checked here, for every scope, before the first write.
  Input:
    KEYS[1] claims hash (scope -> functions prefix)
    KEYS[2] registry stream (every replica follows it)
    ARGV[1] functions prefix        ARGV[2] registry stream MAXLEN
    ARGV[3..] the scopes asked for (distinct)
  Output:
    {ST.OK, 1 when a scope was new else 0, {every scope the prefix owns now}}
    {ST.SCOPE_CONFLICT, scope, owner}   the first scope asked for that another prefix owns;
                                        nothing written
  Events: none in the partition streams. When a scope was new, one registry entry
    {kind "claims", prefix, scopes (JSON array of the new scopes)}.
]]

local claims, registry, prefix = KEYS[1], KEYS[2], ARGV[1]
local new = {}
for i = 3, #ARGV do
  local owner = redis.call('HGET', claims, ARGV[i])
  if owner and owner ~= prefix then
    return {ST.SCOPE_CONFLICT, ARGV[i], owner}
  end
  if not owner then
    new[#new + 1] = ARGV[i]
  end
end

if #new > 0 then
  for _, scope in ipairs(new) do
    redis.call('HSET', claims, scope, prefix)
  end
  redis.call('XADD', registry, 'MAXLEN', '~', ARGV[2], '*', 'kind', 'claims',
    'prefix', prefix, 'scopes', cjson.encode(new))
end

local owned, all = {}, redis.call('HGETALL', claims)
for i = 1, #all, 2 do
  if all[i + 1] == prefix then
    owned[#owned + 1] = all[i]
  end
end
return {ST.OK, #new > 0 and 1 or 0, owned}
