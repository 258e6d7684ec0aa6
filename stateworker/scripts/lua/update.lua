--[[
  Apply update ops to one entry's JSON document (state::update), exactly: numbers keep their
  text, [] and {} stay apart, key order is kept; integers add exactly over 64 bits.
  Ops arrive validated (paths, limits, merge values: Python reports those errors and leaves
  the op out); this script reports the errors that depend on the document.
  Input:
    KEYS[1..7] as set.lua: entry, key index, updated index, topic index, scopes, ttl, events
    KEYS[8] (bus calls only) the current slice of the call's records; ARGV[7] its
            arguments (entry.lua)
    KEYS[9] (bus calls, snapshot on) the partition's records to save (entry.lua)
    ARGV[1] scope    ARGV[2] key    ARGV[3] ttl member    ARGV[4] now (epoch ms)
    ARGV[5] event stream MAXLEN     ARGV[6] writer ("" for none)
    ARGV[8] max value bytes         ARGV[9] expected version ("" for none)
    ARGV[10] topic: "~" keep | "-" clear | "=" .. topic
    ARGV[11] ttl ms: "" keep the current expiry, else a new expiry from now
    ARGV[12] "1" when no string in any op value holds a bracket or brace
    ARGV[13] number of ops, then 3 ARGV per op:
      type (set remove increment decrement merge append append_array);
      path ("" = root, else escaped JSON string tokens joined by "\0");
      value (compact JSON; increment/decrement: the signed integer to add)
    ARGV[14 + 3 * number of ops] max live keys of the scope when this call creates the key
      ("" for no limit)
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
    {ST.CONFLICT, current version (0 = absent), current value or false}
    {ST.VALUE_TOO_LARGE, size in bytes of the new value}
    {ST.KEY_LIMIT, live keys, limit}   the key is new and the scope holds max live keys
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
  Events: state:created or state:updated when written (the key was missing or an op
    applied); an expired entry in the way is first deleted with state:deleted.
]]
--- @include "entry"
--- @include "json"
--- @include "numbers"
--- @include "text"

