--[[
  Move a partition's dispatch position forward, only while the caller still holds the lease
  (a dispatcher that lost it must not move the position of the one that took over).
  Input:
    KEYS[1] the partition's lease    KEYS[2] its dispatch position (hash: id, n)
    ARGV[1] the holder's token       ARGV[2] the last event id handed on
    ARGV[3] that event's ordinal in the stream (entries added before it and it)
  Output:
    {ST.OK, 1}  moved
    {ST.OK, 0}  the lease is another's (or gone): nothing written
  Events: none.
]]
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {ST.OK, 0}
end
redis.call('HSET', KEYS[2], 'id', ARGV[2], 'n', ARGV[3])
return {ST.OK, 1}
