--[[
  Delete one entry (state::delete).
  Input:
    KEYS[1..7] as set.lua: entry, key index, updated index, topic index, scopes, ttl, events
    ARGV[1] scope                   ARGV[2] key
    ARGV[3] ttl member              ARGV[4] now (epoch ms)
    ARGV[5] event stream MAXLEN     ARGV[6] writer ("" for none)
  Output:
    {ST.OK, deleted value or false, revision or false}
  Events: state:deleted when something was deleted (also for an entry found expired).
]]
--- @include "entry"

local ctx = entry_ctx(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local cur = load_live(ctx)
if not cur then
  return {ST.OK, false, false}
end
unlink(ctx, cur)
local rev = emit(ctx, 'state:deleted', cur[1], 'null', cur[2])
return {ST.OK, cur[1], rev}
