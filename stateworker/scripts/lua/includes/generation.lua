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
