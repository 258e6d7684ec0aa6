--[[
  Store the canonical hash of an entry's value when it is unknown (after state::update, whose
  script cannot compute SHA-256) and the entry is still at the version it was computed for.
  Input:
    KEYS[1] entry (packed.lua)
    ARGV[1] version the hash belongs to      ARGV[2] hash (lowercase hex SHA-256)
  Output:
    {ST.OK, 1 when stored, 0 when the entry moved on or already has a hash}
  Events: none (the value does not change).
]]

--- @include "packed"

local stored = redis.call('GET', KEYS[1])
local cur = stored and packed_read(stored)
if cur and cur[2] == tonumber(ARGV[1]) and not cur[4] then
  redis.call('SET', KEYS[1], packed_pack(cur[1], cur[2], cur[8], cur[9], cur[10], cur[11],
    packed_unhex(ARGV[2]), cur[3], cur[5], cur[7], cur[6] == '1'))
  return {ST.OK, 1}
end
return {ST.OK, 0}
