#!lua flags=no-writes
--[[
  The live values of one scope in key (byte) order (state::list).
  Input:
    KEYS[1] scope key index (zset)
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition entry prefix .. <len>:<scope>)
  Output:
    {ST.OK, {value, ...}}   expired entries are left out
  Events: none.
]]

local now = tonumber(ARGV[1])
local values = {}
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local f = redis.call('HMGET', ARGV[2] .. key, 'v', 'x')
  if f[1] and not (f[2] and tonumber(f[2]) <= now) then
    values[#values + 1] = f[1]
  end
end
return {ST.OK, values}
