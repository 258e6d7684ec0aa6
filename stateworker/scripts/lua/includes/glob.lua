--[[
  `*` patterns: `*` matches any run of bytes, everything else is literal, the whole string
  must match. Matched by literal chunks with plain string.find, so the time is linear in the
  subject for any number of stars (a Lua pattern built from the glob could backtrack badly
  inside Redis).
]]

--- @include "text"

-- The literal chunks of a pattern; a run of stars counts as one (empty middle chunks go).
local function glob_parts(pattern)
  local split = text_split(pattern, '*')
  if #split <= 2 then
    return split
  end
  local parts = {split[1]}
  for i = 2, #split - 1 do
    if split[i] ~= '' then
      parts[#parts + 1] = split[i]
    end
  end
  parts[#parts + 1] = split[#split]
  return parts
end

local function glob_match(subject, parts)
  local n = #parts
  if n == 1 then
    return subject == parts[1]
  end
  local first, last = parts[1], parts[n]
  if #subject < #first + #last then return false end
  if string.sub(subject, 1, #first) ~= first then return false end
  if #last > 0 and string.sub(subject, -#last) ~= last then return false end
  local pos, limit = #first + 1, #subject - #last
  for i = 2, n - 1 do
    local part = parts[i]
    if #part > 0 then
      local at = string.find(subject, part, pos, true)
      if not at or at + #part - 1 > limit then return false end
      pos = at + #part
    end
  end
  return true
end
