#!lua flags=allow-cross-slot-keys
--[[
  Apply update ops to one entry's JSON document (state::update), exactly: numbers keep their
  text, [] and {} stay apart, key order is kept; integers add exactly over 64 bits.
  Ops arrive validated (paths, limits, merge values: Python reports those errors and leaves
  the op out); this script reports the errors that depend on the document.
  Input:
    @arguments entry (lua/includes/entry.lua), then
    ARGV[8] max value bytes         ARGV[9] expected version ("" for none)
    ARGV[10] topic: "~" keep | "-" clear | "=" .. topic
    ARGV[11] ttl ms: "" keep the current expiry, else a new expiry from now
    ARGV[12] "1" when no string in any op value holds a bracket or brace
    ARGV[13] number of ops
    ARGV[14..] 3 per op:
      type (set remove increment decrement merge append append_array);
      path ("" = root, else escaped JSON string tokens joined by "\0");
      value (compact JSON; increment/decrement: the signed integer to add);
      then, after the ops, max live keys of the scope when this call creates the key ("" for
      no limit)
    @arguments answer, last when ARGV[7] says so (state::update over the bus, where the
      reply list shares the node): a call whose every op applied is answered here
  Output:
    {ST.OK, old value or false, new value, version, created (1/0), written (1/0),
     {op position, code, detail, ...}, 1}
      An op error names the op by its position among the ops given here (0-based; Python
      maps it to the request's op index) and the JSON type its message names (ops.py writes
      the message). The last element, 1, marks this form: a reply recorded for a call by an
      older version (a retry within the dedupe window) has none, and its errors are
      {op index, code, message}.
      code 'append.value_not_string' is append.type_mismatch for a string target and a
      non-string value (the detail: the value's type).
    {ST.ANSWERED}    (answering, every op applied) written, the call's reply LPUSHed
    {ST.UNHEARD, result}  (answering by PUBLISH) written; no one heard the reply
      and its entry acknowledged
    {ST.CONFLICT, current version (0 = absent), current value or false}
    {ST.VALUE_TOO_LARGE, size in bytes of the new value}
    {ST.KEY_LIMIT, live keys, limit}   the key is new and the scope holds max live keys
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
  Events: state:created or state:updated when written (the key was missing or an op
    applied); an expired entry in the way is first deleted with state:deleted.
]]
--- @include "entry"
--- @include "ops"


--- @per-call
local dup, ctx, cur = entry_begin()
if dup then
  return dup
end

local conflict = entry_expect(cur, ARGV[9])
if conflict then
  return conflict
end

local full = entry_key_limit(ctx, cur, ARGV[14 + tonumber(ARGV[13]) * 3])
if full then
  return entry_finish(full)
end

local plain = (cur == nil or cur[6] == '1') and ARGV[12] == '1'
JSON_NO_BRACKETS_IN_STRINGS = plain
local new, errors = apply_ops(cur and cur[1] or '{}', cur == nil, 13)
local old = cur and cur[1] or false
if not new then
  return entry_finish({ST.OK, old, old, tonumber(cur[2]), 0, 0, errors, 1})
end
if #new > tonumber(ARGV[8]) then
  return entry_finish({ST.VALUE_TOO_LARGE, #new})
end

local ttl = false
if ARGV[11] ~= '' then
  ttl = tonumber(ARGV[11])
end
local version = entry_write(ctx, cur, new, false, ARGV[10], ttl, plain)
local reply = entry_finish({ST.OK, old, new, version, cur and 0 or 1, 1, errors, 1})
if entry_ctx.answer and #errors == 0 then -- state::update's result (schemas.UpdateResult)
  return entry_answer('{"old_value":' .. (old or 'null') .. ',"new_value":' .. new ..
    ',"version":' .. string.format('%d', version) .. '}')
end
return reply
