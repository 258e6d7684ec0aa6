--[[
  Splitting text on a plain (non-pattern) separator, shared by the scripts.
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
