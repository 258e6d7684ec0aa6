--[[
  Value indexes of state::query (state/query/indexes.py). A scope's index definitions are the hash
  <tag>ix:<scope> (keys.py `index_defs`: pointer -> "r" ready, "b" build not started, "c" ..
  the last key built); each indexed pointer's members are the zset
  <tag>iv:<len>:<scope><pointer> (`value_index`), score 0, member <encoded value><key>. Both
  names are made from the scope's key index (<tag>k:<scope>), so every script that keeps the
  key index keeps these in the same slot with no KEYS of their own.

  The encoding (state/query/predicates.py `encode`, the same bytes): its byte order is the query's
  order: \1 null, \2 false, \3 true; numbers \16 negative, \17 zero, \18 positive, each as
  0.<digits> * 10^point (no leading or trailing zero): positive \18 .. <point + 2e15 as 16
  digits> .. <digits> .. \1, negative the same digits flipped (9 - d) and \254; strings \32 ..
  <bytes, \0 as \0\1> .. \0\0. Exact: 1, 1.0 and 1e0 are one member, -0 is 0. A number whose
  point is beyond +-1e15 is \127 (every numeric query reads that bucket and checks it).
  Objects and arrays are not indexed.
]]
--- @include "json"

local INDEXES_ESCAPES = {['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f',
  n = '\n', r = '\r', t = '\t'}

local function indexes_utf8(cp)
  if cp < 128 then
    return string.char(cp)
  elseif cp < 2048 then
    return string.char(192 + math.floor(cp / 64), 128 + cp % 64)
  elseif cp < 65536 then
    return string.char(224 + math.floor(cp / 4096), 128 + math.floor(cp / 64) % 64,
      128 + cp % 64)
  end
  return string.char(240 + math.floor(cp / 262144), 128 + math.floor(cp / 4096) % 64,
    128 + math.floor(cp / 64) % 64, 128 + cp % 64)
end

-- The text of the JSON string s[a..b] (quotes included), escapes decoded.
local function indexes_string(s, a, b)
  local body = string.sub(s, a + 1, b - 1)
  if not string.find(body, '\\', 1, true) then
    return body
  end
  local out, i, n = {}, 1, #body
  while i <= n do
    local j = string.find(body, '\\', i, true)
    if not j then
      out[#out + 1] = string.sub(body, i)
      break
    end
    out[#out + 1] = string.sub(body, i, j - 1)
    local e = string.sub(body, j + 1, j + 1)
    if e == 'u' then
      local cp = tonumber(string.sub(body, j + 2, j + 5), 16)
      i = j + 6
      if cp >= 55296 and cp <= 56319 and string.sub(body, i, i + 1) == '\\u' then
        local low = tonumber(string.sub(body, i + 2, i + 5), 16)
        if low >= 56320 and low <= 57343 then
          cp = 65536 + (cp - 55296) * 1024 + (low - 56320)
          i = i + 6
        end
      end
      out[#out + 1] = indexes_utf8(cp)
    else
      out[#out + 1] = INDEXES_ESCAPES[e]
      i = j + 2
    end
  end
  return table.concat(out)
end

-- A pointer's reference tokens (RFC 6901: "" none; "/a~1b/0" {"a/b", "0"}).
local function indexes_parts(pointer)
  local parts = {}
  local p = 2
  while p <= #pointer + 1 do
    local q = string.find(pointer, '/', p, true) or (#pointer + 1)
    local seg = string.sub(pointer, p, q - 1)
    parts[#parts + 1] = (string.gsub(string.gsub(seg, '~1', '/'), '~0', '~'))
    p = q + 1
  end
  return parts
end

-- The first and last byte of the value at `parts` in the compact JSON `s`, or nil.
local function indexes_find(s, parts)
  local a, b = 1, #s
  for _, part in ipairs(parts) do
    local c = string.byte(s, a)
    if c == 123 then -- {
      local p, fa, fb = a + 1, nil, nil
      if string.byte(s, p) ~= 125 then
        while true do
          local ke = json_skip_string(s, p)
          local ve = json_skip(s, ke + 2)
          if indexes_string(s, p, ke) == part then
            fa, fb = ke + 2, ve -- (a repeated key: the last one, as every decoder here)
          end
          if string.byte(s, ve + 1) == 125 then
            break
          end
          p = ve + 2
        end
      end
      if not fa then
        return nil
      end
      a, b = fa, fb
    elseif c == 91 then -- [
      if not (part == '0' or string.find(part, '^[1-9][0-9]*$')) or #part > 9 then
        return nil
      end
      local want, i, p = tonumber(part), 0, a + 1
      if string.byte(s, p) == 93 then
        return nil
      end
      while true do
        local ve = json_skip(s, p)
        if i == want then
          a, b = p, ve
          break
        end
        if string.byte(s, ve + 1) == 93 then
          return nil
        end
        p, i = ve + 2, i + 1
      end
    else
      return nil
    end
  end
  return a, b
end

local function indexes_number(t)
  local neg = string.byte(t, 1) == 45
  local int, frac, exp = string.match(neg and string.sub(t, 2) or t,
    '^(%d+)%.?(%d*)[eE]?([-+]?%d*)$')
  local digits = int .. frac
  local lead = string.find(digits, '[1-9]')
  if not lead then
    return '\17'
  end
  local e = 0
  if exp ~= '' then
    local sig = string.gsub(exp, '^[-+]?0*', '')
    if #sig > 16 then
      return '\127'
    end
    e = tonumber(exp) or 0
    if e > 9e15 or e < -9e15 then -- (past 2^53 a double is not exact; the point is out anyway)
      return '\127'
    end
  end
  local point = #int + e - (lead - 1)
  if point > 1e15 or point < -1e15 then
    return '\127'
  end
  local body = string.format('%016d', point + 2e15) ..
    string.gsub(string.sub(digits, lead), '0+$', '')
  if neg then
    return '\16' .. string.gsub(body, '%d', function(d) return string.char(105 - string.byte(d)) end)
      .. '\254'
  end
  return '\18' .. body .. '\1'
end

-- The encoded value at `parts` of the JSON text `value`, or nil (missing, object, array).
local function indexes_encoded(value, parts)
  local a, b = indexes_find(value, parts)
  if not a then
    return nil
  end
  local c = string.byte(value, a)
  if c == 34 then
    return '\32' .. string.gsub(indexes_string(value, a, b), '%z', '\0\1') .. '\0\0'
  elseif c == 116 then
    return '\3'
  elseif c == 102 then
    return '\2'
  elseif c == 110 then
    return '\1'
  elseif c == 45 or (c >= 48 and c <= 57) then
    return indexes_number(string.sub(value, a, b))
  end
  return nil
end

-- The member of `key` whose value is the JSON text `value` (false: none) in one index.
local function indexes_member(value, parts, key)
  if not value then
    return nil
  end
  local saved = JSON_NO_BRACKETS_IN_STRINGS
  JSON_NO_BRACKETS_IN_STRINGS = false
  local enc = indexes_encoded(value, parts)
  JSON_NO_BRACKETS_IN_STRINGS = saved
  return enc and (enc .. key)
end

-- The scope's name for `kind` ("ix:" definitions, "iv:" an index) from its key index.
local function indexes_name(keyIndex, scope, kind)
  return string.sub(keyIndex, 1, #keyIndex - #scope - 2) .. kind
end

--[[
  Keep every index of the entry's scope true for a change of its value from `old` to `new`
  (JSON text; false: none). A scope without indexes costs one HGETALL of a missing key.
]]
local function indexes_change(ctx, old, new)
  local defs = redis.call('HGETALL', indexes_name(ctx.keyIndex, ctx.scope, 'ix:') .. ctx.scope)
  if #defs == 0 then
    return
  end
  local base = indexes_name(ctx.keyIndex, ctx.scope, 'iv:') .. #ctx.scope .. ':' .. ctx.scope
  for i = 1, #defs, 2 do
    local parts = indexes_parts(defs[i])
    local was, now = indexes_member(old, parts, ctx.key), indexes_member(new, parts, ctx.key)
    if was ~= now then
      if was then
        redis.call('ZREM', base .. defs[i], was)
      end
      if now then
        redis.call('ZADD', base .. defs[i], '0', now)
      end
    end
  end
end
