--[[
  Claim scopes for a private namespace (state::claim-namespace): all or nothing, and the
  first claimant of a scope keeps it; a public scope in use is not taken unless adopted.
  The prefix, the caller and the scopes' names are checked by the caller, and so is each
  scope's use (entries and last write live in the scope's partition, another slot: the
  claim's read step finds them, namespaces.py); ownership is checked here, for every scope,
  before the first write.
  Input:
    KEYS[1] claims hash (scope -> functions prefix)
    KEYS[2] registry stream (every replica follows it)
    ARGV[1] functions prefix        ARGV[2] registry stream MAXLEN
    ARGV[3] "" no adoption, or "=" .. the admin adopting the scopes in use
    ARGV[4] n, the number of scopes asked for
    ARGV[5] most scopes one namespace owns    ARGV[6] most scopes claimed in all
    ARGV[7..] the n scopes asked for (distinct), then each one's use: "" free, or
            "<entries>:<why>" in use
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, 1 when a scope was new else 0, {every scope the prefix owns now},
     {the new scopes that were in use: adopted}}
    {ST.SCOPE_CONFLICT, scope, owner}   the first scope asked for that another prefix owns;
                                        nothing written
    {ST.SCOPE_IN_USE, scope, use}       the first new scope in use, with no adoption;
                                        nothing written
    {ST.INVALID_REQUEST, "namespace" | "all", scopes owned with the new ones, the limit}
                                        the namespace would own more than ARGV[5] scopes,
                                        or all namespaces more than ARGV[6]: nothing written
                                        (every claim and release reads the whole hash, and
                                        every replica and the snapshot hold it)
  Events: none in the partition streams. When a scope was new, one registry entry
    {kind "claims", prefix, scopes (JSON array of the new scopes)}, plus, when scopes in use
    were adopted, adopted (JSON array) and by (the admin).
]]

--- @include "claims"
--- @include "generation"

local claims, registry, prefix = KEYS[1], KEYS[2], ARGV[1]
if generation_registry_lost(registry) then
  return {ST.STORE_LOST}
end
local adopter, n = ARGV[3], tonumber(ARGV[4])
local new, adopted = {}, {}
for i = 7, 6 + n do
  local scope, use = ARGV[i], ARGV[i + n]
  local owner = redis.call('HGET', claims, scope)
  if owner and owner ~= prefix then
    return {ST.SCOPE_CONFLICT, scope, owner}
  end
  if not owner then
    if use ~= '' then
      if adopter == '' then
        return {ST.SCOPE_IN_USE, scope, use}
      end
      adopted[#adopted + 1] = scope
    end
    new[#new + 1] = scope
  end
end

local owned = claims_owned(claims, prefix)
if #new > 0 then
  if #owned + #new > tonumber(ARGV[5]) then
    return {ST.INVALID_REQUEST, 'namespace', #owned + #new, tonumber(ARGV[5])}
  end
  local all = redis.call('HLEN', claims) + #new
  if all > tonumber(ARGV[6]) then
    return {ST.INVALID_REQUEST, 'all', all, tonumber(ARGV[6])}
  end
  for _, scope in ipairs(new) do
    owned[#owned + 1] = scope
    redis.call('HSET', claims, scope, prefix)
  end
  if #adopted > 0 then
    redis.call('XADD', registry, 'MAXLEN', '~', ARGV[2], '*', 'kind', 'claims',
      'prefix', prefix, 'scopes', cjson.encode(new), 'adopted', cjson.encode(adopted),
      'by', string.sub(adopter, 2))
  else
    redis.call('XADD', registry, 'MAXLEN', '~', ARGV[2], '*', 'kind', 'claims',
      'prefix', prefix, 'scopes', cjson.encode(new))
  end
end

return {ST.OK, #new > 0 and 1 or 0, owned, adopted}
