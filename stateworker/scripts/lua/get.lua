--[[
  state::get of a bus call on one Redis, answered here (context.Answer): the call's id bound
  as bind.lua binds it, the entry read, the reply sent and the call's entry acknowledged
  (answer.lua): one script, where bind.lua, an HMGET and the service's flush took two round
  trips.
  Input:
    KEYS[1] the current time slice of the id's bucket of records (records.lua; a hash)
    KEYS[2] the entry (packed.lua)   KEYS[3] the reply list   KEYS[4] the call's stream
    ARGV[1] slice length (ms)   ARGV[2] the slice's number   ARGV[3] now (epoch ms)
    ARGV[4] the record's field (12 raw bytes)   ARGV[5] the call's digest (8 raw bytes)
    ARGV[6] the reply list's expiry (ms)   ARGV[7] the consumer group   ARGV[8] the entry's id
    ARGV[9] the reply document's head
  Output:
    {ST.ANSWERED}          the stored value (null when missing or expired) sent as the reply
    {ST.CALL_ID_REUSED}    the id is bound to another call: nothing written, nothing sent
  Events: none.
]]
--- @include "records"
--- @include "answer"
--- @include "packed"

local now = tonumber(ARGV[3])
if not records_bind(KEYS[1], ARGV[2], ARGV[4], ARGV[5], tonumber(ARGV[1]), now) then
  return {ST.CALL_ID_REUSED}
end
local stored = redis.call('GET', KEYS[2])
local value = 'null'
if stored then
  local expires
  value, expires = packed_value(stored)
  if expires and expires <= now then
    value = 'null'
  end
end
return answer_send(KEYS[3], KEYS[4], value)
