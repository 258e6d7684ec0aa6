--[[
  Remove a trigger target's call stream that nobody needs any more: no trigger names its
  service (the caller's finding: reactive/targets.py), it holds no call, and none of its
  consumer groups has a consumer (nobody ever served it, or its dead consumers were
  removed). Checked and removed in one step: a call appended, or a consumer come, between a
  check and the removal would otherwise be lost with it.
  Input:
    KEYS[1] the call stream (one shard of the service)
  Output:
    {ST.OK, 0}  no stream there (removed before, or never made): nothing to do
    {ST.OK, 1}  kept: it holds calls (for a worker that may still come)
    {ST.OK, 2}  kept: a group has a consumer (a worker serves it, or served it lately)
    {ST.OK, 3}  removed, with its groups
    {ST.OK, -1} kept: the name holds another type
  Events: none.
]]
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {ST.OK, 0}
end
if kind ~= 'stream' then
  return {ST.OK, -1}
end
if redis.call('XLEN', KEYS[1]) > 0 then
  return {ST.OK, 1}
end
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  for i = 1, #group, 2 do
    if (group[i] == 'consumers' or group[i] == 'pending') and group[i + 1] > 0 then
      return {ST.OK, 2}
    end
  end
end
redis.call('DEL', KEYS[1])
return {ST.OK, 3}
