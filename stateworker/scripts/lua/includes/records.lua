--[[
  Call records, compact (helpers prefixed records_). A bus call's record is one field of a
  hash that holds every call of one time slice: `<name>` .. <slice number>, expired whole.
  The field is 12 raw bytes (the first 12 of the SHA-1 of the call id), the value 8 raw bytes
  of the call's digest (SHA-1 of function and body), then, for a call an entry script ran,
  its reply (cmsgpack). A value of the digest alone binds the id to its call without a reply
  (bind.lua: reads and the calls that bind in a step of their own).
  A slice is `ms` long (a quarter of the dedupe window); a record is looked up in the caller's
  slice and the RECORDS_BACK slices before it, so it is found for the whole window, and near
  the end of a slice also in the next one (a replica whose clock runs up to RECORDS_SKEW_MS
  ahead may have written there). Its hash expires RECORDS_BACK + 1 slices after its slice
  began (by the clock of the call that made it): a record lives 1 to 1.25 windows.
  A new call costs 5 lookups and 1 write (a slice's first also its expiry and mark).
]]

local RECORDS_BACK = 4 -- slices looked up behind the current one: the window / the slice
local RECORDS_SKEW_MS = 5000 -- how far ahead another replica's clock may run

--[[
  A slice is made a hash table at once: its first write also stores this mark under the empty
  field, a value longer than hash-max-listpack-value (64 by default), so Redis converts it.
  As a listpack (up to 512 fields) every lookup of a new id scanned the whole slice: a
  state::set's script took 70-90 us instead of 41-46 (measured, 25,600 calls with fresh
  ids); a hash table's lookup does not grow with it. (A literal: the library's top level
  cannot call string.rep.) The mark also tells a slice that has its expiry already.
]]
local RECORDS_MARK = '----------------------------------------------------------------' ..
  '----------------------------------------------------------------' -- (128 bytes)

--[[
  The value held for `field` within the window (false when none), and whether the current
  slice `name` is new (records_keep then gives it its expiry and mark).
]]
local function records_find(name, slice, field, ms, now)
  local current = redis.call('HMGET', name, field, '')
  local fresh = not current[2]
  if current[1] then
    return current[1], fresh
  end
  local base, n = string.sub(name, 1, #name - #slice), tonumber(slice)
  local from = (n + 1) * ms - now <= RECORDS_SKEW_MS and n + 1 or n - 1
  for i = from, n - RECORDS_BACK, -1 do
    if i ~= n then
      local held = redis.call('HGET', base .. string.format('%d', i), field)
      if held then
        return held, fresh
      end
    end
  end
  return false, fresh
end

--[[
  Keep `value` for `field` in the current slice `name` (`fresh`: records_find's answer).
  `unlogged`: the field kept in memory only, neither in the AOF nor sent to replicas (a read's
  binding: decision 0058). A slice's mark and expiry are always logged, mark first, so that
  the AOF's and the replicas' copy of every slice has its expiry.
]]
local function records_keep(name, slice, field, value, ms, now, fresh, unlogged)
  if fresh then
    local keep = (tonumber(slice) + RECORDS_BACK + 1) * ms - now
    redis.call('HSET', name, '', RECORDS_MARK)
    redis.call('PEXPIRE', name, string.format('%d', keep))
  end
  if unlogged then
    redis.set_repl(redis.REPL_NONE)
    redis.call('HSET', name, field, value)
    redis.set_repl(redis.REPL_ALL)
  else
    redis.call('HSET', name, field, value)
  end
end

--[[
  Bind a call id (its record's `field`) to the call's `digest` in the current slice `name`
  unless it is bound already: 1 bound now, 0 bound before to this same call, false bound to
  another call (CALL_ID_REUSED; nothing written). bind.lua, and the scripts that bind a
  read's id themselves (get.lua); `unlogged` as records_keep's (a read's binding).
]]
local function records_bind(name, slice, field, digest, ms, now, unlogged)
  local held, fresh = records_find(name, slice, field, ms, now)
  if held then
    return string.sub(held, 1, #digest) == digest and 0
  end
  records_keep(name, slice, field, digest, ms, now, fresh, unlogged)
  return 1
end
