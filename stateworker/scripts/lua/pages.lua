--[[
  One page of state::list_entries (iii's paged listing of a scope). Without a cursor the scope's
  live entries are captured, in key byte order, as one snapshot; each page is cut from the
  snapshot by `limit` and by `max_bytes` (the page's JSON, as the service encodes it, never
  passes it). A snapshot lives in Redis (a hash in the scope's partition, so every replica
  finds it) under the name of the cursor that reads it next: reading a page renames it to the
  next cursor's (the TTL goes with it: pages never extend a snapshot's life), and the last page
  deletes it. Reading and renaming are this one script, so of two callers racing on one cursor
  only the first gets the page.
  The snapshot hash: "b" its binding (ARGV[4]), "c" its caller (ARGV[14]), "s" its place in
  the order of the caller's captures (one past the newest of its live ones), "o" the entries
  already paged, "n" how many it holds, and "1".."n" each entry's row as the page writes it:
  ["<key JSON>",<value JSON>].
  The partition's room is shared: a caller holds at most ARGV[13] live snapshots of it, so one
  caller opening listings in a loop cannot fill the room and lock the others out. A capture
  that would pass the caller's share, or find the room full while the caller holds some of it,
  drops the caller's own oldest snapshot (its cursor then INVALID_CURSOR), never another
  caller's; a full room and none of it the caller's is SNAPSHOT_CAPACITY. The drop is the last
  step of a capture that keeps a snapshot: a refused capture drops nothing.
  Input:
    KEYS[1] the scope's key index (zset)
    KEYS[2] the snapshot read: the cursor's (capturing: the same name as KEYS[3])
    KEYS[3] the snapshot's name for the next page (the next cursor's)
    KEYS[4] the partition's live snapshots (zset: snapshot name -> expires ms)
    ARGV[1] now (epoch ms)
    ARGV[2] "1": capture the scope (a call without a cursor), "": the cursor's next page
    ARGV[3] entry name prefix of the scope (partition entry prefix .. <len>:<scope>)
    ARGV[4] the binding: the scope, namespace, caller, limit and max_bytes a cursor serves
    ARGV[5] limit (entries of a page)    ARGV[6] max_bytes (JSON bytes of a page)
    ARGV[7] the next cursor (its text, in the page's JSON)
    ARGV[8] most entries of a snapshot   ARGV[9] most bytes of a snapshot's rows
    ARGV[10] most live snapshots of the partition   ARGV[11] a snapshot's life (ms)
    ARGV[12] most bytes of one row      ARGV[13] most live snapshots of one caller
    ARGV[14] the caller (whose share the snapshot is taken from)
  Output:
    {ST.OK, offset, total, {key, value, ...} (the page's), 1 when done else 0}
    {ST.INVALID_CURSOR}   the cursor's snapshot is unknown, expired, consumed or bound to
                          another binding; nothing written
    {ST.ROW_TOO_LARGE, the row's position (0-based), its bytes, the limit}   the next row
                          cannot fit a page alone (or passes ARGV[12]); nothing written
    {ST.SNAPSHOT_CAPACITY, "snapshots" | "entries" | "bytes", found, limit}   nothing written
                          ("snapshots": the room full, none of it the caller's)
                          ("entries": the keys of the scope's index, live or expired not yet
                          reaped; at most ARGV[8] + 1 of them are read)
    {ST.STORE_LOST, prefix, 1 or 0} the partition's data is lost or a restore writes it back
    (1): nothing read, nothing written (generation.lua generation_read_refused)
  Events: none.
]]
--- @include "generation"
--- @include "packed"

-- JSON string escapes as msgspec writes them (the page's bytes are counted here exactly);
-- written out, as the library's top level may not call the string library.
local ESCAPES = {['"'] = '\\"', ['\\'] = '\\\\', ['\0'] = '\\u0000', ['\1'] = '\\u0001',
  ['\2'] = '\\u0002', ['\3'] = '\\u0003', ['\4'] = '\\u0004', ['\5'] = '\\u0005',
  ['\6'] = '\\u0006', ['\7'] = '\\u0007', ['\8'] = '\\b', ['\9'] = '\\t', ['\10'] = '\\n',
  ['\11'] = '\\u000b', ['\12'] = '\\f', ['\13'] = '\\r', ['\14'] = '\\u000e',
  ['\15'] = '\\u000f', ['\16'] = '\\u0010', ['\17'] = '\\u0011', ['\18'] = '\\u0012',
  ['\19'] = '\\u0013', ['\20'] = '\\u0014', ['\21'] = '\\u0015', ['\22'] = '\\u0016',
  ['\23'] = '\\u0017', ['\24'] = '\\u0018', ['\25'] = '\\u0019', ['\26'] = '\\u001a',
  ['\27'] = '\\u001b', ['\28'] = '\\u001c', ['\29'] = '\\u001d', ['\30'] = '\\u001e',
  ['\31'] = '\\u001f'}

local function json_text(text)
  return '"' .. string.gsub(text, '[%z\1-\31"\\]', ESCAPES) .. '"'
end

--- @per-call
local refused = generation_read_refused(KEYS[1])
if refused then
  return refused
end
local now, capture, prefix, binding = tonumber(ARGV[1]), ARGV[2] == '1', ARGV[3], ARGV[4]
local limit, maxBytes, cursor = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local snapshot, nextName, live = KEYS[2], KEYS[3], KEYS[4]

-- Bytes of the page's JSON but its rows: {"entries":[],"done":...,"offset":...,"total":...}
local function base(done, offset, total)
  local middle = done and 'true,"next_cursor":null' or 'false,"next_cursor":"' .. cursor .. '"'
  return #'{"entries":[],"done":,"offset":,"total":}' + #middle + #tostring(offset)
    + #tostring(total)
end

--[[
  Where the page from `offset` ends (it holds rows offset+1 .. end; `row(i)` reads row i):
  the whole rest when it fits a last page (no cursor), else the most rows that fit a page
  with a cursor; nil and the first row's bytes when not even that row fits.
]]
local function cut(row, offset, total)
  local last, more = base(true, offset, total), base(false, offset, total)
  local bytes, fits, i = 0, offset, offset
  while i < total and i - offset < limit do
    local size = #row(i + 1) + (i > offset and 1 or 0) -- (the comma before it)
    if last + bytes + size > maxBytes then break end -- (no page holds it: the last is smaller)
    bytes = bytes + size
    i = i + 1
    if more + bytes <= maxBytes then fits = i end
  end
  if i == total then return total end
  if fits == offset then return nil, #row(offset + 1) end
  return fits
end

-- The page from `offset`: its reply, and where it ends (nil: refused).
local function page(row, offset, total)
  local stop, size = cut(row, offset, total)
  if not stop then
    return {ST.ROW_TOO_LARGE, offset, size, maxBytes}, nil
  end
  local out = {}
  for i = offset + 1, stop do
    out[#out + 1] = row(i)
  end
  return {ST.OK, offset, total, out, stop == total and 1 or 0}, stop
end

local function capacity(what, found, most)
  return {ST.SNAPSHOT_CAPACITY, what, found, most}
end

if not capture then
  local held = redis.call('HMGET', snapshot, 'b', 'o', 'n')
  if held[1] ~= binding then
    return {ST.INVALID_CURSOR}
  end
  if redis.call('EXISTS', nextName) == 1 then -- (a cursor drawn twice: never overwrite one)
    return capacity('snapshots', 1, 0)
  end
  local offset, total = tonumber(held[2]), tonumber(held[3])
  local read = {}
  local function row(i)
    read[i] = read[i] or redis.call('HGET', snapshot, i)
    return read[i]
  end
  local reply, stop = page(row, offset, total)
  if not stop then return reply end
  redis.call('ZREM', live, snapshot)
  if stop == total then
    redis.call('DEL', snapshot)
  else
    local expires = redis.call('PEXPIRETIME', snapshot)
    redis.call('HSET', snapshot, 'o', stop)
    redis.call('RENAME', snapshot, nextName)
    redis.call('ZADD', live, expires, nextName)
  end
  return reply
end

-- Capture: every live entry's row, in key byte order, within the snapshot's bounds.
local maxEntries, maxSnapshotBytes = tonumber(ARGV[8]), tonumber(ARGV[9])
local maxLive, lifeMs, maxRow = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local share, caller = tonumber(ARGV[13]), ARGV[14]
if redis.call('EXISTS', snapshot) == 1 then -- (a cursor drawn twice: never overwrite one)
  return capacity('snapshots', 1, 0)
end
redis.call('ZREMRANGEBYSCORE', live, '-inf', now) -- (the expired ones are gone)
-- The room's holders (at most ARGV[10] names: a capture adds one only below it, and drops one
-- when the room is full), and the caller's own with their capture order "s" (captures in one
-- millisecond share an expiry, so the score cannot tell the oldest). A name whose hash Redis
-- expired already (its clock a little ahead of ours) holds nothing; the next capture's
-- ZREMRANGEBYSCORE removes it.
local held, owned, oldest, last = 0, 0, nil, 0
for _, name in ipairs(redis.call('ZRANGE', live, 0, -1)) do
  local owner = redis.call('HMGET', name, 'b', 'c', 's')
  if owner[1] then
    held = held + 1
    if owner[2] == caller then
      local order = tonumber(owner[3])
      owned = owned + 1
      if not oldest or order < oldest[2] then oldest = {name, order} end
      if order > last then last = order end
    end
  end
end
local drop = nil
if owned >= share or (held >= maxLive and owned > 0) then
  drop = oldest[1]
elseif held >= maxLive then
  return capacity('snapshots', held, maxLive)
end
-- At most one key past the bound is read: an index of more keys (live entries and expired
-- ones not yet reaped alike) is refused before any entry is read.
local keys = redis.call('ZRANGE', KEYS[1], 0, maxEntries)
if #keys > maxEntries then
  return capacity('entries', redis.call('ZCARD', KEYS[1]), maxEntries)
end
local rows, bytes = {}, 0
for _, key in ipairs(keys) do
  local stored = redis.call('GET', prefix .. key)
  if stored then
    local value, expires = packed_value(stored)
    if not (expires and expires <= now) then
      local row = '[' .. json_text(key) .. ',' .. value .. ']'
      if #row > maxRow then
        return {ST.ROW_TOO_LARGE, #rows, #row, maxRow}
      end
      bytes = bytes + #row
      if bytes > maxSnapshotBytes then
        return capacity('bytes', bytes, maxSnapshotBytes)
      end
      rows[#rows + 1] = row
    end
  end
end
local reply, stop = page(function(i) return rows[i] end, 0, #rows)
if not stop or stop == #rows then
  return reply -- (refused, or all in one page: nothing kept)
end
if drop then
  redis.call('DEL', drop)
  redis.call('ZREM', live, drop)
end
redis.call('HSET', snapshot, 'b', binding, 'c', caller, 's', last + 1, 'o', stop, 'n', #rows)
local batch = {}
for i, row in ipairs(rows) do
  batch[#batch + 1], batch[#batch + 2] = i, row
  if #batch == 1000 or i == #rows then
    redis.call('HSET', snapshot, unpack(batch))
    batch = {}
  end
end
redis.call('PEXPIREAT', snapshot, now + lifeMs)
redis.call('ZADD', live, now + lifeMs, snapshot)
return reply
