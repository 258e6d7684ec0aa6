--[[
  Store the canonical hash of an entry's value when it is unknown (after state::update, whose
  script cannot compute SHA-256) and the entry is still at the version it was computed for.
  Input:
    KEYS[1] entry hash
    ARGV[1] version the hash belongs to      ARGV[2] hash (lowercase hex SHA-256)
  Output:
    {ST.OK, 1 when stored, 0 when the entry moved on or already has a hash}
  Events: none (the value does not change).
]]

local f = redis.call('HMGET', KEYS[1], 'n', 'h')
if f[1] == ARGV[1] and not f[2] then
  redis.call('HSET', KEYS[1], 'h', ARGV[2])
  return {ST.OK, 1}
end
return {ST.OK, 0}
