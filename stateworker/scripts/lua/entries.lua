#!lua flags=no-writes
--[[
  One page of a scope's entries (state::list-entries), walked from a position in one of the
  scope's indexes: O(log n) to find the start, then the members examined. Filters (prefix,
  key and topic patterns, expiry) are applied while walking; at most ARGV[13] members are
  examined per call, so a page with a selective filter may come back short with a cursor.
  Input:
    KEYS[1] the index of the order: key index (key), updated index (updated_at) or topic
            index (topic: members "<topic>\0<key>", untagged "\255\0<key>")
    ARGV[1] now (epoch ms)
    ARGV[2] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[3] order_by: key | updated_at | topic     ARGV[4] order: asc | desc
    ARGV[5] cursor: "" for none, else "=" .. member   ARGV[6] cursor score (updated_at only)
    ARGV[7] limit    ARGV[8] entries to skip first (offset)
    ARGV[9] key prefix ("" for none)
    ARGV[10] key pattern: "" none, else "=" .. pattern
    ARGV[11] topic pattern: "" none, else "=" .. pattern
    ARGV[12] "1" to return values        ARGV[13] most members to examine
  Output:
    {ST.OK, cursor member or false, cursor score or false, entries still to skip,
     {key, version, hash, topic, created, updated, expires, updated_by, value, ...}}
    (9 fields per entry, false where unset; value also when the hash is unknown)
  Events: none.
]]
--- @include "glob"
--- @include "text"

local idx, now, prefix = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local orderBy, desc = ARGV[3], ARGV[4] == 'desc'
local hasCursor, cursor, cursorScore = ARGV[5] ~= '', string.sub(ARGV[5], 2), ARGV[6]
local limit, skip, keyPrefix = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local keyParts = ARGV[10] ~= '' and glob_parts(string.sub(ARGV[10], 2)) or nil
local topicParts = ARGV[11] ~= '' and glob_parts(string.sub(ARGV[11], 2)) or nil
local withValues, examineMax = ARGV[12] == '1', tonumber(ARGV[13])

-- Position (0-based, in walking order) of the first member to examine.
local function start_rank()
  if orderBy ~= 'updated_at' then
    if hasCursor then
      if desc then return redis.call('ZLEXCOUNT', idx, '[' .. cursor, '+') end
      return redis.call('ZLEXCOUNT', idx, '-', '[' .. cursor)
    end
    if orderBy == 'key' and keyPrefix ~= '' then
      if desc then return redis.call('ZLEXCOUNT', idx, '(' .. keyPrefix .. '\255', '+') end
      return redis.call('ZLEXCOUNT', idx, '-', '(' .. keyPrefix)
    end
    return 0
  end
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

local function key_of(member)
  if orderBy == 'topic' then
    return string.sub(member, string.find(member, '\0', 1, true) + 1)
  end
  return member
end

local out = {}
local found, examined = 0, 0
local pos = start_rank()
local lastMember, lastScore = false, false
local finished = false
while not finished do
  local want = math.min(200, examineMax - examined)
  if want <= 0 then break end
  local chunk
  if desc then
    chunk = redis.call('ZRANGE', idx, pos, pos + want - 1, 'REV', 'WITHSCORES')
  else
    chunk = redis.call('ZRANGE', idx, pos, pos + want - 1, 'WITHSCORES')
  end
  local got = #chunk / 2
  for i = 1, #chunk, 2 do
    local member = chunk[i]
    examined = examined + 1
    lastMember, lastScore = member, chunk[i + 1]
    local key = key_of(member)
    local hasPrefix = keyPrefix == '' or string.sub(key, 1, #keyPrefix) == keyPrefix
    if orderBy == 'key' and not hasPrefix then
      finished, lastMember = true, false
      break
    end
    local ok = hasPrefix and (not keyParts or glob_match(key, keyParts))
    local f
    if ok then
      f = redis.call('HMGET', prefix .. key, 'n', 'h', 't', 'c', 'u', 'x', 'b', 'v')
      ok = f[1] and not (f[6] and tonumber(f[6]) <= now)
      if ok and topicParts then
        ok = f[3] and glob_match(f[3], topicParts)
      end
    end
    if ok then
      if skip > 0 then
        skip = skip - 1
      else
        out[#out + 1] = key
        for j = 1, 7 do out[#out + 1] = f[j] end
        out[#out + 1] = (withValues or not f[2]) and f[8] or false
        found = found + 1
        if found == limit then
          finished = true
          break
        end
      end
    end
  end
  if not finished and got < want then
    finished, lastMember = true, false
  end
  pos = pos + got
end
return {ST.OK, lastMember, lastMember and lastScore or false, skip, out}
