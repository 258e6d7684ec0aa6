#!lua flags=no-writes
--[[
  The live keys or values of one scope in key (byte) order (state::list, state::list_keys).
  Input:
    KEYS[1] scope key index (zset)
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition entry prefix .. <len>:<scope>)
    ARGV[3] "values" or "keys": what to return
  Output:
    {ST.OK, {value or key, ...}}   expired entries are left out
  Events: none.
]]

--- @include "packed"

local now = tonumber(ARGV[1])
local wantKeys = ARGV[3] == 'keys'
local out = {}
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local stored = redis.call('GET', ARGV[2] .. key)
  if stored then
    local value, expires = packed_value(stored)
    if not (expires and expires <= now) then
      out[#out + 1] = wantKeys and key or value
    end
  end
end
return {ST.OK, out}
