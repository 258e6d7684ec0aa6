--[[
  Delete one entry (state::delete).
  Input:
    KEYS[1] entry hash              KEYS[2] scope key index (zset)
    KEYS[3] partition scopes (zset) KEYS[4] partition ttl index (zset)
    KEYS[5] partition event stream
    ARGV[1] scope                   ARGV[2] key
    ARGV[3] now (epoch ms)          ARGV[4] writer: "" for none, else "=" .. writer
    ARGV[5] event stream MAXLEN     ARGV[6] ttl member (<len>:<scope><key>)
  Output:
    {ST.OK, deleted value or false, revision or false}
  Events: state:deleted when something was deleted (also for an entry found expired).
]]
--- @include "entry"

local ctx = {
  entry = KEYS[1], keyIndex = KEYS[2], scopes = KEYS[3], ttl = KEYS[4], events = KEYS[5],
  scope = ARGV[1], key = ARGV[2], member = ARGV[6],
  now = tonumber(ARGV[3]), maxlen = ARGV[5], by = string.sub(ARGV[4], 2),
}

local cur = load_live(ctx)
if not cur then
  return {ST.OK, false, false}
end
unlink(ctx)
local rev = emit(ctx, 'state:deleted', cur[1], 'null', cur[2])
return {ST.OK, cur[1], rev}
