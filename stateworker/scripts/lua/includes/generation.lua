--[[
  The generation marker (state/generation.py; helpers prefixed generation_): every partition's
  `history` hash holds field `gen`, the registry's tag holds the string `generation`, both
  written when the prefix begins in this Redis and by a restore, and mirrored in PostgreSQL.
  A write finds it gone when this Redis lost its data (a FLUSHALL, a restart without its AOF,
  an eviction) or when the service marked the partition lost (behind what PostgreSQL holds):
  the script returns {ST.STORE_LOST} before its first write and before it reads or keeps a
  call record, so the call is neither applied to a store that is not the truth nor recorded
  (its retry after the recovery runs). One HGET (or EXISTS) a call.
]]

-- Whether the partition of `tag` (its names' common head, "<prefix>:{<prefix>:pN}:") lost it.
local function generation_lost(tag)
  return not redis.call('HGET', tag .. 'history', 'gen')
end

-- Whether the registry lost it; `registry`: the registry stream's name (<tag> .. "registry").
-- While a restore runs the marker is "~" .. its generation (stamp.lua): lost as well.
local function generation_registry_lost(registry)
  local marker = redis.call('GET', string.sub(registry, 1, -9) .. 'generation')
  return not marker or string.byte(marker, 1) == 126
end

--[[
  A read's check (get.lua, getmany.lua, list.lua, entries.lua, pages.lua; the raw reads do
  the same in Python: RedisState.read_plan), before it reads or writes anything: nil while
  the partition of `name` (any key of it) holds its data; else the reply that refuses the
  read, {ST.STORE_LOST, the prefix, 1 while a restore writes the partition back (its
  `restoring` mark) or 0}. A key a lost or half restored Redis does not hold is not known to
  be missing: answered as missing, a caller would act on data PostgreSQL holds as absent.
  One HGET a read (the prefix is [A-Za-z0-9_.-]: a name's tag is up to its first "}:").
]]
local function generation_read_refused(name)
  local history = string.match(name, '^[^}]*}:') .. 'history'
  if redis.call('HGET', history, 'gen') then
    return nil
  end
  return {ST.STORE_LOST, string.match(name, '^[^:]*'), redis.call('HEXISTS', history, 'restoring')}
end
