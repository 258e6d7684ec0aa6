--[[
  Release claimed scopes (state::release-namespace): they become public again, their entries
  kept. All or nothing: every scope is checked before the first write. The caller and the
  scopes' names are checked by the caller; whether it may release another namespace's scope
  (an admin's `force`) too.
  Input:
    KEYS[1] claims hash (scope -> functions prefix)
    KEYS[2] registry stream (every replica follows it)
    ARGV[1] who releases (the caller: a namespace releases its own scopes)
    ARGV[2] "1": release whatever namespace owns a scope (an admin's `force: true`), else ""
    ARGV[3] registry stream MAXLEN
    ARGV[4..] the scopes to release (distinct)
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, {scope, owner, scope, owner ...} released, {every scope ARGV[1] owns now}}
    {ST.INVALID_SCOPE, scope}      the first scope no namespace claimed; nothing written
    {ST.FORBIDDEN, scope, owner}   the first scope another namespace owns (no force);
                                   nothing written
  Events: none in the partition streams; one registry entry per scope released {kind
    "claims", released (JSON object: that scope -> the owner it was released from), by}.
]]

--- @include "claims"
--- @include "generation"

local claims, registry, caller, force = KEYS[1], KEYS[2], ARGV[1], ARGV[2] == '1'
if generation_registry_lost(registry) then
  return {ST.STORE_LOST}
end
local owners = {}
for i = 4, #ARGV do
  local owner = redis.call('HGET', claims, ARGV[i])
  if not owner then
    return {ST.INVALID_SCOPE, ARGV[i]}
  end
  if owner ~= caller and not force then
    return {ST.FORBIDDEN, ARGV[i], owner}
  end
  owners[#owners + 1] = owner
end

local flat = {} -- (pairs for the reply)
for i = 4, #ARGV do
  local owner = owners[i - 3]
  redis.call('HDEL', claims, ARGV[i])
  redis.call('XADD', registry, 'MAXLEN', '~', ARGV[3], '*', 'kind', 'claims',
    'released', cjson.encode({[ARGV[i]] = owner}), 'by', caller)
  flat[#flat + 1] = ARGV[i]
  flat[#flat + 1] = owner
end

return {ST.OK, flat, claims_owned(claims, caller)}
