--[[
  Delete one batch of the entries of a scope whose topic matches a `*` pattern
  (state::delete-by-topic). Untagged entries never match (the topic index holds tagged ones). The caller repeats with the
  returned cursor until it is false, so each call is atomic and bounded.
  Input:
    KEYS[1] scope topic index   KEYS[2] scope key index   KEYS[3] scope updated index
    KEYS[4] partition scopes    KEYS[5] partition ttl     KEYS[6] partition event stream
    ARGV[1] scope               ARGV[2] now (epoch ms)    ARGV[3] event stream MAXLEN
    ARGV[4] writer ("" for none; and a traced call's traceparent: entry.lua, entry_writer)
    ARGV[5] topic pattern       ARGV[6] lex range start ("[<literal prefix>" or "(<cursor>")
    ARGV[7] lex range end       ARGV[8] most index members to examine
    ARGV[9] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[10] ttl member prefix of the scope (<len>:<scope>)
    ARGV[11] the batch's budget: bytes of the values it deletes (max_call_bytes; they go into
             the events): once passed, the batch ends there (its cursor: the last member seen)
  Output:
    {ST.OK, number deleted, cursor (last member examined) or false when the range is done}
    {ST.STORE_LOST}   the partition's generation marker is gone (generation.lua); nothing written
  Events: state:deleted for each entry deleted.
]]
--- @include "entry"
--- @include "glob"

if generation_lost(string.sub(KEYS[4], 1, -7)) then
  return {ST.STORE_LOST}
end

local parts = glob_parts(ARGV[5])
local examine = tonumber(ARGV[8])
local members = redis.call('ZRANGE', KEYS[1], ARGV[6], ARGV[7], 'BYLEX', 'LIMIT', 0, examine)
local deleted, budget = 0, tonumber(ARGV[11])
local ctx = entry_scope_ctx(KEYS[2], KEYS[3], KEYS[1], KEYS[4], KEYS[5], KEYS[6], ARGV[1],
  ARGV[2], ARGV[3], ARGV[4])
local cursor = #members == examine and members[#members] or false
for _, m in ipairs(members) do
  local z = string.find(m, '\0', 1, true)
  local topic, key = string.sub(m, 1, z - 1), string.sub(m, z + 1)
  if glob_match(topic, parts) then
    deleted = deleted + entry_delete_key(ctx, ARGV[9], ARGV[10], key)
    budget = budget - ctx.dropped
    if budget <= 0 then
      cursor = m
      break
    end
  end
end
return {ST.OK, deleted, cursor}
