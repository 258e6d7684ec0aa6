--[[
  Retag one entry (state::update-topic): value, version and updated_at stay as they are.
  Input:
    @arguments entry (lua/includes/entry.lua), then
    ARGV[8] topic: "-" clears, "=" .. topic sets
  Output:
    {ST.OK, 1 when the key exists (retagged or already so), 0 when missing}
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
  Events: state:updated with old_value = new_value and the same version, when the topic
    changed; an expired entry in the way is deleted with state:deleted.
]]
--- @include "entry"

local dup, ctx, cur = entry_begin()
if dup then
  return dup
end
if not cur then
  return entry_finish({ST.OK, 0})
end
local newTopic = ARGV[8] ~= '-' and string.sub(ARGV[8], 2) or false
if newTopic == cur[5] then
  return entry_finish({ST.OK, 1})
end
entry_retopic(ctx, cur[5], newTopic)
local rev = entry_emit(ctx, 'state:updated', cur[1], cur[1], string.format('%d', cur[2]))
redis.call('SET', ctx.entry, packed_retag(cur, newTopic, rev))
return entry_finish({ST.OK, 1})
