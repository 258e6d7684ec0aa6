#!lua flags=no-writes
--[[
  One page of a scope's entries (state::list-entries), walked from a position in one of the
  scope's indexes: O(log n) to find the start, then the members examined. Filters (prefix,
  key and topic patterns, expiry) are applied while walking; at most ARGV[13] members are
  examined per call, so a page with a selective filter may come back short with a cursor.
  Input:
    KEYS[1] the index of the order: key index (key), updated index (updated_at) or topic
            index (topic: members "<topic>\0<key>" of the tagged entries)
    KEYS[2] the scope's key index: in topic order the untagged entries come after every
            topic, walked in key order here (cursor member "\255\0<key>": no UTF-8 text
            holds the byte 255), tagged ones skipped (and counted as examined)
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[3] order_by: key | updated_at | topic     ARGV[4] order: asc | desc
    ARGV[5] cursor: "" for none, else "=" .. member   ARGV[6] cursor score (updated_at only)
    ARGV[7] limit    ARGV[8] entries to skip first (offset)
    ARGV[9] key prefix ("" for none)
    ARGV[10] key pattern: "" none, else "=" .. pattern
    ARGV[11] topic pattern: "" none, else "=" .. pattern
    ARGV[12] "1" to return values        ARGV[13] most members to examine
    ARGV[14] most bytes of entries to read ("" none): the walk stops after the entry that
             reaches it, with a cursor (max_call_bytes: state::query's byte budget, and
             list-entries', whose every read entry is read whole, its value returned or not:
             a page of 64 entries of 1 MiB held Redis 0.27 s without their values)
  Output:
    {ST.OK, cursor member or false, cursor score or false, entries still to skip,
     {key, version, hash, topic, created, updated, expires, updated_by, value, ...}}
    (9 fields per entry, false where unset; value also when the hash is unknown; numbers
    as integers, the hash as its 32 raw bytes)
    {ST.STORE_LOST, prefix, 1 or 0} the partition's data is lost or a restore writes it back
    (1): nothing read (generation.lua generation_read_refused)
  Events: none.
]]
--- @include "generation"
--- @include "glob"
--- @include "text"
--- @include "packed"

local refused = generation_read_refused(KEYS[1])
if refused then
  return refused
end
local idx, now, prefix = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local orderBy, desc = ARGV[3], ARGV[4] == 'desc'
local hasCursor, cursor, cursorScore = ARGV[5] ~= '', string.sub(ARGV[5], 2), ARGV[6]
local limit, skip, keyPrefix = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local keyParts = ARGV[10] ~= '' and glob_parts(string.sub(ARGV[10], 2)) or nil
local topicParts = ARGV[11] ~= '' and glob_parts(string.sub(ARGV[11], 2)) or nil
local withValues, examineMax = ARGV[12] == '1', tonumber(ARGV[13])
local bytesMax = tonumber(ARGV[14] or '')
local bytes = 0

local UNTAGGED = '\255\0' -- the cursor members of the untagged in topic order

