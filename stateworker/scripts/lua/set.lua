#!lua flags=allow-cross-slot-keys
--[[
  Write one entry's value: state::set, state::compare-and-set (a hash condition) and
  state::diff (skip when unchanged). Sizes, names and types are checked by the caller; the
  condition is checked here before the first write.
  Input:
    @arguments entry (lua/includes/entry.lua), then
    ARGV[8] value (compact JSON)
    ARGV[9] value hash
    ARGV[10] topic: "~" keep the current one | "-" none | "=" .. topic
    ARGV[11] ttl in ms: "0" for no expiry, "" to keep the current expiry
    ARGV[12] condition: "" none | "v<N>" stored version must be N (0 = absent; -1 never holds)
             | "h<hash>" stored value's hash must be <hash> | "a" absent or a stored null
    ARGV[13] "1": diff mode, write nothing when the stored hash equals ARGV[9]
    ARGV[14] "1" when no string in the value holds a bracket or brace
    ARGV[15] max live keys of the scope when this write creates a key ("" for no limit)
    @arguments answer, last when ARGV[7] says so (state::set over the bus, where the reply
             list shares the node): the call is answered here (entry.lua, entry_answer)
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua: the partition's
                      marker is gone); nothing written, nothing recorded
    {ST.OK, old value or false, version, created (1/0), revision}
    {ST.CONFLICT, current version (0 = absent), current value or false}
    {ST.UNCHANGED, current version, current value}    diff mode, same hash
    {ST.KEY_LIMIT, live keys, limit}   the key is new and the scope holds max live keys
    {ST.NEEDS_HASH, current version, current value}   the stored hash is unknown (after an
                                                       update): the caller stores it, retries
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
    {ST.ANSWERED}    (answering) written, and the call's reply LPUSHed, its entry acked
    {ST.UNHEARD, result}  (answering by PUBLISH) written; no one heard the reply
  Every reply but NEEDS_HASH is recorded in KEYS[8] when given (CALL_ID_REUSED: entry.lua).
  Events: state:created when absent, else state:updated; an expired entry in the way is
    first deleted with state:deleted.
]]
--- @include "entry"

local dup, ctx, cur = entry_begin()
if dup then
  return dup
end
local value, hash, cond = ARGV[8], ARGV[9], ARGV[12]


if cur and not cur[4] and (ARGV[13] == '1' or string.sub(cond, 1, 1) == 'h') then
  return {ST.NEEDS_HASH, tonumber(cur[2]), cur[1]}
end

if cond ~= '' then
  local kind, want = string.sub(cond, 1, 1), string.sub(cond, 2)
  local ok
  if kind == 'v' then
    ok = entry_version(cur) == tonumber(want)
  elseif kind == 'h' then
    ok = cur ~= nil and packed_hex(cur[4]) == want
  else
    ok = cur == nil or cur[1] == 'null'
  end
  if not ok then
    return entry_conflict(cur)
  end
end

if ARGV[13] == '1' and cur and packed_hex(cur[4]) == hash then
  return entry_finish({ST.UNCHANGED, tonumber(cur[2]), cur[1]})
end

local full = entry_key_limit(ctx, cur, ARGV[15])
if full then
  return entry_finish(full)
end

local version, rev = entry_write(ctx, cur, value, hash, ARGV[10],
  tonumber(ARGV[11]) or false, ARGV[14] == '1')
local reply = entry_finish({ST.OK, cur and cur[1] or false, version, cur and 0 or 1, rev})
if entry_ctx.answer then -- state::set's result (schemas.SetResult), as the service writes it
  return entry_answer('{"old_value":' .. (cur and cur[1] or 'null') .. ',"new_value":' ..
    value .. ',"version":' .. string.format('%d', version) .. ',"hash":"' .. hash ..
    '","created":' .. (cur and 'false' or 'true') .. '}')
end
return reply
