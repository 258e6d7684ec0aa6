#!lua flags=no-writes
--[[
  A snapshot batch (snapshot/rows.py): the events after the partition's position, bounded in
  count and in bytes, and the current entry of every key they changed, read at one instant
  with the transactions that came after the batch. An entry is read as it is now, so it may
  already hold a change past the batch: when that change belongs to a transaction, every other
  entry of the transaction is read here too (and, over again, those of the transactions they
  are in), so PostgreSQL gets a transaction whole or none of it, never a debit without its
  credit. The batch itself never ends inside a transaction: past its bounds it goes on to the
  transaction's last event (a transaction's events are consecutive, each with `tx` and
  `tx_size`).
  Input:
    KEYS[1] the partition's event stream
    ARGV[1] the position: the batch is the events after this id
    ARGV[2] the most events of the batch
    ARGV[3] the most bytes of the batch, about: of the events it reads and of the entries it
            returns (events carry whole values); the batch ends after the event that reaches
            it, so one event at least is taken, however large; the entries a transaction
            after it adds count against as much again
    ARGV[4] entry name prefix of the partition (partition tag .. "e:")
    ARGV[5] the most events after the batch to examine (the tail's budget)
    ARGV[6] the most bytes of events after the batch to examine (a few large ones would
            otherwise hold Redis for seconds)
  Events are read a page at a time: one at first, then as many of the size of the largest
  of the page before as make PAGE_BYTES (1 to PAGE): large events are not read far past
  where a budget ends (16 of 2 MiB were 32 MiB of Lua's memory, and ~90 ms, for each batch).
  Output:
    {ST.OK, the batch's last event id (false: no event after ARGV[1]), its events,
     more (1: the batch ended at ARGV[2] or ARGV[3], events follow it; 0: the stream's end),
     complete (1: every event after the batch was examined and every transaction found whole;
     0: a budget ended first),
     {scope, key, revision of its last change, stored entry or false, per entry: those the
      batch changed (their last change in the batch), then those a transaction after the
      batch added (their last change examined)}}
  Events: none.
]]

local stream, prefix = KEYS[1], ARGV[4]
local most, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local tail_most, tail_bytes = tonumber(ARGV[5]), tonumber(ARGV[6])
local PAGE, PAGE_BYTES = 16, 1048576

local read = {} -- member -> true: its entry is read here
local rows = {} -- per entry read: {scope, key, revision}, in the order read
local at = {} -- member -> its index in `rows`

-- The batch: its last event, its count, its bytes, and the transaction it ends in (its id,
-- its events in the batch, its size).
local last, count, bytes = false, 0, 0
local open, have, size = nil, 0, 0
local in_batch, more = true, 0
-- The events after the batch: each transaction's members, each member's last change.
local groups = {}
local later = {} -- member -> {scope, key, revision}
local group, group_tx = nil, nil
local seen, seen_bytes, complete = 0, 0, 0

local cursor, asked = '(' .. ARGV[1], 1
while true do
  local page, largest = redis.call('XRANGE', stream, cursor, '+', 'COUNT', asked), 1
  for _, entry in ipairs(page) do
    local flat, scope, key, tx, tx_size, sized = entry[2], nil, nil, nil, nil, 0
    for j = 1, #flat, 2 do
      local name = flat[j]
      sized = sized + #name + #flat[j + 1]
      if name == 'scope' then
        scope = flat[j + 1]
      elseif name == 'key' then
        key = flat[j + 1]
      elseif name == 'tx' then
        tx = flat[j + 1]
      elseif name == 'tx_size' then
        tx_size = tonumber(flat[j + 1])
      end
    end
    largest = math.max(largest, sized)
    local member = scope and key and (#scope .. ':' .. scope .. key)
    if in_batch and count > 0 and (count >= most or bytes >= max_bytes)
        and not (open and tx == open and have < size) then
      in_batch, more = false, 1 -- (full, and not inside a transaction: this event is after it)
    end
    if in_batch then
      last, count, bytes = entry[1], count + 1, bytes + sized
      if member then
        if not read[member] then
          read[member] = true
          rows[#rows + 1] = {scope, key, entry[1]}
          at[member] = #rows
          bytes = bytes + redis.call('STRLEN', prefix .. member)
        else
          rows[at[member]][3] = entry[1]
        end
      end
      if tx and tx == open then
        have = have + 1
      elseif tx then
        open, have, size = tx, 1, tx_size or 0
      else
        open = nil
      end
    else
      seen, seen_bytes = seen + 1, seen_bytes + sized
      if member then
        later[member] = {scope, key, entry[1]}
        if tx and tx == group_tx then
          group[#group + 1] = member
        elseif tx then
          group, group_tx = {member}, tx
          groups[#groups + 1] = group
        else
          group_tx = nil
        end
      end
    end
    cursor = '(' .. entry[1]
  end
  if #page < asked then
    complete = 1
    break
  end
  if not in_batch and (seen >= tail_most or seen_bytes >= tail_bytes) then
    break
  end
  asked = math.max(1, math.min(PAGE, math.floor(PAGE_BYTES / largest)))
end

-- Every transaction after the batch that wrote an entry read is read whole, until none is
-- left half read; their entries count against a budget of their own (as much as the batch's):
-- past it the rest is left (complete = 0) rather than the reply grown without bound.
local added_bytes, grew = 0, true
while grew do
  grew = false
  for g = 1, #groups do
    local members = groups[g]
    if members then
      local touches = false
      for _, member in ipairs(members) do
        if read[member] then
          touches = true
          break
        end
      end
      if touches and added_bytes >= max_bytes then
        complete, grew = 0, false
        break
      end
      if touches then
        for _, member in ipairs(members) do
          if not read[member] then
            read[member] = true
            rows[#rows + 1] = later[member]
            added_bytes = added_bytes + redis.call('STRLEN', prefix .. member)
            grew = true
          end
        end
        groups[g] = false
      end
    end
  end
end

local flat = {}
for _, row in ipairs(rows) do
  local n = #flat
  flat[n + 1], flat[n + 2], flat[n + 3] = row[1], row[2], row[3]
  flat[n + 4] = redis.call('GET', prefix .. #row[1] .. ':' .. row[1] .. row[2]) or false
end
return {ST.OK, last, count, more, complete, flat}
