--[[
  The upgrade to packed entries (state/kv/repack.py): entries stored as hashes (v n h t c u x b r
  s, the layout before packed.lua) become packed strings, and the topic indexes lose the
  members of untagged entries ("\255\0<key>": the index holds tagged entries now). Run at
  start, in batches, until a scan finds no hash; an entry already packed is left alone, so a
  batch may run twice.
  Input:
    KEYS[1] the partition's scopes (only its hash tag: every name given is in its slot)
    ARGV[1] "entries" or "topics"   ARGV[2..] entry names, or topic index names
  Output:
    {ST.OK, names changed}
  Events: none (values, versions and revisions stay as they were).
]]
--- @include "packed"

local changed = 0
for i = 2, #ARGV do
  local name = ARGV[i]
  if ARGV[1] == 'topics' then
    changed = changed + redis.call('ZREMRANGEBYLEX', name, '[\255\0', '+')
  elseif redis.call('TYPE', name).ok == 'hash' then
    local f = redis.call('HMGET', name, 'v', 'n', 'h', 't', 'c', 'u', 'x', 'b', 'r', 's')
    local updated = f[6] or '0'
    local rev_ms, rev_seq = packed_stream_id(f[9] or (updated .. '-0'))
    -- (a hash that is not 64 hex digits is left unknown: the next read computes it again)
    local hash = f[3] and #f[3] == 64 and not string.find(f[3], '[^0-9a-f]') and
      packed_unhex(f[3])
    redis.call('DEL', name)
    redis.call('SET', name, packed_pack(f[1] or 'null', tonumber(f[2] or '1'), f[5] or updated,
      updated, rev_ms, rev_seq, hash, f[7] or false, f[4] or false, f[8] or false,
      f[10] == '1'))
    changed = changed + 1
  end
end
return {ST.OK, changed}
