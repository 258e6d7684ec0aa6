--[[
  A barrier's change marked for the snapshot in PostgreSQL, shared by barrier.lua and
  delbarrier.lua (helpers prefixed barriermarks_). Decision 0063.
]]

-- Mark barrier hash `barrier` changed in `changed` (the partition's `barriers_changed`,
-- "<tag>barriers_changed"), which the snapshotter drains (snapshot/barriers.py), when a
-- snapshot follows the partition: its history hash holds `snapshot` (written by a service
-- with PostgreSQL before it serves, and by every round of its snapshotter). Without it the
-- set has no reader and would grow by one member a barrier for good, so nothing is added,
-- and what it holds (marks of a version before this one) goes: a snapshot added later
-- copies every barrier whole first (its rescan), marked or not.
local function barriermarks_mark(changed, barrier)
  if redis.call('HGET', string.sub(changed, 1, -17) .. 'history', 'snapshot') then
    redis.call('SADD', changed, barrier)
  else
    redis.call('UNLINK', changed)
  end
end
