--[[
  Entry helpers shared by the mutating scripts; their names start with entry_ (constants:
  ENTRY_), so a reader of a script knows where they come from. A `ctx` holds the names and
  arguments of the entry being changed:
    ctx.entry, ctx.keyIndex, ctx.updIndex, ctx.topicIndex  -- entry, scope indexes
    ctx.scopes, ctx.ttl, ctx.events                        -- partition indexes and stream
    ctx.scope, ctx.key, ctx.member                         -- the entry's address
    ctx.now, ctx.stamp, ctx.maxlen, ctx.by  -- call time (ms; as a number and as its text),
                                            -- stream cap, writer
    ctx.tp                                  -- a traced call's traceparent (false: untraced)
    ctx.rev, ctx.rev1, ctx.key1             -- the revision of the call's last and first event,
                                            -- and the member of its first change's entry
  Numbers go to redis.call as text: Redis 7.0 turns a Lua number argument into text with
  printf("%.17g"), a visible part of a small script's time.
  An entry is one string (packed.lua); a loaded entry `cur` is {value, version, expires_at,
  hash, topic, plain, by, created, updated, revision ms, revision sequence} (packed_read:
  numbers as numbers, the hash as 32 raw bytes), a field that is not set false. `plain` =
  "1" marks a value with no bracket or brace inside a string (json.lua's fast container
  skip).
  Input of an entry script (a script whose header says `@arguments entry`), before its own:
    KEYS[1] entry                   KEYS[2] scope key index (zset, score 0)
    KEYS[3] scope updated index     KEYS[4] scope topic index (zset, topic\0key)
    KEYS[5] partition scopes        KEYS[6] partition ttl index
    KEYS[7] partition event stream
    KEYS[8] (bus calls only) the current slice of the call's records (entry_begin)
    KEYS[9] (bus calls, snapshot on) the partition's records to save (entry_begin)
    ARGV[1] scope                   ARGV[2] key
    ARGV[3] ttl member (<len>:<scope><key>)
    ARGV[4] now (epoch ms)          ARGV[5] event stream MAXLEN
    ARGV[6] writer ("" for none; a traced call's also names its traceparent: entry_writer)
    ARGV[7] the call's record arguments ("" for none; whether the script answers the call:
            entry_begin)
]]

--- @include "packed"

--[[
  The partition's record of each scope's last change (keys.py `written`: the partition tag
  .. "written", the tag being ctx.scopes less its "scopes"), kept past the scope's last
  entry: state::claim-namespace refuses a scope written within the dedupe window. One ZADD
  a change; the reaper drops members older than the window.
]]
local function entry_mark_written(ctx)
  redis.call('ZADD', string.sub(ctx.scopes, 1, -7) .. 'written', ctx.stamp, ctx.scope)
end