-- Position (0-based, in walking order) in the lex-ordered index `zset` of the first member
-- after the cursor `at` (nil for none; "" is the empty key's).
local function lex_rank(zset, at)
  if not at then return 0 end
  if desc then return redis.call('ZLEXCOUNT', zset, '[' .. at, '+') end
  return redis.call('ZLEXCOUNT', zset, '-', '[' .. at)
end

-- Position of the first member to examine in the updated index, after the cursor.
local function updated_rank()
  if not hasCursor then return 0 end
  local score = tonumber(cursorScore)
  local below = redis.call('ZCOUNT', idx, '-inf', '(' .. cursorScore)
  local tiesLE, exists
  local own = redis.call('ZSCORE', idx, cursor)
  if own and tonumber(own) == score then
    exists = 1
    tiesLE = redis.call('ZRANK', idx, cursor) - below + 1
  else
    exists = 0
    tiesLE = 0
    for _, m in ipairs(redis.call('ZRANGE', idx, cursorScore, cursorScore, 'BYSCORE')) do
      if text_bytes_le(m, cursor) then tiesLE = tiesLE + 1 end
    end
  end
  if not desc then return below + tiesLE end
  return redis.call('ZCARD', idx) - (below + tiesLE - exists)
end

--[[
  The legs of the walk, in order: {index, first position, untagged}, `untagged` set on the
  key index walked for topic order's untagged entries. Topic order ascending: the topics,
  then the untagged; descending the other way round. A topic pattern never matches an
  untagged entry, so it walks no untagged leg.
]]
local function legs()
  if orderBy == 'updated_at' then
    return {{idx, updated_rank(), false}}
  end
  if orderBy == 'key' then
    local at = hasCursor and cursor or nil
    if not at and keyPrefix ~= '' then
      if desc then return {{idx, redis.call('ZLEXCOUNT', idx, '(' .. keyPrefix .. '\255', '+'), false}} end
      return {{idx, redis.call('ZLEXCOUNT', idx, '-', '(' .. keyPrefix), false}}
    end
    return {{idx, lex_rank(idx, at), false}}
  end
  local inUntagged = hasCursor and string.sub(cursor, 1, 2) == UNTAGGED
  local topics, untagged = nil, nil
  if not (inUntagged and not desc) then -- (ascending past the topics: none left)
    topics = {idx, lex_rank(idx, (hasCursor and not inUntagged) and cursor or nil), false}
  end
  if not topicParts and not (hasCursor and desc and not inUntagged) then
    untagged = {KEYS[2], lex_rank(KEYS[2], inUntagged and string.sub(cursor, 3) or nil), true}
  end
  if desc then return {untagged, topics} end
  return {topics, untagged}
end

local function key_of(member, leg)
  if orderBy == 'topic' and not leg[3] then
    return string.sub(member, string.find(member, '\0', 1, true) + 1)
  end
  return member
end

local out = {}
local found, examined = 0, 0
local lastMember, lastScore = false, false
local walk = legs()

-- Walk one leg until the page is full, the leg ends (true: go on to the next) or the
-- examined members reach the most allowed.
local function walk_leg(leg)
  local zset, pos, untagged = leg[1], leg[2], leg[3]
  while true do
    local want = math.min(200, examineMax - examined)
    if want <= 0 then return false end
    local chunk
    if desc then
      chunk = redis.call('ZRANGE', zset, pos, pos + want - 1, 'REV', 'WITHSCORES')
    else
      chunk = redis.call('ZRANGE', zset, pos, pos + want - 1, 'WITHSCORES')
    end
    local got = #chunk / 2
    for i = 1, #chunk, 2 do
      local member = chunk[i]
      examined = examined + 1
      lastMember, lastScore = untagged and UNTAGGED .. member or member, chunk[i + 1]
      local key = key_of(member, leg)
      local hasPrefix = keyPrefix == '' or string.sub(key, 1, #keyPrefix) == keyPrefix
      if orderBy == 'key' and not hasPrefix then -- (past the prefix: the page is done)
        lastMember = false
        return false
      end
      local ok = hasPrefix and (not keyParts or glob_match(key, keyParts))
      local f
      if ok then
        local stored = redis.call('GET', prefix .. key)
        f = stored and packed_read(stored) -- (value, version, expires, hash, topic, plain, by ...)
        bytes = bytes + (stored and #stored or 0)
        ok = f and not (f[3] and tonumber(f[3]) <= now) and not (untagged and f[5])
        if ok and topicParts then
          ok = f[5] and glob_match(f[5], topicParts)
        end
      end
      if ok then
        if skip > 0 then
          skip = skip - 1
        else
          local n = #out
          out[n + 1], out[n + 2], out[n + 3], out[n + 4] = key, f[2], f[4], f[5]
          out[n + 5], out[n + 6], out[n + 7], out[n + 8] = f[8], f[9], f[3], f[7]
          out[n + 9] = (withValues or not f[4]) and f[1] or false
          found = found + 1
          if found == limit then
            return false
          end
        end
      end
      if bytesMax and bytes >= bytesMax then
        return false
      end
    end
    if got < want then return true end
    pos = pos + got
  end
end

local exhausted = true -- every leg walked to its end: no cursor
for i = 1, 2 do
  local leg = walk[i]
  if leg and not walk_leg(leg) then
    exhausted = false
    break
  end
end
if exhausted then lastMember = false end
return {ST.OK, lastMember, lastMember and lastScore or false, skip, out}
