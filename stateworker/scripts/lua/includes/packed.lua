--[[
  An entry's stored form (helpers prefixed packed_): one Redis string, a packed head and then
  the value's JSON text. A hash of ten fields took 870 bytes of Redis memory for a 200-byte
  value (a value over hash-max-listpack-value makes the whole hash a hash table); this string
  takes the value's own allocation and ~50 bytes more. state/packed.py reads and writes the
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
  topic, plain, by, created, updated, revision}, numbers as text, false where unset, the hash
  as lowercase hex.
]]

local PACKED_PLAIN, PACKED_EXPIRES, PACKED_TOPIC, PACKED_WRITER = 1, 2, 4, 8
local PACKED_HASH, PACKED_WIDE = 16, 32
local PACKED_NARROW_HEAD, PACKED_WIDE_HEAD = '>BI3I6I6i2H', '>BI6I6I6i6I4'

-- byte -> two hex digits and back, made by the first call that needs them (the library's top
-- level cannot reach `string`)
local packed_hex, packed_raw = false, false

local function packed_tables()
  packed_hex, packed_raw = {}, {}
  for i = 0, 255 do
    local byte, hex = string.char(i), string.format('%02x', i)
    packed_hex[byte], packed_raw[hex] = hex, byte
  end
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

-- The value and the expiry (ms as a number, or false) of a stored entry: what a read needs.
local function packed_value(stored)
  local flags, _, _, _, _, _, at = packed_head(stored)
  local expires = false
  if packed_has(flags, PACKED_HASH) then
    at = at + 32
  end
  if packed_has(flags, PACKED_EXPIRES) then
    expires, at = struct.unpack('>I6', stored, at)
  end
  if packed_has(flags, PACKED_TOPIC) then
    at = at + 2 + struct.unpack('>H', stored, at)
  end
  if packed_has(flags, PACKED_WRITER) then
    at = at + 2 + struct.unpack('>H', stored, at)
  end
  return string.sub(stored, at), expires
end

local function packed_text(n)
  return string.format('%d', n)
end

-- The whole stored entry as entry.lua's `cur` (this file's header).
local function packed_read(stored)
  local flags, version, created, updated, rev_ms, rev_seq, at = packed_head(stored)
  local hash, expires, topic, by = false, false, false, false
  if packed_has(flags, PACKED_HASH) then
    if not packed_hex then packed_tables() end
    hash = string.gsub(string.sub(stored, at, at + 31), '.', packed_hex)
    at = at + 32
  end
  if packed_has(flags, PACKED_EXPIRES) then
    expires, at = struct.unpack('>I6', stored, at)
    expires = packed_text(expires)
  end
  if packed_has(flags, PACKED_TOPIC) then
    topic, at = struct.unpack('>Hc0', stored, at)
  end
  if packed_has(flags, PACKED_WRITER) then
    by, at = struct.unpack('>Hc0', stored, at)
  end
  return {string.sub(stored, at), packed_text(version), expires, hash, topic,
    packed_has(flags, PACKED_PLAIN) and '1' or false, by, packed_text(created),
    packed_text(updated), packed_text(updated + rev_ms) .. '-' .. packed_text(rev_seq)}
end

local function packed_part(text)
  return struct.pack('>H', #text) .. text
end

--[[
  The stored form of an entry. version, created, updated: numbers or their text; revision:
  "<ms>-<seq>"; hash: lowercase hex or false ('' too); expires: ms (number or text) or false;
  topic, by: text or false (an empty writer is none); plain: a boolean.
]]
local function packed_pack(value, version, created, updated, revision, hash, expires, topic,
                           by, plain)
  version, created, updated = tonumber(version), tonumber(created), tonumber(updated)
  local dash = string.find(revision, '-', 1, true)
  local rev_ms = tonumber(string.sub(revision, 1, dash - 1)) - updated
  local rev_seq = tonumber(string.sub(revision, dash + 1))
  if by == '' then by = false end
  if hash == '' then hash = false end
  local flags = (plain and PACKED_PLAIN or 0) + (expires and PACKED_EXPIRES or 0)
    + (topic and PACKED_TOPIC or 0) + (by and PACKED_WRITER or 0) + (hash and PACKED_HASH or 0)
  local head
  if version < 16777216 and rev_seq < 65536 and rev_ms >= -32768 and rev_ms < 32768 then
    head = struct.pack(PACKED_NARROW_HEAD, flags, version, created, updated, rev_ms, rev_seq)
  else
    head = struct.pack(PACKED_WIDE_HEAD, flags + PACKED_WIDE, version, created, updated, rev_ms,
      rev_seq)
  end
  local raw = ''
  if hash then
    if not packed_raw then packed_tables() end
    raw = string.gsub(hash, '..', packed_raw)
    if #raw ~= 32 then
      return error('packed_pack: a hash of ' .. #hash .. ' characters, not 64 lowercase hex')
    end
  end
  return head .. raw .. (expires and struct.pack('>I6', tonumber(expires)) or '')
    .. (topic and packed_part(topic) or '') .. (by and packed_part(by) or '') .. value
end

-- A stored entry again with another topic and revision (state::update-topic).
local function packed_retag(cur, topic, revision)
  return packed_pack(cur[1], cur[2], cur[8], cur[9], revision, cur[4], cur[3], topic, cur[7],
    cur[6] == '1')
end
