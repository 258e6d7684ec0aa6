#!lua flags=allow-cross-slot-keys
--[[
  Delete one entry (state::delete).
  Input:
    @arguments entry (lua/includes/entry.lua), then
    ARGV[8] expected version ("" for none; 1 or more: Python refuses 0)
    @arguments answer, last when ARGV[7] says so (state::delete over the bus, where the
             reply list shares the node): the call is answered here (entry_answer)
  Output:
    {ST.OK, deleted value or false, revision or false}
    {ST.CONFLICT, current version (0 = absent), current value or false}   the entry is
                              not at the expected version: nothing deleted, no event
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
    {ST.ANSWERED}    (answering) done, the call's reply (the deleted value or null)
    {ST.UNHEARD, result}  (answering by PUBLISH) done; no one heard the reply
                     LPUSHed and its entry acknowledged
  Events: state:deleted when something was deleted (also for an entry found expired).
]]
--- @include "entry"

local dup, ctx, cur = entry_begin()
if dup then
  return dup
end
local conflict = entry_expect(cur, ARGV[8])
if conflict then
  return conflict
end
local reply
if not cur then
  reply = entry_finish({ST.OK, false, false})
else
  reply = entry_finish({ST.OK, cur[1], entry_delete(ctx, cur)})
end
if entry_ctx.answer then -- state::delete's result: the deleted value, as stored
  return entry_answer(cur and cur[1] or 'null')
end
return reply
