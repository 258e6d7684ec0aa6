--[[
  Write one entry's value: state::set, state::compare-and-set (a hash condition) and the write
  of state::diff. Validation (size, key length, types) is done by the caller; the only check
  here is the condition, made before the first write.
  Input:
    KEYS[1] entry hash              KEYS[2] scope key index (zset)
    KEYS[3] partition scopes (zset) KEYS[4] partition ttl index (zset)
    KEYS[5] partition event stream
    ARGV[1] scope                   ARGV[2] key
    ARGV[3] value (compact JSON)    ARGV[4] value hash
    ARGV[5] topic: "" for none, else "=" .. topic
    ARGV[6] ttl in ms, "0" for no expiry
    ARGV[7] condition: "" none | "v<N>" stored version must be N (0 = absent)
            | "h<hash>" stored value's hash must be <hash> | "a" absent or a stored null
    ARGV[8] now (epoch ms)          ARGV[9] writer: "" for none, else "=" .. writer
    ARGV[10] event stream MAXLEN    ARGV[11] ttl member (<len>:<scope><key>)
  Output:
    {ST.OK, old value or false, version, created (1/0), revision}
    {ST.CONFLICT, current version (0 = absent), current value or false}
  Events: state:created when absent, else state:updated; an expired entry in the way is
    first deleted with state:deleted.
]]
--- @include "entry"

local ctx = {
  entry = KEYS[1], keyIndex = KEYS[2], scopes = KEYS[3], ttl = KEYS[4], events = KEYS[5],
  scope = ARGV[1], key = ARGV[2], member = ARGV[11],
  now = tonumber(ARGV[8]), maxlen = ARGV[10], by = string.sub(ARGV[9], 2),
}
local value, hash, topic, ttlMs, cond = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7]

local cur = load_live(ctx)

if cond ~= '' then
  local kind, want = string.sub(cond, 1, 1), string.sub(cond, 2)
  local ok
  if kind == 'v' then
    ok = (cur and tonumber(cur[2]) or 0) == tonumber(want)
  elseif kind == 'h' then
    ok = cur ~= nil and cur[4] == want
  else
    ok = cur == nil or cur[1] == 'null'
  end
  if not ok then
    return {ST.CONFLICT, cur and tonumber(cur[2]) or 0, cur and cur[1] or false}
  end
end

local version = 1
local fields = {'v', value, 'n', version, 'h', hash, 'u', ctx.now}
if cur then
  version = tonumber(cur[2]) + 1
  fields[4] = version
else
  fields[#fields + 1] = 'c'
  fields[#fields + 1] = ctx.now
  redis.call('ZADD', ctx.keyIndex, 0, ctx.key)
  redis.call('ZADD', ctx.scopes, 0, ctx.scope)
end

local cleared = {}
if topic ~= '' then
  fields[#fields + 1] = 't'
  fields[#fields + 1] = string.sub(topic, 2)
else
  cleared[#cleared + 1] = 't'
end
if ctx.by ~= '' then
  fields[#fields + 1] = 'b'
  fields[#fields + 1] = ctx.by
else
  cleared[#cleared + 1] = 'b'
end
if ttlMs > 0 then
  local expires = ctx.now + ttlMs
  fields[#fields + 1] = 'x'
  fields[#fields + 1] = expires
  redis.call('ZADD', ctx.ttl, expires, ctx.member)
elseif cur and cur[3] then
  cleared[#cleared + 1] = 'x'
  redis.call('ZREM', ctx.ttl, ctx.member)
end

local old = cur and cur[1] or false
local rev = emit(ctx, cur and 'state:updated' or 'state:created', old or 'null', value, version)
fields[#fields + 1] = 'r'
fields[#fields + 1] = rev
redis.call('HSET', ctx.entry, unpack(fields))
if cur and #cleared > 0 then
  redis.call('HDEL', ctx.entry, unpack(cleared))
end
return {ST.OK, old, version, cur and 0 or 1, rev}