-- A traced call's event (entry_emit): the fields of the others, then `tp`, the traceparent
-- of the service's span of the call (a trigger's delivery continues its trace). A table per
-- event, for traced calls only.
local function entry_emit_traced(ctx, etype, old, new, version)
  local args = {ctx.events, 'MAXLEN', '~', ctx.maxlen, '*',
    'type', etype, 'scope', ctx.scope, 'key', ctx.key,
    'old_value', old, 'new_value', new, 'version', version,
    'ts_ms', ctx.stamp, 'by', ctx.by}
  if ctx.tx then
    args[#args + 1], args[#args + 2] = 'tx', ctx.tx
    args[#args + 1], args[#args + 2] = 'tx_size', ctx.txsize
  end
  args[#args + 1], args[#args + 2] = 'tp', ctx.tp
  ctx.rev = redis.call('XADD', unpack(args))
  if not ctx.rev1 then
    ctx.rev1, ctx.key1 = ctx.rev, ctx.member
  end
  return ctx.rev
end

-- Append one change event; its stream id is the revision, returned. A transaction's events
-- (ctx.tx set: its id, ctx.txsize its number of events) carry both, so a reader can tell
-- they belong together and whether it has them all; a traced call's carry `tp` too.
local function entry_emit(ctx, etype, old, new, version)
  entry_mark_written(ctx)
  if ctx.tp then
    return entry_emit_traced(ctx, etype, old, new, version)
  end
  if ctx.tx then
    ctx.rev = redis.call('XADD', ctx.events, 'MAXLEN', '~', ctx.maxlen, '*',
      'type', etype, 'scope', ctx.scope, 'key', ctx.key,
      'old_value', old, 'new_value', new, 'version', version,
      'ts_ms', ctx.stamp, 'by', ctx.by, 'tx', ctx.tx, 'tx_size', ctx.txsize)
    if not ctx.rev1 then
    ctx.rev1, ctx.key1 = ctx.rev, ctx.member
  end
    return ctx.rev
  end
  ctx.rev = redis.call('XADD', ctx.events, 'MAXLEN', '~', ctx.maxlen, '*',
    'type', etype, 'scope', ctx.scope, 'key', ctx.key,
    'old_value', old, 'new_value', new, 'version', version,
    'ts_ms', ctx.stamp, 'by', ctx.by)
  if not ctx.rev1 then
    ctx.rev1, ctx.key1 = ctx.rev, ctx.member
  end
  return ctx.rev
end

-- The topic index holds the tagged entries: "<topic>\0<key>". An untagged entry has no member
-- there (it would cost Redis a hundred bytes): state::list-entries in topic order walks the
-- key index for them after every topic (entries.lua), as "\255\0<key>" (no UTF-8 text holds
-- the byte 255).
local function entry_topic_member(topic, key)
  return topic .. '\0' .. key
end

-- Keep the topic index true for an entry whose topic goes from `old` to `new` (either false:
-- untagged).
local function entry_retopic(ctx, old, new)
  if old == new then
    return
  end
  if old then
    redis.call('ZREM', ctx.topicIndex, entry_topic_member(old, ctx.key))
  end
  if new then
    redis.call('ZADD', ctx.topicIndex, '0', entry_topic_member(new, ctx.key))
  end
end

--- @include "indexes"

-- Remove the entry and every index member that points at it.
local function entry_unlink(ctx, cur)
  indexes_change(ctx, cur[1], false)
  redis.call('DEL', ctx.entry)
  redis.call('ZREM', ctx.keyIndex, ctx.key)
  redis.call('ZREM', ctx.updIndex, ctx.key)
  entry_retopic(ctx, cur[5], false)
  if cur[3] then
    redis.call('ZREM', ctx.ttl, ctx.member)
  end
  if redis.call('ZCARD', ctx.keyIndex) == 0 then
    redis.call('ZREM', ctx.scopes, ctx.scope)
  end
end

-- Delete the stored entry `cur` with its state:deleted event; the event's revision.
local function entry_delete(ctx, cur)
  entry_unlink(ctx, cur)
  return entry_emit(ctx, 'state:deleted', cur[1], 'null', string.format('%d', cur[2]))
end

-- The stored entry or nil, and whether its expiry has passed (it reads as missing then).
-- Nothing is written: a script that must check all before it writes (a transaction) loads
-- with this and drops an expired entry (entry_drop_expired) once every check has passed.
local function entry_load(ctx)
  local stored = redis.call('GET', ctx.entry)
  if not stored then
    return nil, false
  end
  local cur = packed_read(stored)
  return cur, cur[3] and cur[3] <= ctx.now
end

-- Delete an entry whose expiry has passed, with the state:deleted event the reaper would
-- have written (by = "", no transaction's id and no trace: the expiry is not the call's).
local function entry_drop_expired(ctx, cur)
  local by, tx, tp = ctx.by, ctx.tx, ctx.tp
  ctx.by, ctx.tx, ctx.tp = '', false, false
  entry_delete(ctx, cur)
  ctx.by, ctx.tx, ctx.tp = by, tx, tp
end

-- The live entry or nil. An entry whose expiry has passed is deleted here (entry_drop_expired).
local function entry_load_live(ctx)
  local cur, expired = entry_load(ctx)
  if expired then
    entry_drop_expired(ctx, cur)
    return nil
  end
  return cur
end

--[[
  KEY_LIMIT (a scope's `max_keys`, KeeperHub's ceiling): nil when the write may go on, else
  the reply {ST.KEY_LIMIT, live keys, limit}. Only a write that creates a key counts (`cur`
  nil); `max` is the limit as text, '' for none. Live keys: the scope's key index less its
  entries whose expiry has passed and which the reaper has not deleted yet (an expired key
  frees its slot at once). Those are read only when the index is at the limit already.
]]
local function entry_key_limit(ctx, cur, max)
  if cur or max == '' then
    return nil
  end
  local limit = tonumber(max)
  local live = redis.call('ZCARD', ctx.keyIndex)
  if live < limit then
    return nil
  end
  local prefix = string.sub(ctx.member, 1, #ctx.member - #ctx.key) -- "<len>:<scope>"
  for _, due in ipairs(redis.call('ZRANGEBYSCORE', ctx.ttl, '-inf', ctx.stamp)) do
    if string.sub(due, 1, #prefix) == prefix then -- (length-prefixed: this scope's only)
      live = live - 1
    end
  end
  if live < limit then
    return nil
  end
  return {ST.KEY_LIMIT, live, limit}
end

--[[
  Write `value` as the entry's new value, keep every index true and append the event.
  hash      the value's canonical hash, or false when unknown (computed later by Python)
  topic     the scripts' topic argument: '~' keep the current topic, '-' no topic,
            '=' .. t: topic t
  ttl       false: keep the current expiry; 0: no expiry; n > 0: expire n ms from now
  plain     true when no string in the value holds a bracket or brace
  (Arguments, not an options table: every table a call makes is garbage to collect.)
  Returns version, revision.
]]
local function entry_write(ctx, cur, value, hash, topic, ttl, plain)
  local version = cur and tonumber(cur[2]) + 1 or 1
  if not cur then
    redis.call('ZADD', ctx.keyIndex, '0', ctx.key)
    redis.call('ZADD', ctx.scopes, '0', ctx.scope)
  end
  redis.call('ZADD', ctx.updIndex, ctx.stamp, ctx.key)
  indexes_change(ctx, cur and cur[1] or false, value)

  local oldTopic = cur and cur[5] or false
  local newTopic = oldTopic
  if topic ~= '~' then
    newTopic = topic ~= '-' and string.sub(topic, 2) or false
  end
  entry_retopic(ctx, oldTopic, newTopic)

  local expires = cur and cur[3] or false
  if ttl and ttl > 0 then
    expires = string.format('%d', ctx.now + ttl)
    redis.call('ZADD', ctx.ttl, expires, ctx.member)
  elseif ttl == 0 and expires then
    expires = false
    redis.call('ZREM', ctx.ttl, ctx.member)
  end

  local version_text = string.format('%d', version)
  local rev = entry_emit(ctx, cur and 'state:updated' or 'state:created',
    cur and cur[1] or 'null', value, version_text)
  local rev_ms, rev_seq = packed_stream_id(rev)
  redis.call('SET', ctx.entry, packed_pack(value, version, cur and cur[8] or ctx.stamp,
    ctx.stamp, rev_ms, rev_seq, hash and hash ~= '' and packed_unhex(hash), expires, newTopic,
    ctx.by, plain))
  return version, rev
end

--[[
  The ctx of an entry script's call: the entry its KEYS and first ARGV address (this file's
  header).
  All of entry.lua's per-call state, in one library table (the library outlives calls, and
  a call never outlives the next), refilled whole by entry_begin: no table to make and
  collect per call. It is not emptied at the end of a call: its fields are the call's KEYS
  and ARGV (and `now`), which the library's KEYS and ARGV hold until the next call anyway,
  so emptying it would free nothing and cost every call.
]]
local entry_ctx = { -- (every field named here: its slots are made once)
  entry = false, keyIndex = false, updIndex = false, topicIndex = false,
  scopes = false, ttl = false, events = false,
  scope = false, key = false, member = false,
  now = false, stamp = false, maxlen = false, by = false, tp = false,
  rev = false, -- the revision of the call's last event (false: no change yet)
  tx = false, txsize = false, -- a transaction's id and number of events (false: none)
  dropped = 0, -- bytes of the value entry_delete_key deleted last (a batch's budget)
  fresh = false, -- the call's record slice is new (records.lua)
  answer = false, -- the script writes the call's reply itself (answer.lua)
}

--- @include "records"

--[[
  Exactly once per call id. An entry script called for a bus call gets KEYS[8], the current
  time slice of the call's records (records.lua: `<name><slice>`, a hash; on one Redis the
  slice of the id's own bucket, which also binds the id across partitions; on a Redis Cluster
  the partition's, which binds the id when it is the id's home, else it was bound before in
  a step of its own: KeySpace.id_home) and ARGV[7] =
  "<slice ms>|<deadline ms or empty>|<slice>|<answer>|<field><digest>" (12 + 8 raw bytes:
  records.lua; <answer>: "" the service answers the call, "a" this script does, with the
  last six ARGV (answer.lua), "c" the same on a cluster once answer_here has checked).
  A record found with the same digest and a reply is {ST.DUPLICATE, reply}, nothing changed;
  another digest is {ST.CALL_ID_REUSED}. The reply is recorded in the same script as the
  change, so the two cannot part. With KEYS[9] (the snapshot is on), a call that changed the
  entry also appends its record, the revision of its first change (ctx.rev1), that entry's
  member (ctx.key1) and its time to the partition's stream of records PostgreSQL does not hold
  yet (fields f, v, r, k, t): the snapshot commits it with the batch whose rows hold its
  first change (snapshot/calls.py), so a restore brings it back with it. The deadline is checked
  after the record: a call applied in time gets its reply again when it comes late.
]]
local ENTRY_DIGEST = 8 -- raw bytes of the call's digest in its record

local function entry_record_args()
  if ARGV[7] == '' then
    return nil -- no call record and no deadline (a call made in-process)
  end
  local arg = ARGV[7]
  local a = string.find(arg, '|', 1, true)
  local b = string.find(arg, '|', a + 1, true)
  local c = string.find(arg, '|', b + 1, true)
  local d = string.find(arg, '|', c + 1, true) or #arg + 1
  local tail = string.sub(arg, d + 1)
  return tonumber(string.sub(arg, 1, a - 1)), tonumber(string.sub(arg, a + 1, b - 1)),
    string.sub(arg, b + 1, c - 1), string.sub(tail, 1, #tail - ENTRY_DIGEST),
    string.sub(tail, -ENTRY_DIGEST), string.sub(arg, c + 1, d - 1)
end

local function entry_replayed()
  if not KEYS[8] then
    return nil
  end
  local ms, _, slice, field, digest = entry_record_args()
  local held, fresh = records_find(KEYS[8], slice, field, ms, tonumber(ARGV[4]))
  entry_ctx.fresh = fresh
  if not held then
    return nil
  end
  if string.sub(held, 1, ENTRY_DIGEST) ~= digest then
    return {ST.CALL_ID_REUSED}
  end
  if #held > ENTRY_DIGEST then
    return {ST.DUPLICATE, string.sub(held, ENTRY_DIGEST + 1)}
  end
  return nil -- bound to this very call, not run yet
end

-- The writer argument of the scripts that write events (scripts/bindings.py writer_arg): the
-- writer ("" none), or "\0" <traceparent> "\0" <writer> for a traced call (an empty
-- traceparent: a writer that begins with NUL). Returns the writer and the traceparent or
-- false.
local function entry_writer(arg)
  if string.byte(arg, 1) ~= 0 then
    return arg, false
  end
  local z = string.find(arg, '\0', 2, true)
  local tp = string.sub(arg, 2, z - 1)
  return string.sub(arg, z + 1), tp ~= '' and tp
end

--- @include "answer"

-- (a write to a Redis that lost its data is refused first: entry_start)
--- @include "generation"

-- The start of every entry script, before it reads the entry: {ST.DUPLICATE, ...} when the
-- call ran before (or {ST.DEADLINE_EXCEEDED}), else the entry's ctx (entry_ctx, filled for
-- this call).
local function entry_start()
  if generation_lost(string.sub(KEYS[5], 1, -7)) then
    return {ST.STORE_LOST}
  end
  local dup = entry_replayed()
  if dup then
    return dup
  end
  local _, deadline, _, _, _, answer = entry_record_args()
  if deadline and tonumber(ARGV[4]) > deadline then
    return {ST.DEADLINE_EXCEEDED}
  end
  local ctx = entry_ctx
  ctx.answer = (answer == 'a' or answer == 'c') and answer_here(answer == 'c')
  ctx.entry, ctx.keyIndex, ctx.updIndex, ctx.topicIndex = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  ctx.scopes, ctx.ttl, ctx.events = KEYS[5], KEYS[6], KEYS[7]
  ctx.scope, ctx.key, ctx.member = ARGV[1], ARGV[2], ARGV[3]
  ctx.now, ctx.stamp, ctx.maxlen = tonumber(ARGV[4]), ARGV[4], ARGV[5]
  ctx.by, ctx.tp = entry_writer(ARGV[6])
  ctx.rev, ctx.rev1, ctx.tx, ctx.txsize = false, false, false, false
  return nil, ctx
end

-- entry_start, then the entry's live value (nil when absent).
local function entry_begin()
  local dup, ctx = entry_start()
  if dup then
    return dup
  end
  return nil, ctx, entry_load_live(ctx)
end

-- Point the ctx at another key of the same scope (scripts over several keys): `prefix` is
-- the scope's entry name prefix, `ttl_prefix` its ttl member prefix (<len>:<scope>).
local function entry_at(ctx, prefix, ttl_prefix, key)
  ctx.entry, ctx.key, ctx.member = prefix .. key, key, ttl_prefix .. key
end

-- Delete `key` of the ctx's scope (entry_at's prefixes) when it is live, with its event: 1,
-- else 0 (an entry whose expiry passed is dropped as expired, and not counted).
-- ctx.dropped: the bytes of the value deleted, expired or not (it went into an event): a
-- batch's budget counts them.
local function entry_delete_key(ctx, prefix, ttl_prefix, key)
  entry_at(ctx, prefix, ttl_prefix, key)
  local cur, expired = entry_load(ctx)
  ctx.dropped = cur and #cur[1] or 0
  if not cur then
    return 0
  end
  if expired then
    entry_drop_expired(ctx, cur)
    return 0
  end
  entry_delete(ctx, cur)
  return 1
end

--[[
  The ctx of a script over many entries of one scope that keeps no call record (deltopic):
  the scope's indexes, the partition's keys and the call's time, stream cap and writer
  argument (entry_writer); each entry is then addressed with entry_at. (entry_ctx: no table
  per entry.)
]]
local function entry_scope_ctx(keyIndex, updIndex, topicIndex, scopes, ttl, events, scope, now,
                               maxlen, by)
  local ctx = entry_ctx
  ctx.keyIndex, ctx.updIndex, ctx.topicIndex = keyIndex, updIndex, topicIndex
  ctx.scopes, ctx.ttl, ctx.events, ctx.scope = scopes, ttl, events, scope
  ctx.now, ctx.stamp, ctx.maxlen = tonumber(now), now, maxlen
  ctx.by, ctx.tp = entry_writer(by)
  ctx.rev, ctx.rev1, ctx.tx, ctx.txsize = false, false, false, false
  return ctx
end

-- The end of a call that entry_begin started: its reply, recorded when the call has a record.
local function entry_finish(reply)
  if KEYS[8] then
    local ms, _, slice, field, digest = entry_record_args()
    local value = digest .. cmsgpack.pack(reply)
    records_keep(KEYS[8], slice, field, value, ms, entry_ctx.now, entry_ctx.fresh)
    if KEYS[9] and KEYS[9] ~= KEYS[8] and entry_ctx.rev then
      redis.call('XADD', KEYS[9], 'MAXLEN', '~', entry_ctx.maxlen, '*',
        'f', field, 'v', value, 'r', entry_ctx.rev1, 'k', entry_ctx.key1, 't', entry_ctx.stamp)
    end
  end
  return reply
end

-- The version of the live entry `cur` (0: absent).
local function entry_version(cur)
  return cur and tonumber(cur[2]) or 0
end

-- The end of a call whose condition on the live entry `cur` does not hold: {ST.CONFLICT, its
-- version (0 = absent), its value or false}, recorded.
local function entry_conflict(cur)
  return entry_finish({ST.CONFLICT, entry_version(cur), cur and cur[1] or false})
end

-- A call's expected version `want` ("" for none) against the live entry `cur`: its CONFLICT
-- reply (entry_conflict) when the entry is not at that version, else nil.
local function entry_expect(cur, want)
  if want ~= '' and entry_version(cur) ~= tonumber(want) then
    return entry_conflict(cur)
  end
  return nil
end

-- A bus call answered by its own script (answer.lua; entry_ctx.answer, from ARGV[7]): its
-- result sent, {ST.ANSWERED}.
local function entry_answer(result)
  return answer_send(result)
end
