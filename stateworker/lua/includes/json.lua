--[[
  A lazy, exact JSON codec for compact JSON (what the store writes: no whitespace, strings
  escaped as msgspec writes them). Redis's cjson loses [] vs {}, big integers and number text;
  this codec never converts anything:
  - a scalar is its JSON text: '"a\\n"', '1.2300', 'true', 'null' (a Lua string);
  - a container that nobody opened is its raw JSON text too (a Lua string starting { or [);
  - an opened object is {keys = {rawKey, ...}, vals = {rawKey = node}} (order kept);
  - an opened array is {items = {node, ...}}.
  Keys stay in their escaped, quoted form ('"name"'); callers compare them with segments
  that Python escaped the same way. Only the containers a path walks into are parsed.
]]

-- Index of the last byte of the JSON string that starts at `pos` (a '"').
local function json_skip_string(s, pos)
  local p = pos + 1
  while true do
    local q = string.find(s, '["\\]', p)
    if not q then
      error('unterminated JSON string at ' .. pos)
    end
    if string.byte(s, q) == 92 then -- backslash: skip the escaped byte
      p = q + 2
    else
      return q
    end
  end
end

-- Index of the last byte of the JSON value that starts at `pos`.
local function json_skip(s, pos)
  local c = string.byte(s, pos)
  if c == 34 then
    return json_skip_string(s, pos)
  end
  if c == 123 or c == 91 then -- { or [
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

-- Parse one level of a raw container; children stay raw.
local function json_open(raw)
  local first = string.byte(raw, 1)
  local n = #raw
  if first == 123 then
    local node = {keys = {}, vals = {}}
    local p = 2
    while p < n do
      local kend = json_skip_string(raw, p)
      local key = string.sub(raw, p, kend)
      local vend = json_skip(raw, kend + 2)
      if node.vals[key] == nil then
        node.keys[#node.keys + 1] = key
      end
      node.vals[key] = string.sub(raw, kend + 2, vend)
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

local function json_type(node)
  if type(node) == 'table' then
    return node.keys and 'object' or 'array'
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
    for i, key in ipairs(node.keys) do
      if i > 1 then out[#out + 1] = ',' end
      out[#out + 1] = key
      out[#out + 1] = ':'
      json_encode_into(node.vals[key], out)
    end
    out[#out + 1] = '}'
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
  end
  obj.vals[key] = value
end

local function json_remove(obj, key)
  if obj.vals[key] == nil then
    return
  end
  obj.vals[key] = nil
  for i, k in ipairs(obj.keys) do
    if k == key then
      table.remove(obj.keys, i)
      return
    end
  end
end
