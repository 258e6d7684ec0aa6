--[[
  Delete one batch of the entries of a scope whose key starts with a byte prefix
  (state::delete-by-prefix): at most ARGV[7] members of the scope's key index, in key order,
  from the first with the prefix. An entry whose expiry has passed is deleted with the
  reaper's event (by ""), not counted. The caller calls again while `more`.
  Input:
    KEYS[1] scope key index     KEYS[2] scope updated index   KEYS[3] scope topic index
    KEYS[4] partition scopes    KEYS[5] partition ttl         KEYS[6] partition event stream
    ARGV[1] scope               ARGV[2] now (epoch ms)        ARGV[3] event stream MAXLEN
    ARGV[4] writer ("" for none)
    ARGV[5] lex range start ("[" .. prefix)
    ARGV[6] lex range end ("(" .. prefix .. "\255": no UTF-8 key holds the byte 255)
    ARGV[7] most index members to examine (the call's limit)
    ARGV[8] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[9] ttl member prefix of the scope (<len>:<scope>)
  Output:
    {ST.OK, number deleted, 1 when keys with the prefix remain else 0}
  Events: state:deleted for each entry deleted (and for each expired one, the reaper's).
]]
--- @include "entry"

local members = redis.call('ZRANGE', KEYS[1], ARGV[5], ARGV[6], 'BYLEX', 'LIMIT', 0,
  tonumber(ARGV[7]))
local deleted = 0
local ctx = entry_scope_ctx(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[1],
  ARGV[2], ARGV[3], ARGV[4])
for _, key in ipairs(members) do
  entry_at(ctx, ARGV[8], ARGV[9], key)
  local cur = entry_load_live(ctx)
  if cur then
    entry_unlink(ctx, cur)
    entry_emit(ctx, 'state:deleted', cur[1], 'null', cur[2])
    deleted = deleted + 1
  end
end
local left = redis.call('ZRANGE', KEYS[1], ARGV[5], ARGV[6], 'BYLEX', 'LIMIT', 0, 1)
return {ST.OK, deleted, #left > 0 and 1 or 0}
