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
  Entries are read a page at a time (each dropped as the next is read): one at first, then
  as many of the size of the largest of the page before as make PAGE_BYTES (1 to PAGE).
  Output:
    {ST.OK, more (1: the page ended at ARGV[2] or ARGV[3]; 0: at the stream's end),
     {{id, {field, value, ...}}, ...}}
  Events: none.
]]

local most, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local PAGE, PAGE_BYTES = 16, 1048576

local taken, bytes, cursor, asked = {}, 0, ARGV[1], 1
while true do
  local page, largest = redis.call('XRANGE', KEYS[1], cursor, '+', 'COUNT', asked), 1
  for _, entry in ipairs(page) do
    if #taken >= most or bytes >= max_bytes then
      return {ST.OK, 1, taken}
    end
    local flat, sized = entry[2], 0
    for j = 1, #flat do
      sized = sized + #flat[j]
    end
    bytes, largest = bytes + sized, math.max(largest, sized)
    taken[#taken + 1] = entry
    cursor = '(' .. entry[1]
  end
  if #page < asked then
    return {ST.OK, 0, taken}
  end
  asked = math.max(1, math.min(PAGE, math.floor(PAGE_BYTES / largest)))
end
