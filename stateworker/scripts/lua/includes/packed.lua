--[[
  An entry's stored form (helpers prefixed packed_): one Redis string, a packed head and then
  the value's JSON text. A hash of ten fields took 870 bytes of Redis memory for a 200-byte
  value (a value over hash-max-listpack-value makes the whole hash a hash table); this string
  takes the value's own allocation and ~50 bytes more. state/kv/packed.py reads and writes the
  same form (tests/lua/test_packed.py holds the two together). Big-endian, as `struct` packs:
    B  flags: PACKED_PLAIN no string in the value holds a bracket or brace (json.lua's skip),
       PACKED_EXPIRES, PACKED_TOPIC, PACKED_WRITER, PACKED_HASH: which optional parts follow;
       PACKED_WIDE: the wide head
    narrow head: I3 version, I6 created ms, I6 updated ms, i2 revision ms - updated ms,
                 H revision sequence
    wide head (a number out of the narrow's range): I6, I6, I6, i6, I4, the same fields
    then, when flagged, in this order: 32 raw bytes of the value's SHA-256, I6 expires ms,
    H length and the topic, H length and the writer; the rest is the value.
  A loaded entry (packed_read) is entry.lua's `cur`: {value, version, expires_at, hash,
  topic, plain, by, created, updated, revision ms, revision sequence}: numbers as numbers,
  the hash as its 32 raw bytes (packed_hex gives the text callers see), plain "1", false
  where unset. Nothing is converted that a script does not ask for: reading an entry costs
  ~2.5 us, packing one ~5 with its hash's hex turned into bytes (measured in a loop in Redis;
  a hex hash and numbers as text cost 13 and 8). Topics (at most 1024 bytes: validate.py)
  and writers (256: bus/protocol.py) fit the H lengths.
]]

local PACKED_PLAIN, PACKED_EXPIRES, PACKED_TOPIC, PACKED_WRITER = 1, 2, 4, 8
local PACKED_HASH, PACKED_WIDE = 16, 32
local PACKED_NARROW_HEAD, PACKED_WIDE_HEAD = '>BI3I6I6i2H', '>BI6I6I6i6I4'

local PACKED_WORDS = '>I4I4I4I4I4I4I4I4' -- a SHA-256 as eight 4-byte numbers

-- The 64 lowercase hex digits of a raw SHA-256 (what callers see and compare).
local function packed_hex(raw)
  return string.format('%08x%08x%08x%08x%08x%08x%08x%08x', struct.unpack(PACKED_WORDS, raw))
end

-- The 32 raw bytes of a SHA-256's 64 hex digits (from Python: hashlib's hexdigest).
local function packed_unhex(hex)
  local sub = string.sub
  return struct.pack(PACKED_WORDS, tonumber(sub(hex, 1, 8), 16), tonumber(sub(hex, 9, 16), 16),
    tonumber(sub(hex, 17, 24), 16), tonumber(sub(hex, 25, 32), 16),
    tonumber(sub(hex, 33, 40), 16), tonumber(sub(hex, 41, 48), 16),
    tonumber(sub(hex, 49, 56), 16), tonumber(sub(hex, 57, 64), 16))
end

local function packed_has(flags, flag)
  return bit.band(flags, flag) ~= 0
end

-- The head of a stored entry: flags, version, created, updated, revision ms less updated,
-- revision sequence, and the position after it.
local function packed_head(stored)
  local flags = string.byte(stored, 1)
  return struct.unpack(packed_has(flags, PACKED_WIDE) and PACKED_WIDE_HEAD or PACKED_NARROW_HEAD,
    stored)
end

-- The whole stored entry as entry.lua's `cur` (this file's header).
local function packed_read(stored)
  local flags, version, created, updated, rev_ms, rev_seq, at = packed_head(stored)
  local hash, expires, topic, by = false, false, false, false
  if packed_has(flags, PACKED_HASH) then
    hash = string.sub(stored, at, at + 31)
    at = at + 32
  end
  if packed_has(flags, PACKED_EXPIRES) then
    expires, at = struct.unpack('>I6', stored, at)
  end
  if packed_has(flags, PACKED_TOPIC) then
    topic, at = struct.unpack('>Hc0', stored, at)
  end
  if packed_has(flags, PACKED_WRITER) then
    by, at = struct.unpack('>Hc0', stored, at)
  end
  return {string.sub(stored, at), version, expires, hash, topic,
    packed_has(flags, PACKED_PLAIN) and '1' or false, by, created, updated, updated + rev_ms,
    rev_seq}
end

-- The value and the expiry (ms as a number, or false) of a stored entry: what a read needs.
local function packed_value(stored)
  local cur = packed_read(stored)
  return cur[1], cur[3]
end

-- A loaded entry's revision as its text ("<ms>-<seq>": the stream id of its last event).
local function packed_revision(cur)
  return string.format('%d-%d', cur[10], cur[11])
end

local function packed_part(text)
  return struct.pack('>H', #text) .. text
end

--[[
  The stored form of an entry. value: text; version, created, updated, rev_ms, rev_seq:
  numbers (created and updated their text too); hash: the 32 raw bytes or false; expires: ms
  (a number or its text) or false; topic, by: text or false (an empty writer is none);
  plain: a boolean.
]]
local function packed_pack(value, version, created, updated, rev_ms, rev_seq, hash, expires,
                           topic, by, plain)
  created, updated = tonumber(created), tonumber(updated)
  rev_ms = rev_ms - updated
  if by == '' then by = false end
  local flags = (plain and PACKED_PLAIN or 0) + (expires and PACKED_EXPIRES or 0)
    + (topic and PACKED_TOPIC or 0) + (by and PACKED_WRITER or 0) + (hash and PACKED_HASH or 0)
  local head
  if version < 16777216 and rev_seq < 65536 and rev_ms >= -32768 and rev_ms < 32768 then
    head = struct.pack(PACKED_NARROW_HEAD, flags, version, created, updated, rev_ms, rev_seq)
  else
    head = struct.pack(PACKED_WIDE_HEAD, flags + PACKED_WIDE, version, created, updated, rev_ms,
      rev_seq)
  end
  return head .. (hash or '') .. (expires and struct.pack('>I6', tonumber(expires)) or '')
    .. (topic and packed_part(topic) or '') .. (by and packed_part(by) or '') .. value
end

-- "<ms>-<seq>" (a stream id: an XADD's reply) as its two numbers.
local function packed_stream_id(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end

-- A stored entry again with another topic and revision (state::update-topic).
local function packed_retag(cur, topic, revision)
  local rev_ms, rev_seq = packed_stream_id(revision)
  return packed_pack(cur[1], cur[2], cur[8], cur[9], rev_ms, rev_seq, cur[4], cur[3], topic,
    cur[7], cur[6] == '1')
end
