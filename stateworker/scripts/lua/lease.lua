--[[
  A dispatcher's hold on one partition: take, renew or drop it, only with its own token.
  Input:
    KEYS[1] the partition's lease (string: the holder's token, PX lease time)
    ARGV[1] "take", "renew" or "drop"    ARGV[2] the holder's token    ARGV[3] lease ms
  Output:
    {ST.OK, 1}  taken (free, or already this token's), renewed, or dropped
    {ST.OK, 0}  another token holds it (or, for renew/drop, nobody does): nothing written
  Events: none.
]]
local holder = redis.call('GET', KEYS[1])
if ARGV[1] == 'take' then
  if holder and holder ~= ARGV[2] then
    return {ST.OK, 0}
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return {ST.OK, 1}
end
if holder ~= ARGV[2] then
  return {ST.OK, 0}
end
if ARGV[1] == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return {ST.OK, 1}
