--[[
  Splitting text on a plain (non-pattern) separator, and comparing text by bytes, shared by
  the scripts.
]]

-- The pieces of `text` between occurrences of `sep` (one byte); "" gives {""}.
local function text_split(text, sep)
  local parts, p = {}, 1
  while true do
    local at = string.find(text, sep, p, true)
    if not at then
      parts[#parts + 1] = string.sub(text, p)
      return parts
    end
    parts[#parts + 1] = string.sub(text, p, at - 1)
    p = at + 1
  end
end

-- a <= b by bytes, as sorted sets order members (Lua's own `<=` follows the server's locale).
local function text_bytes_le(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end
