--[[
  A restore's last step in one slot: its generation marker written, only if the restore's
  mark is still there. `stateworker restore` marks every slot first (state/generation.py
  begin_restore); a FLUSHALL (or a restart without data) during the restore takes the mark,
  and then nothing is stamped here: the restore fails and says to run it again, instead of
  letting writes into a Redis that holds part of what it restored.
  Input:
    KEYS[1] a partition's history hash (fields `restoring`, `gen`), or the registry's marker
            (a string: "~" .. the generation while a restore runs, the generation after)
    ARGV[1] "h" (a history hash) or "s" (the registry's marker)
    ARGV[2] the restore's generation
  Output:
    {ST.OK, 1}  stamped, or stamped with this generation already (a restore that stopped in
                its last step is finished by stamping again: state/generation.py `finish`)
    {ST.OK, 0}  the restore's mark is gone (or another's): nothing written
  Events: none.
]]
if ARGV[1] == 'h' then
  if redis.call('HGET', KEYS[1], 'restoring') ~= ARGV[2] then
    return {ST.OK, redis.call('HGET', KEYS[1], 'gen') == ARGV[2] and 1 or 0}
  end
  redis.call('HSET', KEYS[1], 'gen', ARGV[2])
  redis.call('HDEL', KEYS[1], 'restoring')
  return {ST.OK, 1}
end
local marker = redis.call('GET', KEYS[1])
if marker == ARGV[2] then
  return {ST.OK, 1}
end
if marker ~= '~' .. ARGV[2] then
  return {ST.OK, 0}
end
redis.call('SET', KEYS[1], ARGV[2])
return {ST.OK, 1}
