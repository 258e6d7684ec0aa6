#!lua flags=no-writes
--[[
  Several entries of one scope in one call (state::get-many), in the order asked (a key asked
  twice is read twice). An entry whose expiry has passed reads as missing (the reaper deletes
  it later). A hash an update left unknown comes back false: the caller computes and stores it.
  Input:
    KEYS[1] scope key index (only its hash tag is used: every entry is in its slot)
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[3 ..] the keys
  Output:
    {ST.OK, {{value, version, hash, topic, created, updated, expires, updated_by, revision}, ...}}
    (one list of 9 fields per key asked, false where unset; value false for a missing or
    expired entry)
  Events: none.
]]

local now, prefix = tonumber(ARGV[1]), ARGV[2]
local out = {}
for i = 3, #ARGV do
  local f = redis.call('HMGET', prefix .. ARGV[i], 'v', 'n', 'h', 't', 'c', 'u', 'x', 'b', 'r')
  if f[1] and f[7] and tonumber(f[7]) <= now then
    f[1] = false
  end
  out[i - 2] = f
end
return {ST.OK, out}
