--[[
  Remove the dead consumers of one consumer group of a call stream (bus/upkeep.py, the
  sweep): each with no entry pending and idle longer than ARGV[3], never the sweeper's own.
  Check and delete are one step: XGROUP DELCONSUMER deletes the consumer's pending entries
  with it (never delivered again), so a consumer that read between a check and a delete in
  two commands would lose what it read. A live consumer removed here had nothing pending:
  its next XREADGROUP that gets an entry makes it again (Redis makes consumers on read).
  `idle` (XINFO CONSUMERS) is Redis's own clock: ms since the consumer's last read attempt
  (Redis 7.2+), or since its last read that got entries (7.0).
  Input:
    KEYS[1] a call stream (keys: bus_stream, bus_shard_stream, principal_stream)
    ARGV[1] its consumer group    ARGV[2] the sweeper's own consumer (never removed)
    ARGV[3] ms: a consumer with nothing pending idle longer than this is removed
  Output:
    {ST.OK, removed, left}  consumers removed, and those the group still holds;
      {ST.OK, 0, 0} for no such stream or group (a principal's stream removed meanwhile)
    A Redis error other than those (NOPERM: the caller's user lacks `xinfo|consumers` or
    `xgroup|delconsumer`; WRONGTYPE) is the reply, nothing removed.
  Events: none.
]]
local found = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if found.err then
  if string.find(found.err, 'NOGROUP', 1, true) or string.find(found.err, 'no such key', 1, true) then
    return {ST.OK, 0, 0}
  end
  return redis.error_reply(found.err)
end
local bound = tonumber(ARGV[3])
local removed = 0
for _, consumer in ipairs(found) do
  local name, pending, idle
  for i = 1, #consumer, 2 do
    local field = consumer[i]
    if field == 'name' then
      name = consumer[i + 1]
    elseif field == 'pending' then
      pending = consumer[i + 1]
    elseif field == 'idle' then
      idle = consumer[i + 1]
    end
  end
  if pending == 0 and idle > bound and name ~= ARGV[2] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    removed = removed + 1
  end
end
return {ST.OK, removed, #found - removed}