--[[
  The op engine, made once (at FUNCTION LOAD) by the function below: its helpers and the
  running call's state are that function's locals, and apply_ops, all it returns, runs a
  call's ops. As a function's locals they do not count against the chunk's 200 (Lua 5.1's
  limit of locals per function; the library is one chunk, so every top-level local of every
  include and script block counts there).
  The call's state is kept in locals (upvalues of the helpers), not gathered in one table:
  the helpers read and write it on every op, and a table field costs more than an upvalue
  (doc, fresh and errors as fields of one table made the benchmark's 3-op update about 2%
  slower inside Redis). apply_ops sets all of it first and drops the call's values before it
  returns, so nothing of a call stays referenced after it.
]]
local apply_ops = (function()
  -- The running call's state, set by apply's first lines and dropped by its last ones (the
  -- library outlives the call): the document (raw text, a scalar, or an opened object),
  -- whether the key is still missing with no op applied, the op errors found (nil: none yet),
  -- and how many ops edited the raw text.
  local doc, fresh, errors, raw_edits

  -- Returned for "no op errors": the reply only reads it.
  local NO_ERRORS = {}

  local function fail(index, code, detail)
    errors = errors or {}
    errors[#errors + 1] = index
    errors[#errors + 1] = code
    errors[#errors + 1] = detail or ''
    return false
  end

  local function split(path)
    if path == '' then return {} end
    return text_split(path, '\0')
  end

  -- The object at `node`'s field `seg`, created (or replacing a non-object) when needed.
  local function child_object(node, seg)
    local child = json_field(node, seg)
    local obj = child and json_as_object(child)
    if not obj then
      obj = json_new_object()
    end
    json_put(node, seg, obj)
    return obj
  end

  -- First-level edits of a raw object document are kept aside and written in one splice by
  -- flush(): a Lua string costs its length to create (Redis hashes every byte), so splicing
  -- per op would copy the document once per op. Edit i changes the value at EDIT_VS[i] ..
  -- EDIT_VE[i] of the text to EDIT_VAL[i]; EDIT_AT[key] = i. ORDER[1 .. nspans] lists the
  -- in-place edits in document order; a field that the document did not have (EDIT_VS false)
  -- is in ADDED[1 .. nadded] instead (new fields go last, in the order they came). Library
  -- tables, reused by every call (every table a call makes is garbage to collect); apply's
  -- first lines clear what the last call left. Only set and increment/decrement record edits;
  -- anything else flushes first. Past these bounds the root object is opened once and later
  -- ops are table updates, so an update's work stays O(size + ops).
  local RAW_EDIT_MAX_BYTES = 16384
  local RAW_EDIT_MAX_OPS = 16
  local EDIT_KEY, EDIT_VS, EDIT_VE, EDIT_VAL, EDIT_AT = {}, {}, {}, {}, {}
  local ORDER, ADDED, OUT = {}, {}, {}
  local nedits, nspans, nadded = 0, 0, 0

  local function clear_edits()
    for i = 1, nedits do -- (no value stays referenced: the library outlives the call)
      EDIT_AT[EDIT_KEY[i]] = nil
      EDIT_KEY[i], EDIT_VAL[i] = nil, nil
    end
    nedits, nspans, nadded = 0, 0, 0
  end

  local function flush()
    if nedits == 0 then return end
    local n, p = 0, 1
    for k = 1, nspans do
      local i = ORDER[k]
      OUT[n + 1], OUT[n + 2] = string.sub(doc, p, EDIT_VS[i] - 1), EDIT_VAL[i]
      n = n + 2
      p = EDIT_VE[i] + 1
    end
    if nadded == 0 then
      n = n + 1
      OUT[n] = string.sub(doc, p)
    else
      n = n + 1
      OUT[n] = string.sub(doc, p, -2) -- up to the closing '}'
      local sep = #doc > 2 and ',' or '' -- '{}' is the only object without fields
      for k = 1, nadded do
        local i = ADDED[k]
        OUT[n + 1], OUT[n + 2], OUT[n + 3], OUT[n + 4] = sep, EDIT_KEY[i], ':', EDIT_VAL[i]
        n = n + 4
        sep = ','
      end
      n = n + 1
      OUT[n] = '}'
    end
    doc = table.concat(OUT, '', 1, n)
    for k = 1, n do
      OUT[k] = nil
    end
    clear_edits()
  end

  -- Field `key` of the raw document: its pending edit's index, else its value span (nil, nil
  -- when absent).
  local function raw_locate(key)
    local i = EDIT_AT[key]
    if i then return i end
    local _, vs, ve = json_find(doc, key)
    return nil, vs, ve
  end

  local function raw_set(key, value, e, vs, ve)
    if e then
      EDIT_VAL[e] = value
      return
    end
    nedits = nedits + 1
    local i = nedits
    EDIT_KEY[i], EDIT_VS[i], EDIT_VE[i], EDIT_VAL[i] = key, vs or false, ve or false, value
    EDIT_AT[key] = i
    if not vs then
      nadded = nadded + 1
      ADDED[nadded] = i
      return
    end
    local k = nspans -- insert in document order (few edits: at most RAW_EDIT_MAX_OPS)
    while k > 0 and EDIT_VS[ORDER[k]] > vs do
      ORDER[k + 1] = ORDER[k]
      k = k - 1
    end
    ORDER[k + 1] = i
    nspans = nspans + 1
  end

  -- The whole document replaced (a root op): pending edits no longer apply.
  local function replace_doc(value)
    doc = value
    clear_edits()
  end

  local function root_object()
    flush()
    local obj = json_as_object(doc)
    if obj then doc = obj end
    return obj
  end

  -- True when this first-level op may edit the document's raw text (small, few ops so far);
  -- otherwise the root object is opened, once. Callers have checked that doc is an object.
  local function stay_raw()
    if type(doc) ~= 'string' then
      return false
    end
    raw_edits = raw_edits + 1
    if #doc <= RAW_EDIT_MAX_BYTES and raw_edits <= RAW_EDIT_MAX_OPS then
      return true
    end
    root_object()
    return false
  end

  local function op_set(index, path, value)
    if path == '' then
      replace_doc(value)
      return true
    end
    if json_type(doc) ~= 'object' then
      return fail(index, 'set.target_not_object', json_type(doc))
    end
    if stay_raw() then
      raw_set(path, value, raw_locate(path))
    else
      json_put(doc, path, value)
    end
    return true
  end

  local function op_remove(index, path)
    if path == '' then
      replace_doc('null')
      return true
    end
    if json_type(doc) ~= 'object' then
      return fail(index, 'remove.target_not_object', json_type(doc))
    end
    if stay_raw() then
      flush()
      doc = json_raw_remove(doc, path)
    else
      json_remove(doc, path)
    end
    return true
  end

  local function out_of_range(index, name)
    return fail(index, name .. '.out_of_range')
  end

  local function op_add(index, name, path, delta)
    if path == '' then
      if not fresh and json_type(doc) ~= 'number' then
        return fail(index, name .. '.not_number', json_type(doc))
      end
      local result
      if fresh then -- a missing key counts as 0
        result = num_add_int('0', delta)
      else
        result = num_add(doc, delta)
      end
      if not result then return out_of_range(index, name) end
      replace_doc(result)
      return true
    end
    if json_type(doc) ~= 'object' then
      return fail(index, name .. '.target_not_object', json_type(doc))
    end
    local raw, current, e, vs, ve = stay_raw(), nil, nil, nil, nil
    if raw then
      e, vs, ve = raw_locate(path)
      if e then
        current = EDIT_VAL[e]
      elseif vs then
        current = string.sub(doc, vs, ve)
      end
    else
      current = json_field(doc, path)
    end
    local result
    if current == nil then
      result = num_add_int('0', delta)
    elseif json_type(current) == 'number' then
      result = num_add(current, delta)
    else
      return fail(index, name .. '.not_number', json_type(current))
    end
    if not result then return out_of_range(index, name) end
    if raw then
      raw_set(path, result, e, vs, ve)
    else
      json_put(doc, path, result)
    end
    return true
  end

  -- Returns true, or false after reporting a root that is not an object.
  local function op_merge(index, path, value)
    local source = json_open(value)
    local target
    if path == '' then
      target = root_object()
      if not target then
        return fail(index, 'merge.target_not_object', json_type(doc))
      end
    else
      target = root_object()
      if not target then
        target = json_new_object()
        doc = target
      end
      for _, seg in ipairs(split(path)) do
        target = child_object(target, seg)
      end
    end
    for _, key in ipairs(source.keys) do
      json_put(target, key, json_field(source, key))
    end
    return true
  end

  local function first_append(value)
    if json_type(value) == 'string' then return value end
    return '[' .. value .. ']'
  end

  -- The target with `value` appended, or nil after reporting why not.
  local function append_to(index, target, value)
    local kind = json_type(target)
    if kind == 'null' then
      return first_append(value)
    end
    if kind == 'string' then
      if json_type(value) ~= 'string' then
        fail(index, 'append.value_not_string', json_type(value))
        return nil
      end
      return json_string_append(target, value)
    end
    if kind == 'array' then
      if type(target) ~= 'table' and #target <= RAW_EDIT_MAX_BYTES then
        -- small and still raw text: push without parsing the items
        if target == '[]' then return '[' .. value .. ']' end
        return string.sub(target, 1, -2) .. ',' .. value .. ']'
      end
      local arr = json_as_array(target)
      arr.items[#arr.items + 1] = value
      return arr
    end
    fail(index, 'append.type_mismatch', kind)
    return nil
  end

  local function op_append(index, path, value, array_form)
    if path == '' then
      local result = append_to(index, fresh and 'null' or doc, value)
      if result == nil then return false end
      replace_doc(result)
      return true
    end
    local obj = root_object()
    if not obj then
      return fail(index, 'append.target_not_object', json_type(doc))
    end
    local segments = split(path)
    local leaf = table.remove(segments)
    for _, seg in ipairs(segments) do
      obj = child_object(obj, seg)
    end
    local current = json_field(obj, leaf)
    if current == nil or json_type(current) == 'null' then
      json_put(obj, leaf, (array_form or #segments > 0) and '[' .. value .. ']'
        or first_append(value))
      return true
    end
    local result = append_to(index, current, value)
    if result == nil then return false end
    json_put(obj, leaf, result)
    return true
  end

  --[[
    Apply the call's ops (ARGV[13] and after) to `document`, the entry's JSON text ('{}' when
    `missing`: the key has no entry). Returns the new value's text, or nil when no op applied
    to an existing entry (nothing to write), and the op errors ({op position, code, detail,
    ...}, NO_ERRORS for none).
  ]]
  local function apply(document, missing)
    doc, fresh, errors, raw_edits = document, missing, nil, 0
    clear_edits()
    local applied = false
    local nops = tonumber(ARGV[13])
    for index = 0, nops - 1 do -- (an op is named by its position here: see Output)
      local base = 14 + index * 3
      local kind, path, value = ARGV[base], ARGV[base + 1], ARGV[base + 2]
      local ok
      if kind == 'set' then
        ok = op_set(index, path, value)
      elseif kind == 'increment' or kind == 'decrement' then
        ok = op_add(index, kind, path, value)
      elseif kind == 'remove' then
        ok = op_remove(index, path)
      elseif kind == 'merge' then
        ok = op_merge(index, path, value)
      else
        ok = op_append(index, path, value, kind == 'append_array')
      end
      if ok then
        applied = true
        fresh = false
      end
    end
    local found = errors or NO_ERRORS
    errors = nil -- (the library outlives the call: hold none of its values)
    if not applied and not missing then
      doc = nil
      return nil, found
    end
    flush()
    local new = json_encode(doc)
    doc = nil
    return new, found
  end

  return apply
end)()

--- @per-call
local dup, ctx, cur = entry_begin()
if dup then
  return dup
end

if ARGV[9] ~= '' and (cur and tonumber(cur[2]) or 0) ~= tonumber(ARGV[9]) then
  return entry_finish({ST.CONFLICT, cur and tonumber(cur[2]) or 0, cur and cur[1] or false})
end

local full = entry_key_limit(ctx, cur, ARGV[14 + tonumber(ARGV[13]) * 3])
if full then
  return entry_finish(full)
end

local plain = (cur == nil or cur[6] == '1') and ARGV[12] == '1'
JSON_NO_BRACKETS_IN_STRINGS = plain
local new, errors = apply_ops(cur and cur[1] or '{}', cur == nil)
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
return entry_finish({ST.OK, old, new, version, cur and 0 or 1, 1, errors, 1})
