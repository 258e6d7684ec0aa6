#!lua flags=no-writes
--[[
  One chunk of the live keys or values of one scope in key (byte) order (state::list,
  state::list_keys): the call reads the scope a chunk at a time, each chunk one script from the
  last key the one before read, so no script walks a whole scope (docs/decisions/0041).
  Input:
    KEYS[1] scope key index (zset, every score 0: in byte order)
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition entry prefix .. <len>:<scope>)
    ARGV[3] "values" or "keys": what to return
    ARGV[4] where to start: "-" the scope's first key, or "(" .. the last key read before
    ARGV[5] most keys read (live or not)
    ARGV[6] most bytes of entries read: the chunk ends after the entry that reaches it ("keys"
            too: each entry is read whole for its expiry, and 64 of 1 MiB held Redis 0.36 s)
  Output:
    {ST.OK, {value or key, ...}, 1 when the index may hold more (0: it ended), the last key read}
    expired entries are left out
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
local now = tonumber(ARGV[1])
local wantKeys = ARGV[3] == 'keys'
local most, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local out, bytes, last, full = {}, 0, '', false
local keys = redis.call('ZRANGE', KEYS[1], ARGV[4], '+', 'BYLEX', 'LIMIT', 0, most)
for _, key in ipairs(keys) do
  last = key
  local stored = redis.call('GET', ARGV[2] .. key)
  if stored then
    local value, expires = packed_value(stored)
    if not (expires and expires <= now) then
      out[#out + 1] = wantKeys and key or value
    end
    bytes = bytes + #stored
    if bytes >= budget then
      full = true
      break
    end
  end
end
local more = (full or #keys == most) and 1 or 0 -- (else the index ended within this chunk)
return {ST.OK, out, more, last}
