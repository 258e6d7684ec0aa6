#!lua flags=no-writes
--[[
  Several entries of one scope in one call (state::get-many), in the order asked (a key asked
  twice is read twice, its bytes counted each time). An entry whose expiry has passed reads as missing (the reaper deletes
  it later). A hash an update left unknown comes back false: the caller computes and stores it.
  Input:
    KEYS[1] scope key index (only its hash tag is used: every entry is in its slot)
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[3] the most bytes of values the reply may hold (max_call_bytes)
    ARGV[4..] the keys
  Output:
    {ST.OK, {{value, version, hash, topic, created, updated, expires, updated_by, revision}, ...}}
    (one list of 9 fields per key asked, false where unset; value false for a missing or
    expired entry; numbers as integers, the hash as its 32 raw bytes)
    {ST.CALL_TOO_LARGE, index of the key (0-based) passing the limit, bytes by then, ARGV[3]}:
    the values read by that key are more than the limit; nothing is returned
    {ST.STORE_LOST, prefix, 1 or 0} the partition's data is lost or a restore writes it back
    (1): nothing read (generation.lua generation_read_refused)
  Events: none.
]]

--- @include "generation"
--- @include "packed"

local refused = generation_read_refused(KEYS[1])
if refused then
  return refused
end
local now, prefix, budget = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local out, spent = {}, 0
for i = 4, #ARGV do
  local stored = redis.call('GET', prefix .. ARGV[i])
  if stored then
    local c = packed_read(stored) -- (value, version, expires, hash, topic, plain, by, ...)
    local value = c[1]
    if c[3] and tonumber(c[3]) <= now then
      value = false
    else
      spent = spent + #value
      if spent > budget then
        return {ST.CALL_TOO_LARGE, i - 4, spent, budget}
      end
    end
    out[i - 3] = {value, c[2], c[4], c[5], c[8], c[9], c[3], c[7], packed_revision(c)}
  else
    out[i - 3] = {false, false, false, false, false, false, false, false, false}
  end
end
return {ST.OK, out}
