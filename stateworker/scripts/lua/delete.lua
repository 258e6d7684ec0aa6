--[[
  Delete one entry (state::delete).
  Input:
    KEYS[1..7] as set.lua: entry, key index, updated index, topic index, scopes, ttl, events
    KEYS[8] (bus calls only) the current slice of the call's records; ARGV[7] its
            arguments (entry.lua)
    KEYS[9] (bus calls, snapshot on) the partition's records to save (entry.lua)
    ARGV[1] scope                   ARGV[2] key
    ARGV[3] ttl member              ARGV[4] now (epoch ms)
    ARGV[5] event stream MAXLEN     ARGV[6] writer ("" for none)
  Output:
    {ST.OK, deleted value or false, revision or false}
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
  Events: state:deleted when something was deleted (also for an entry found expired).
]]
--- @include "entry"

local dup, ctx, cur = entry_begin()
if dup then
  return dup
end
if not cur then
  return entry_finish({ST.OK, false, false})
end
entry_unlink(ctx, cur)
local rev = entry_emit(ctx, 'state:deleted', cur[1], 'null', cur[2])
return entry_finish({ST.OK, cur[1], rev})
