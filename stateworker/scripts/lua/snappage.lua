#!lua flags=no-writes
--[[
  A page of a stream the snapshot commits from (a partition's `unsaved_calls` and
  `unsaved_kept`: snapshot/calls.py, kept.py), bounded in bytes as well as in entries: a
  record holds its call's reply, values and all (a transaction's up to max_call_bytes), so
  1,000 of them read at once could be gigabytes after a PostgreSQL outage.
  Input:
    KEYS[1] the stream
    ARGV[1] where the page begins: an id or "-" (from it), "(" .. id (after it)
    ARGV[2] the most entries of the page
    ARGV[3] the most bytes of the page, about: it ends after the entry that reaches them, so
            it holds one entry at least, however large
  Entries are read PAGE at a time (each dropped as the next is read).
  Output:
    {ST.OK, more (1: the page ended at ARGV[2] or ARGV[3]; 0: at the stream's end),
     {{id, {field, value, ...}}, ...}}
  Events: none.
]]

local most, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local PAGE = 16

local taken, bytes, cursor = {}, 0, ARGV[1]
while true do
  local page = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', PAGE)
  for _, entry in ipairs(page) do
    if #taken >= most or bytes >= max_bytes then
      return {ST.OK, 1, taken}
    end
    local flat = entry[2]
    for j = 1, #flat do
      bytes = bytes + #flat[j]
    end
    taken[#taken + 1] = entry
    cursor = '(' .. entry[1]
  end
  if #page < PAGE then
    return {ST.OK, 0, taken}
  end
end
