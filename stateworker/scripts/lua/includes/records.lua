--[[
  Call records, compact (helpers prefixed records_). A bus call's record is one field of a
  hash that holds every call of one time slice: `<name>` .. <slice number>, expired whole.
  The field is 12 raw bytes (the first 12 of the SHA-1 of the call id), the value 8 raw bytes
  of the call's digest (SHA-1 of function and body), then, for a call an entry script ran,
  its reply (cmsgpack). A value of the digest alone binds the id to its call without a reply
  (bind.lua: reads and the calls that bind in a step of their own).
  A slice is `ms` long (a quarter of the dedupe window); a record is looked up in the caller's
  slice, the one after it (a replica whose clock runs ahead may have written there) and the
  `back` slices before it, so it is found for the whole window; its hash expires `back` + 1
  slices after its slice ends (by the writer's clock).
]]

local RECORDS_BACK = 4 -- slices looked up behind the current one: the window / the slice

-- The slices' common name: `name` less the slice number's text.
local function records_base(name, slice)
  return string.sub(name, 1, #name - #slice)
end

-- The value held for `field` within the window, or false.
local function records_find(name, slice, field)
  local base, n = records_base(name, slice), tonumber(slice)
  for i = n + 1, n - RECORDS_BACK, -1 do
    local held = redis.call('HGET', base .. string.format('%d', i), field)
    if held then
      return held
    end
  end
  return false
end

-- Keep `value` for `field` in the current slice `name`, expired with the slice.
local function records_keep(name, slice, field, value, ms, now)
  redis.call('HSET', name, field, value)
  redis.call('PEXPIRE', name, string.format('%d', (tonumber(slice) + RECORDS_BACK + 1) * ms - now))
end
