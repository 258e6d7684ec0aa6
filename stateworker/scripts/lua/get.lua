#!lua flags=allow-cross-slot-keys
--[[
  state::get of a bus call, answered here (context.Answer): the call's id bound as bind.lua
  binds a read's (unlogged: decision 0058), the entry read, the reply sent and the call's
  entry acknowledged (answer.lua): one script, where bind.lua, a GET and the service's flush
  took two round trips.
  Input:
    KEYS[1] the current time slice where the id is bound (records.lua; a hash: on one Redis
            the id's bucket, on a cluster its home partition's records, the entry's slot)
    KEYS[2] the entry (packed.lua)
    ARGV[1] slice length (ms)   ARGV[2] the slice's number   ARGV[3] now (epoch ms)
    ARGV[4] the record's field (12 raw bytes)   ARGV[5] the call's digest (8 raw bytes)
    ARGV[6] "c": on a cluster, send the reply only when its names are on this node
            (answer_here), else "" (one Redis)
    ARGV[7..12] the six that answer the call (lua/includes/answer.lua's Input), always
  Output:
    {ST.ANSWERED}          the stored value (null when missing or expired) sent as the reply
    {ST.UNHEARD, value}    the same value, published to no one: the service answers
    {ST.OK, value}         the same value, not sent: the reply list or the stream is on
                           another node (a slot moved since the service's map), so the
                           service answers
    {ST.CALL_ID_REUSED}    the id is bound to another call: nothing written, nothing sent
    {ST.STORE_LOST, prefix, 1 or 0} the partition's data is lost or a restore writes it back
    (1): nothing read, no id bound, nothing sent (generation.lua generation_read_refused)
  Events: none.
]]
--- @include "generation"
--- @include "records"
--- @include "answer"
--- @include "packed"

local refused = generation_read_refused(KEYS[2])
if refused then
  return refused
end
local now = tonumber(ARGV[3])
local here = answer_here(ARGV[6] == 'c')
if not records_bind(KEYS[1], ARGV[2], ARGV[4], ARGV[5], tonumber(ARGV[1]), now, true) then
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
if not here then
  return {ST.OK, value}
end
return answer_send(value)
