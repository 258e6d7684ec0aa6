--[[
  Add, replace or remove one principal or role (stateworker principal / role), and tell every
  replica: one entry in the registry stream, in the same step, so no replica misses a change.
  The records (JSON) are built and checked by the caller; what needs the other records is
  checked here, before the first write.
  Input:
    KEYS[1] principals hash (name -> record JSON)
    KEYS[2] roles hash (name -> record JSON)
    KEYS[3] registry stream (shares KEYS[1]'s hash tag)
    ARGV[1] "principal-add", "principal-set", "principal-del", "role-set" or "role-del"
    ARGV[2] the name    ARGV[3] its record JSON ("" for a del)    ARGV[4] registry MAXLEN
    ARGV[5..] principal-add / -set: the roles the record names that are not built in
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, 1 when the name existed before else 0}
    {ST.CONFLICT, "exists", name}        principal-add of a principal that exists
    {ST.CONFLICT, "no-role", role}       principal-add / -set naming a role that is not stored
    {ST.CONFLICT, "in-use", principal}   role-del of a role a principal holds
    Nothing written on a CONFLICT, nor by a del of a name that is absent.
  Events: none in the partition streams; one registry entry
    {kind "principals" | "roles", name, record} when something changed ("" record: removed).
]]
--- @include "generation"

local principals, roles, registry = KEYS[1], KEYS[2], KEYS[3]
if generation_registry_lost(registry) then
  return {ST.STORE_LOST}
end
local op, name, record = ARGV[1], ARGV[2], ARGV[3]
local kind, hash = 'principals', principals
if op == 'role-set' or op == 'role-del' then
  kind, hash = 'roles', roles
end
local existed = redis.call('HEXISTS', hash, name)

if op == 'principal-add' and existed == 1 then
  return {ST.CONFLICT, 'exists', name}
end
if op == 'principal-add' or op == 'principal-set' then
  for i = 5, #ARGV do
    if redis.call('HEXISTS', roles, ARGV[i]) == 0 then
      return {ST.CONFLICT, 'no-role', ARGV[i]}
    end
  end
end
if op == 'role-del' and existed == 1 then
  local all = redis.call('HGETALL', principals)
  for i = 1, #all, 2 do
    for _, held in ipairs(cjson.decode(all[i + 1]).roles or {}) do
      if held == name then
        return {ST.CONFLICT, 'in-use', all[i]}
      end
    end
  end
end

if op == 'principal-del' or op == 'role-del' then
  if existed == 0 then
    return {ST.OK, 0}
  end
  redis.call('HDEL', hash, name)
  record = ''
else
  redis.call('HSET', hash, name, record)
end
redis.call('XADD', registry, 'MAXLEN', '~', ARGV[4], '*', 'kind', kind, 'name', name,
  'record', record)
return {ST.OK, existed}
