#!lua flags=no-writes
--[[
  The entries a snapshot batch commits, read at one instant with the transactions that came
  after the batch (snapshot/rows.py). An entry is read as it is now, so it may already hold a
  change past the batch: when that change belongs to a transaction, every other entry of the
  transaction is read here too (and, over again, those of the transactions they are in), so
  PostgreSQL gets a transaction whole or none of it, never a debit without its credit.
  Input:
    KEYS[1] the partition's event stream
    ARGV[1] the batch's last event id (the events after it are examined)
    ARGV[2] the most events after it to examine (the budget)
    ARGV[3] entry name prefix of the partition (partition tag .. "e:")
    ARGV[4] the most bytes of events after it to examine (events carry whole values: a few
            large ones would otherwise hold Redis for seconds); read 16 events at a time
    ARGV[5..] the members (<len>:<scope><key>) of the entries the batch changed
  Output:
    {ST.OK, complete (1: every event after ARGV[1] was examined; 0: a budget ended first),
     {stored entry or false, per member of ARGV[5..]},
     {scope, key, revision of its last change, stored entry or false, per entry added: one of
      a transaction after the batch that wrote an entry read here}}
  Events: none.
]]

local stream, budget, prefix, max_bytes = KEYS[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local PAGE = 16
local MEMBERS = 5 -- the first of the members in ARGV

local read = {} -- member -> true: read here
for i = MEMBERS, #ARGV do
  read[ARGV[i]] = true
end

-- The events after the batch: each transaction's members, and each member's last change.
local groups = {} -- per transaction: its members
local last = {} -- member -> {scope, key, revision}
local group, group_tx = nil, nil
local cursor, seen, bytes, complete = '(' .. ARGV[1], 0, 0, 0
while true do
  local page = redis.call('XRANGE', stream, cursor, '+', 'COUNT', PAGE)
  for _, entry in ipairs(page) do
    local flat, scope, key, tx = entry[2], nil, nil, nil
    for j = 1, #flat, 2 do
      local name = flat[j]
      bytes = bytes + #name + #flat[j + 1]
      if name == 'scope' then
        scope = flat[j + 1]
      elseif name == 'key' then
        key = flat[j + 1]
      elseif name == 'tx' then
        tx = flat[j + 1]
      end
    end
    if scope and key then
      local member = #scope .. ':' .. scope .. key
      last[member] = {scope, key, entry[1]}
      if tx and tx == group_tx then
        group[#group + 1] = member
      elseif tx then
        group, group_tx = {member}, tx
        groups[#groups + 1] = group
      else
        group_tx = nil
      end
    end
    cursor = '(' .. entry[1]
  end
  seen = seen + #page
  if #page < PAGE then
    complete = 1
    break
  end
  if seen >= budget or bytes >= max_bytes then
    break
  end
end

-- Every transaction that wrote an entry read is read whole, until none is left half read.
local added = {}
local grew = true
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
      if touches then
        for _, member in ipairs(members) do
          if not read[member] then
            read[member] = true
            added[#added + 1] = member
            grew = true
          end
        end
        groups[g] = false
      end
    end
  end
end

local stored = {}
for i = MEMBERS, #ARGV do
  stored[i - MEMBERS + 1] = redis.call('GET', prefix .. ARGV[i]) or false
end
local more = {}
for _, member in ipairs(added) do
  local change = last[member]
  local n = #more
  more[n + 1], more[n + 2], more[n + 3] = change[1], change[2], change[3]
  more[n + 4] = redis.call('GET', prefix .. member) or false
end
return {ST.OK, complete, stored, more}
