--[[
  A lazy, exact JSON codec for compact JSON (what the store writes: no whitespace, strings
  escaped as msgspec writes them). Redis's cjson loses [] vs {}, big integers and number text;
  this codec never converts anything:
  - a scalar is its JSON text: '"a\\n"', '1.2300', 'true', 'null' (a Lua string);
  - a container that nobody opened is its raw JSON text too (a Lua string starting { or [);
  - an opened object is {keys = {rawKey or false, ...}, pos = {rawKey = index in keys},
    vals = {rawKey = node or true}, src, ks, ve} (`true`: the field is untouched, its value
    is still in `src`, read it with json_field; `false` in keys: a removed field);
  - a string that appends made longer is a rope {s = {'"start', 'more', ...}} (its text is
    the parts joined and a closing quote), so repeated appends do not copy it each time;
  - an opened array is {items = {node, ...}}.
  Keys stay in their escaped, quoted form ('"name"'); callers compare them with segments
  that Python escaped the same way. Only the containers a path walks into are parsed.

  Skipping over a nested container is the hot part. When the caller knows that no string of
  the document holds a bracket or brace (entry field `s`, computed by Python), the container's
  end is found in C with Lua's balanced-match pattern %b{} / %b[]; otherwise every string
  inside is skipped one by one.
]]

-- Library state (it outlives a call): every call that uses the codec sets it first.
local JSON_NO_BRACKETS_IN_STRINGS = false

-- Index of the last byte of the JSON string that starts at `pos` (a '"').
local function json_skip_string(s, pos)
  local p = pos + 1
  while true do
    local q = string.find(s, '"', p, true)
    if not q then
      error('unterminated JSON string at ' .. pos)
    end
    -- the quote ends the string unless an odd number of backslashes precede it
    local b = q - 1
    while string.byte(s, b) == 92 do
      b = b - 1
    end
    if (q - 1 - b) % 2 == 0 then
      return q
    end
    p = q + 1
  end
end

-- Index of the last byte of the JSON value that starts at `pos`.
local function json_skip(s, pos)
  local c = string.byte(s, pos)
  if c == 34 then
    return json_skip_string(s, pos)
  end
  if c == 123 or c == 91 then -- { or [
    if JSON_NO_BRACKETS_IN_STRINGS then
      local _, e = string.find(s, c == 123 and '^%b{}' or '^%b[]', pos)
      return e
    end
    local depth, p = 0, pos
    while true do
      local q = string.find(s, '[%[%]{}"]', p)
      if not q then
        error('unterminated JSON container at ' .. pos)
      end
      local b = string.byte(s, q)
      if b == 34 then
        p = json_skip_string(s, q) + 1
      else
        if b == 123 or b == 91 then
          depth = depth + 1
        else
          depth = depth - 1
          if depth == 0 then
            return q
          end
        end
        p = q + 1
      end
    end
  end
  local _, e = string.find(s, '^[^,%]}]+', pos)
  return e
end

local function json_new_object()
  return {keys = {}, pos = {}, vals = {}}
end

-- Parse one level of a raw container. An object keeps its source text: each field's value
-- is `true` ("untouched: still the slice of src") until json_put replaces it, and the
-- encoder writes runs of untouched fields as single slices of the source.
local function json_open(raw)
  local first = string.byte(raw, 1)
  local n = #raw
  if first == 123 then
    local node = {keys = {}, pos = {}, vals = {}, src = raw, ks = {}, ve = {}}
    local p = 2
    while p < n do
      local kend = json_skip_string(raw, p)
      local key = string.sub(raw, p, kend)
      local vend = json_skip(raw, kend + 2)
      if node.vals[key] == nil then
        node.keys[#node.keys + 1] = key
        node.pos[key] = #node.keys
      end
      node.vals[key], node.ks[key], node.ve[key] = true, p, vend
      p = vend + 2 -- past the ',' (or onto the closing '}')
    end
    return node
  end
  local node = {items = {}}
  local p = 2
  while p < n do
    local vend = json_skip(raw, p)
    node.items[#node.items + 1] = string.sub(raw, p, vend)
    p = vend + 2
  end
  return node
end

-- The field that starts at `p` in a raw object: the last byte of its key and of its value.
-- The common cases take one match each: a key without escapes, a number, true, false or null
-- (up to the ',' or '}' after it), a string without escapes; the rest are walked.
local function json_field_at(raw, p)
  local _, kend = string.find(raw, '^"[^"\\]*"', p)
  if not kend then
    kend = json_skip_string(raw, p)
  end
  local vs = kend + 2
  local _, vend = string.find(raw, '^[^"{%[,}][^,}]*', vs)
  if vend then
    return kend, vend
  end
  if string.byte(raw, vs) == 34 then
    _, vend = string.find(raw, '^"[^"\\]*"', vs)
    return kend, vend or json_skip_string(raw, vs)
  end
  return kend, json_skip(raw, vs)
end

-- In a raw object, field `key`'s key start, value start and value end; nil when absent.
-- Only the fields before it are walked, and nothing is copied.
local function json_find(raw, key)
  local n, klen = #raw, #key
  local p = 2
  while p < n do
    local kend, vend = json_field_at(raw, p)
    if kend - p + 1 == klen and string.sub(raw, p, kend) == key then
      return p, kend + 2, vend
    end
    p = vend + 2
  end
  return nil
end

-- A raw object without field `key`.
local function json_raw_remove(raw, key)
  local ks, _, ve = json_find(raw, key)
  if not ks then
    return raw
  end
  if string.byte(raw, ve + 1) == 44 then -- a ',' follows: drop it with the field
    return string.sub(raw, 1, ks - 1) .. string.sub(raw, ve + 2)
  end
  if string.byte(raw, ks - 1) == 44 then -- the last field: drop the ',' before it
    return string.sub(raw, 1, ks - 2) .. string.sub(raw, ve + 1)
  end
  return '{}'
end

-- The value of an object's field (a node), or nil when absent.
local function json_field(obj, key)
  local v = obj.vals[key]
  if v == true then
    return string.sub(obj.src, obj.ks[key] + #key + 1, obj.ve[key])
  end
  return v
end

local function json_type(node)
  if type(node) == 'table' then
    if node.keys then return 'object' end
    return node.items and 'array' or 'string'
  end
  local c = string.byte(node, 1)
  if c == 123 then return 'object' end
  if c == 91 then return 'array' end
  if c == 34 then return 'string' end
  if c == 116 or c == 102 then return 'boolean' end
  if c == 110 then return 'null' end
  return 'number'
end

-- The opened object behind `node`, or nil when it is not an object.
local function json_as_object(node)
  if type(node) == 'table' then
    return node.keys and node or nil
  end
  if string.byte(node, 1) == 123 then
    return json_open(node)
  end
  return nil
end

local function json_as_array(node)
  if type(node) == 'table' then
    return node.items and node or nil
  end
  if string.byte(node, 1) == 91 then
    return json_open(node)
  end
  return nil
end

local function json_encode_into(node, out)
  if type(node) ~= 'table' then
    out[#out + 1] = node
  elseif node.keys then
    out[#out + 1] = '{'
    local first, runStart, runEnd = true, nil, nil
    local function item(text)
      if not first then out[#out + 1] = ',' end
      first = false
      out[#out + 1] = text
    end
    for i = 1, #node.keys do
      local key = node.keys[i]
      local v = key and node.vals[key]
      if not key then
        -- a removed field: it breaks any run of untouched ones
        if runEnd then
          item(string.sub(node.src, runStart, runEnd))
          runEnd = nil
        end
      elseif v == true then
        local ks, ve = node.ks[key], node.ve[key]
        if runEnd and ks == runEnd + 2 then
          runEnd = ve
        else
          if runEnd then item(string.sub(node.src, runStart, runEnd)) end
          runStart, runEnd = ks, ve
        end
      else
        if runEnd then
          item(string.sub(node.src, runStart, runEnd))
          runEnd = nil
        end
        item(key)
        out[#out + 1] = ':'
        json_encode_into(v, out)
      end
    end
    if runEnd then item(string.sub(node.src, runStart, runEnd)) end
    out[#out + 1] = '}'
  elseif node.s then
    for _, part in ipairs(node.s) do
      out[#out + 1] = part
    end
    out[#out + 1] = '"'
  else
    out[#out + 1] = '['
    for i, item in ipairs(node.items) do
      if i > 1 then out[#out + 1] = ',' end
      json_encode_into(item, out)
    end
    out[#out + 1] = ']'
  end
end

local function json_encode(node)
  if type(node) ~= 'table' then
    return node
  end
  local out = {}
  json_encode_into(node, out)
  return table.concat(out)
end

-- Object field assignment keeping order: an existing key stays in place, a new one goes last.
local function json_put(obj, key, value)
  if obj.vals[key] == nil then
    obj.keys[#obj.keys + 1] = key
    obj.pos[key] = #obj.keys
  end
  obj.vals[key] = value
end

-- O(1): the key's place in the order becomes a tombstone.
local function json_remove(obj, key)
  if obj.vals[key] == nil then
    return
  end
  obj.vals[key] = nil
  obj.keys[obj.pos[key]] = false
  obj.pos[key] = nil
end

-- `target` (a JSON string: raw text or a rope) with the string `value` appended.
local function json_string_append(target, value)
  local more = string.sub(value, 2, -2)
  if type(target) == 'table' then
    target.s[#target.s + 1] = more
    return target
  end
  return {s = {string.sub(target, 1, -2), more}}
end
