--[[
  Delete one batch of the entries of a scope whose key starts with a byte prefix
  (state::delete-by-prefix): at most ARGV[12] members of the scope's key index, in key order,
  from the first with the prefix. An entry whose expiry has passed is deleted with the
  reaper's event (by ""), not counted. The caller calls again while `more`. A bus call's
  reply is recorded (entry.lua), so a second delivery gets it and deletes nothing more.
  Input:
    @arguments entry (lua/includes/entry.lua), its entry, key and ttl member the
      prefix's as a key (any entry of the scope: the others are the prefix below ..
      <len>:<scope><key>, in the same slot), then
    ARGV[8] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[9] ttl member prefix of the scope (<len>:<scope>)
    ARGV[10] lex range start ("[" .. prefix)
    ARGV[11] lex range end ("(" .. prefix .. "\255": no UTF-8 key holds the byte 255)
    ARGV[12] most index members to examine (the call's limit)
    ARGV[13] the batch's budget: bytes of the values it deletes (max_call_bytes; they go into
             the events): once passed, the batch ends (at least one entry is deleted)
  Output:
    {ST.OK, number deleted, 1 when keys with the prefix remain else 0}
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
  Events: state:deleted for each entry deleted (and for each expired one, the reaper's).
]]
--- @include "entry"

local dup, ctx = entry_start()
if dup then
  return dup
end
local members = redis.call('ZRANGE', ctx.keyIndex, ARGV[10], ARGV[11], 'BYLEX', 'LIMIT', 0,
  tonumber(ARGV[12]))
local deleted, budget = 0, tonumber(ARGV[13])
for _, key in ipairs(members) do
  deleted = deleted + entry_delete_key(ctx, ARGV[8], ARGV[9], key)
  budget = budget - ctx.dropped
  if budget <= 0 then
    break
  end
end
local left = redis.call('ZRANGE', ctx.keyIndex, ARGV[10], ARGV[11], 'BYLEX', 'LIMIT', 0, 1)
return entry_finish({ST.OK, deleted, #left > 0 and 1 or 0})
