--[[
  Bind a bus call's id to its call (function and body) for the dedupe window, for the calls
  whose plan does not run an entry script that binds it itself (reads, in the same pipeline
  before their commands; other writes, and on a Redis Cluster a call whose id's home is not
  its scope's partition, in a step of their own). The first call to bind an id owns it.
  Input:
    KEYS[1] the current time slice where the id is bound (KeySpace.binding: its bucket, on a
            cluster its home partition's records; records.lua; a hash)
    ARGV[1] slice length (ms)   ARGV[2] the slice's number   ARGV[3] now (epoch ms)
    ARGV[4] the record's field (12 raw bytes)   ARGV[5] the call's digest (8 raw bytes)
    ARGV[6] "r": a read's binding, kept unlogged (records_keep; decision 0058), else ""
  Output:
    {ST.OK, 1}            bound now
    {ST.OK, 0}            bound before, to this same call
    {ST.CALL_ID_REUSED}   the id is bound to another call: nothing written
  Events: none.
]]
--- @include "records"

local bound = records_bind(KEYS[1], ARGV[2], ARGV[4], ARGV[5], tonumber(ARGV[1]),
  tonumber(ARGV[3]), ARGV[6] == 'r')
if not bound then
  return {ST.CALL_ID_REUSED}
end
return {ST.OK, bound}
