--[[
  Record one arrival at a barrier and decide (state::barrier): skip until the expected keys
  have arrived, then allow exactly once, with every arrival's carried value. The caller
  resolves and checks the arrival (its key, its carried JSON, their sizes) and the config;
  the barrier's own rules (the expect fixed by its first arrival, membership of a named set,
  the payload cap) are checked here, before the first write.
  Input:
    KEYS[1] the barrier's hash (keys: PartitionKeys.barrier)
    KEYS[2] the partition's set of changed barriers (keys: PartitionKeys.barriers_changed):
            every write adds KEYS[1] to it, for the snapshot in PostgreSQL, when one follows
            the partition (its history hash's `snapshot` field; else the set is dropped:
            lua/includes/barriermarks.lua)
    KEYS[3] the partition's barrier write counter (keys: PartitionKeys.barrier_writes): a
            write's `w` is above every `w` the partition gave before, so a barrier deleted
            or expired and made again is never older than its last stored state
    KEYS[4] the partition's barrier index (keys: PartitionKeys.barriers, zset: barrier hash ->
            when it expires, "+inf" while not complete): what the console lists
    ARGV[1] arrival key (text)
    ARGV[2] the arrival's result: JSON text of the key .. ':' .. carried JSON
    ARGV[3] expect tag: "n:<count>" | "k:<SHA-1 of the key list's JSON>"
    ARGV[4] expected count N (the count, or the number of named keys)
    ARGV[5] the expect as text, for messages (the first arrival stores it)
    ARGV[6] arrival token: "" none | "=" .. token
    ARGV[7] the payload's cap in bytes
    ARGV[8] "1" when the named keys follow in ARGV[11..] (byte order), else ""
    ARGV[9] now (epoch ms)
    ARGV[10] how long a completed barrier is kept (ms): its hash expires then
    ARGV[11..] the named keys, when ARGV[8] is "1" (the caller has checked their link fields,
            4 x (key bytes + 1) each at most, within the cap ARGV[7]: state/reactive/barrier.py)
  Hash fields (single-letter names; a key's fields are a letter .. key):
    e expect tag    E expect text    n N    c keys arrived    s bytes of the results so far
    w the write's number (KEYS[3]: the snapshot keeps only the newest state it saw)
    a<key> the key's result (ARGV[2] of its last arrival)
    named sets, while keys are missing: h "=" .. first missing key (byte order);
      p<key> / x<key> a missing key's previous / next missing key ("=" .. key, "-": none)
    complete: only e E n c w, d the payload JSON, t the completing arrival's token, z when
      it expires (epoch ms; the hash has that PEXPIREAT too)
  Output:
    {ST.STORE_LOST}   this Redis lost the prefix's data (generation.lua); nothing written
    {ST.OK, outcome, arrived, N, payload JSON or false, {missing key, ...}}, outcome:
      'allow'     this arrival completed the barrier (or it is the completing token again)
      'waiting'   counted; the first MISSING_SHOWN missing keys of a named set
      'counted'   the key had arrived before: its result replaced, not counted again
      'unknown'   the key is not one of the named set: nothing written
      'complete'  the barrier completed before: nothing written
      'expect'    the barrier is new and its named keys were not sent: call again with them
    {ST.BARRIER_CONFIG, stored expect text, this arrival's expect text}   nothing written
    {ST.VALUE_TOO_LARGE, payload size with this arrival, the cap}        nothing written
  Events: none. A barrier is not an entry: no change event, no index; a completed one
  expires (ARGV[10]). A write adds KEYS[1] to KEYS[2] instead, when a snapshot follows the
  partition (the snapshotter stores it, then forgets it: forget.lua).
]]
--- @include "generation"
--- @include "barriermarks"

local MISSING_SHOWN = 10 -- missing keys named in a 'waiting' reply, at most

local NAMED = 11 -- the first of the named keys in ARGV

-- Whether `key` is one of the named keys sent in ARGV[NAMED..] (a new barrier: once per
-- barrier).
local function barrier_sent_has(key)
  for i = NAMED, #ARGV do
    if ARGV[i] == key then
      return true
    end
  end
  return false
end

-- The missing keys of a new named barrier as a doubly linked list in byte order, so that a
-- key's arrival unlinks it in O(1) and the first missing keys are read from the head.
local function barrier_link_all(barrier)
  local first, last, args, n = NAMED, #ARGV, {}, 0
  redis.call('HSET', barrier, 'h', '=' .. ARGV[first])
  for i = first, last do
    local key = ARGV[i]
    args[n + 1], args[n + 2] = 'p' .. key, i > first and '=' .. ARGV[i - 1] or '-'
    args[n + 3], args[n + 4] = 'x' .. key, i < last and '=' .. ARGV[i + 1] or '-'
    n = n + 4
    if n >= 1000 or i == last then -- (unpack has a limit on its arguments)
      redis.call('HSET', barrier, unpack(args, 1, n))
      n = 0
    end
  end
end

local function barrier_unlink(barrier, key)
  local links = redis.call('HMGET', barrier, 'p' .. key, 'x' .. key)
  local prev, nxt = links[1], links[2]
  if prev == '-' then
    if nxt == '-' then
      redis.call('HDEL', barrier, 'h')
    else
      redis.call('HSET', barrier, 'h', nxt)
    end
  else
    redis.call('HSET', barrier, 'x' .. string.sub(prev, 2), nxt)
  end
  if nxt ~= '-' then
    redis.call('HSET', barrier, 'p' .. string.sub(nxt, 2), prev)
  end
  redis.call('HDEL', barrier, 'p' .. key, 'x' .. key)
end

