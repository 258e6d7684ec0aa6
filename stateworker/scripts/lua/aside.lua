--[[
  Set, move or drop a trigger's mark in its partition: where the trigger stands while it is
  set aside from the partition's main pass, its target stream full (reactive/aside.py). Only
  while the caller holds the partition's lease: a dispatcher that lost it must not drop or
  move a mark the new holder relies on.
  Input:
    KEYS[1] the partition's lease    KEYS[2] its marks (hash: trigger id -> "<id> <n>")
    ARGV[1] the holder's token       ARGV[2] "set" (set or move) or "drop"
    ARGV[3] the trigger id           ARGV[4] the mark's last event id handed on ("" for drop)
    ARGV[5] that event's ordinal in the stream ("" for drop)
  Output:
    {ST.OK, 1}   written (set, moved or dropped)
    {ST.OK, 0}   the lease is another's (or gone): nothing written
    {ST.OK, -1}  the arguments are not a mark (a bug of the caller): nothing written
  Events: none.
]]
local op = ARGV[2]
if (op ~= 'set' and op ~= 'drop') or ARGV[3] == ''
    or (op == 'set' and (ARGV[4] == '' or not tonumber(ARGV[5]))) then
  return {ST.OK, -1}
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {ST.OK, 0}
end
if op == 'set' then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4] .. ' ' .. ARGV[5])
else
  redis.call('HDEL', KEYS[2], ARGV[3])
end
return {ST.OK, 1}
