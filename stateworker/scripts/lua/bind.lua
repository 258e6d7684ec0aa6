--[[
  Bind a bus call's id to its call (function and body) for the dedupe window, for the calls
  whose plan does not run an entry script that binds it itself (reads, in the same pipeline
  before their commands; other writes, and on a Redis Cluster a call whose id's home is not
  its scope's partition, in a step of their own). The first call to bind an id owns it.
  A write bound here (mode "w") runs in steps of its own, so its binding is also its claim
  and then its record: a retry while it runs is told so (not run again), and once it ended
  (mode "k") a retry gets its recorded reply (state/core/once.py).
  Input:
    KEYS[1] the current time slice where the id is bound (KeySpace.binding: its bucket, or on
            a cluster its home partition's records; records.lua; a hash)
    KEYS[2] "k" with the snapshot on: the unsaved kept replies of the id's home partition
            (PartitionKeys.unsaved_kept, a stream; on a cluster KEYS[1]'s slot); else none
    ARGV[1] slice length (ms)   ARGV[2] the slice's number   ARGV[3] now (epoch ms)
    ARGV[4] the record's field (12 raw bytes)   ARGV[5] the call's digest (8 raw bytes)
    ARGV[6] the mode: "r" a read's binding, kept unlogged (records_keep; decision 0058);
            "b" a binding alone; "w" a write's claim; "k" a write's reply kept; "u" a
            write's claim let go (it ran nothing that outlives the store's recovery)
    ARGV[7] "w", "k", "u": when the claim ends (epoch ms, digits); else ""
    ARGV[8] "w": the call's deadline (epoch ms, "" none); "k": the reply ("=" .. JSON
            result, or "!" .. JSON error); else ""
    ARGV[9..] "k" with KEYS[2] only: KEYS[2]'s MAXLEN, then what PostgreSQL must hold before
            the reply goes there (state/core/once.py `Needs`, msgpack; snapshot/kept.py)
  Record values: the digest alone (bound, not run); "w": digest .. "@" .. claim end (runs now;
  a claim past its end is a run that died: taken over); "k": digest .. ARGV[8].
  Output:
    {ST.OK, 1}             bound now ("w": claimed, run it; "k": the reply kept; "u": the
                           claim removed)
    {ST.OK, 0}             bound before, to this same call ("k", "u": the claim was not
                           there any more: nothing written)
    {ST.OK, 2}             "w": the same call runs now under a live claim: do not run it
    {ST.DUPLICATE, reply}  "w": the call ran: its reply (ARGV[8] as kept); nothing written
    {ST.DEADLINE_EXCEEDED} "w": not run before, and its deadline passed: nothing written
    {ST.CALL_ID_REUSED}    the id is bound to another call: nothing written
  Events: none. "k" with KEYS[2], the reply kept: one entry in KEYS[2] {f ARGV[4], v the
    record as kept, t ARGV[3] (the claim's time: its slice), n ARGV[10]}.
]]
--- @include "records"

local name, slice, field, digest = KEYS[1], ARGV[2], ARGV[4], ARGV[5]
local ms, now, mode = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[6]

if mode == 'k' or mode == 'u' then
  -- (the claim made in this very slice: a run that outlived its claim, taken over, keeps
  -- the newer run's claim or reply as they are)
  if redis.call('HGET', name, field) ~= digest .. '@' .. ARGV[7] then
    return {ST.OK, 0}
  end
  if mode == 'u' then
    redis.call('HDEL', name, field)
    return {ST.OK, 1}
  end
  redis.call('HSET', name, field, digest .. ARGV[8])
  if KEYS[2] then
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[9], '*', 'f', field, 'v', digest .. ARGV[8],
      't', ARGV[3], 'n', ARGV[10])
  end
  return {ST.OK, 1}
end

if mode ~= 'w' then
  local bound = records_bind(name, slice, field, digest, ms, now, mode == 'r')
  if not bound then
    return {ST.CALL_ID_REUSED}
  end
  return {ST.OK, bound}
end

local held, fresh = records_find(name, slice, field, ms, now)
if held then
  if string.sub(held, 1, #digest) ~= digest then
    return {ST.CALL_ID_REUSED}
  end
  local tag = string.sub(held, #digest + 1, #digest + 1)
  if tag == '=' or tag == '!' then
    return {ST.DUPLICATE, string.sub(held, #digest + 1)}
  end
  if tag == '@' and tonumber(string.sub(held, #digest + 2)) > now then
    return {ST.OK, 2}
  end
end
-- (after the record: a call applied in time is answered the same when it comes again late)
if ARGV[8] ~= '' and now > tonumber(ARGV[8]) then
  return {ST.DEADLINE_EXCEEDED}
end
records_keep(name, slice, field, digest .. '@' .. ARGV[7], ms, now, fresh, false)
return {ST.OK, 1}
