--[[
  Retag one entry (state::update-topic): value, version and updated_at stay as they are.
  Input:
    KEYS[1..7] as set.lua: entry, key index, updated index, topic index, scopes, ttl, events
    KEYS[8] (bus calls only) the current slice of the call's records; ARGV[7] its
            arguments (entry.lua)
    KEYS[9] (bus calls, snapshot on) the partition's records to save (entry.lua)
    ARGV[1] scope    ARGV[2] key    ARGV[3] ttl member    ARGV[4] now (epoch ms)
    ARGV[5] event stream MAXLEN     ARGV[6] writer ("" for none; and a traced call's
            traceparent: entry.lua, entry_writer)
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
