--[[
  The update op engine (state::update's ops, and a transaction's update ops): `apply_ops(
  document, missing, first)` applies the ops whose count is ARGV[first] (then 3 ARGV per op:
  kind, path, value; update.lua's header) to a document and returns its new text and the op
  errors. It writes nothing: the caller writes the result.
]]
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
    Apply the call's ops (ARGV[first]: their number, then 3 ARGV per op) to `document`, the entry's JSON text ('{}' when
    `missing`: the key has no entry). Returns the new value's text, or nil when no op applied
    to an existing entry (nothing to write), and the op errors ({op position, code, detail,
    ...}, NO_ERRORS for none).
  ]]
  local function apply(document, missing, first)
    doc, fresh, errors, raw_edits = document, missing, nil, 0
    clear_edits()
    local applied = false
    local nops = tonumber(ARGV[first])
    for index = 0, nops - 1 do -- (an op is named by its position here: see Output)
      local base = first + 1 + index * 3
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