local function barrier_missing(barrier)
  local out = {}
  local at = redis.call('HGET', barrier, 'h')
  while at and at ~= '-' and #out < MISSING_SHOWN do
    local key = string.sub(at, 2)
    out[#out + 1] = key
    at = redis.call('HGET', barrier, 'x' .. key)
  end
  return out
end

-- {"results":{<result>,...}}: every stored result and this arrival's, in byte order of keys.
-- Redis sorts the names, not a Lua comparator (Redis's Lua compares strings by the locale,
-- so a comparator would walk them byte by byte: 10,000 names took ~140 ms, every caller held
-- meanwhile): the barrier's own key, rewritten whole by the caller next, holds them for a
-- moment as a sorted set (equal scores: byte order, memcmp, in C). Left deleted.
local function barrier_payload(barrier, key, result)
  local all = redis.call('HGETALL', barrier)
  local results = {}
  for i = 1, #all, 2 do
    local name = all[i]
    if string.byte(name, 1) == 97 then -- 'a' .. key
      results[name] = all[i + 1]
    end
  end
  results['a' .. key] = result
  redis.call('DEL', barrier)
  local args, n = {}, 0
  for name in pairs(results) do
    args[n + 1], args[n + 2] = '0', name
    n = n + 2
    if n >= 1000 then -- (unpack has a limit on its arguments)
      redis.call('ZADD', barrier, unpack(args, 1, n))
      n = 0
    end
  end
  if n > 0 then
    redis.call('ZADD', barrier, unpack(args, 1, n))
  end
  local names = redis.call('ZRANGE', barrier, 0, -1)
  redis.call('DEL', barrier)
  local parts = {}
  for i = 1, #names do
    parts[i] = results[names[i]]
  end
  return '{"results":{' .. table.concat(parts, ',') .. '}}'
end

-- Number the write (`w`: above the partition's counter and `before`, the barrier's number
-- read before the write) and mark the barrier changed for the snapshot (if one follows).
local function barrier_changed(barrier, before)
  local w = redis.call('INCR', KEYS[3])
  local last = tonumber(before) or 0
  if w <= last then -- (a barrier numbered before the counter existed)
    w = last + 1
    redis.call('SET', KEYS[3], string.format('%d', w))
  end
  redis.call('HSET', barrier, 'w', string.format('%d', w))
  barriermarks_mark(KEYS[2], barrier)
end

--- @per-call
local barrier = KEYS[1]
if generation_lost(string.sub(KEYS[2], 1, -17)) then -- (KEYS[2]: <tag> .. "barriers_changed")
  return {ST.STORE_LOST}
end
local key, result, tag, need = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local token, cap = ARGV[6], tonumber(ARGV[7])
local named = string.sub(tag, 1, 2) == 'k:'

local f = redis.call('HMGET', barrier, 'e', 'E', 'c', 's', 'd', 't', 'w')
local fresh = not f[1]
if not fresh then
  if f[1] ~= tag then
    return {ST.BARRIER_CONFIG, f[2], ARGV[5]}
  end
  if f[5] then
    if token ~= '' and f[6] == token then
      return {ST.OK, 'allow', need, need, f[5], {}}
    end
    return {ST.OK, 'complete', need, need, false, {}}
  end
elseif named and ARGV[8] ~= '1' then
  return {ST.OK, 'expect', 0, need, false, {}}
end

local arrived, size = tonumber(f[3]) or 0, tonumber(f[4]) or 0
local old = not fresh and redis.call('HGET', barrier, 'a' .. key)
if named and not old then
  local known
  if fresh then
    known = barrier_sent_has(key)
  else
    known = redis.call('HEXISTS', barrier, 'x' .. key) == 1
  end
  if not known then
    return {ST.OK, 'unknown', arrived, need, false, {}}
  end
end

-- The payload is '{"results":{' .. the results joined by ',' .. '}}': 13 bytes plus, per
-- result, its length + 1.
local grown = size + #result + 1 - (old and #old + 1 or 0)
if 13 + grown > cap then
  return {ST.VALUE_TOO_LARGE, 13 + grown, cap}
end

if not old and arrived + 1 == need then
  local payload = barrier_payload(barrier, key, result)
  local expires = string.format('%d', tonumber(ARGV[9]) + tonumber(ARGV[10]))
  -- (barrier_payload left the hash deleted: the results and links are in the payload now)
  redis.call('HSET', barrier, 'e', tag, 'E', ARGV[5], 'n', ARGV[4], 'c', ARGV[4],
    'd', payload, 't', token, 'z', expires)
  barrier_changed(barrier, f[7])
  redis.call('PEXPIREAT', barrier, expires)
  redis.call('ZADD', KEYS[4], expires, barrier)
  return {ST.OK, 'allow', need, need, payload, {}}
end

local grown_text = string.format('%d', grown)
barrier_changed(barrier, f[7])
if fresh then
  redis.call('HSET', barrier, 'e', tag, 'E', ARGV[5], 'n', ARGV[4])
  redis.call('ZADD', KEYS[4], '+inf', barrier)
  if named then
    barrier_link_all(barrier)
  end
end
if old then
  redis.call('HSET', barrier, 'a' .. key, result, 's', grown_text)
  return {ST.OK, 'counted', arrived, need, false, {}}
end
arrived = arrived + 1
redis.call('HSET', barrier, 'a' .. key, result, 'c', string.format('%d', arrived),
  's', grown_text)
if named then
  barrier_unlink(barrier, key)
  return {ST.OK, 'waiting', arrived, need, false, barrier_missing(barrier)}
end
return {ST.OK, 'waiting', arrived, need, false, {}}
