--[[
  Several entries of one scope as one atomic unit (state::transaction): the `compare` items
  choose the branch (all hold: `ops`, else `else_ops`); every precondition of the branch's ops
  is checked and every new value built before the first write, so a failed op leaves the
  store as it was: no value, version, index or event changes.
  With no transaction id (ARGV[10] ""), each op stands on its own (state::set-many,
  state::delete-many): a failed op is left out and named, the others are written, and their
  events carry no `tx`.
  Input:
    @arguments entry (lua/includes/entry.lua), its entry, key and ttl member the
      transaction's first key's (every other entry is the prefix below .. <len>:<scope><key>,
      in the same slot), then
    ARGV[8] entry name prefix of the scope (partition tag .. "e:" .. <len>:<scope>)
    ARGV[9] ttl member prefix of the scope (<len>:<scope>)
    ARGV[10] the transaction's id (its events' `tx`); "" each op on its own
    ARGV[11] max value bytes (an update's result)
    ARGV[12] max live keys of the scope when the transaction creates keys ("" for no limit)
    ARGV[13] C, ARGV[14] T, ARGV[15] E: the number of compare items, ops and else ops
    ARGV[16] the call's budget: bytes of values its ops may read and write (max_call_bytes)
    ARGV[17..] the C + T + E items, each its kind, its key and its kind's ARGV:
      check   version ("" or N: the stored version must be N, 0 = absent), hash ("" or the
              stored value's hash), presence ("" | "e" present | "a" absent)
      set     value, hash, topic ("~" | "-" | "=" .. topic), ttl ms ("0" none), condition
              ("" | "v<N>", -1 never holds), plain ("1": no bracket or brace in a string)
      cas     value, hash, condition ("a" absent or a stored null | "h<hash>"), plain
      delete  expected version ("" or N)
      update  expected version, topic, ttl ms ("" keep), plain, number of ops, 3 ARGV per op
              (update.lua's)
  Output:
    {ST.OK, branch (1 ops, 0 else ops), revision of the last event or false, ARGV[10], then
     4 per op of the branch: old value or false, an update's new value or false, version
     after (0: absent), created (1/0); last, the failed ops (each op on its own): index,
     status (CONFLICT: current version and value; KEY_LIMIT: live keys and limit), 2 values}
    {ST.TX_ABORTED, branch, op index in the branch, status, ...}: that op failed; nothing
      written. The status and what follows it:
      status CONFLICT, current version (0 = absent), current value or false
      status VALUE_TOO_LARGE, size of an update's new value
      status KEY_LIMIT, live keys, limit
      status OP_FAILED, op position among the update's ops, code, detail (update.lua's)
    {ST.CALL_TOO_LARGE, op index, bytes by then, ARGV[16]}: the stored values the ops read
      and the new values they write pass the budget (checked before an update is applied
      and after each op); nothing written, in `each` mode too
    {ST.NEEDS_HASH, key, current version, current value}   a hash condition on a stored hash
      that is unknown (after an update): the caller stores it and retries (not recorded)
    {ST.DUPLICATE, record}    the call was run before: its reply, nothing changed
    {ST.DEADLINE_EXCEEDED}    the call's deadline passed (and it never ran): nothing written
  Every reply but NEEDS_HASH is recorded in KEYS[8] when given (entry.lua).
  Events: per op that changes its entry, in op order, state:created / state:updated /
    state:deleted as the single-entry scripts write them, each with `tx` (ARGV[10]) and
    `tx_size` (the number of such events); an expired entry a committed transaction meets is
    first deleted with the reaper's state:deleted (no `tx`).
]]
--- @include "entry"
--- @include "ops"

local WIDTH = {check = 3, set = 6, cas = 4, delete = 1}

-- The ARGV index after the item at `at` (its kind at `at`, its key at `at` + 1).
local function next_item(at)
  local kind = ARGV[at]
  if kind == 'update' then
    return at + 7 + 3 * tonumber(ARGV[at + 6])
  end
  return at + 2 + WIDTH[kind]
end

-- nil when the check at `at` holds on `cur`; else 'conflict', or 'hash' when it needs the
-- stored hash and the entry has none yet.
local function check_fails(at, cur)
  local version, hash, presence = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  if version ~= '' and entry_version(cur) ~= tonumber(version) then
    return 'conflict'
  end
  if presence == 'e' and not cur or presence == 'a' and cur then
    return 'conflict'
  end
  if hash ~= '' then
    if not cur then
      return 'conflict'
    end
    if not cur[4] then
      return 'hash'
    end
    if packed_hex(cur[4]) ~= hash then
      return 'conflict'
    end
  end
  return nil
end

local function conflict(cur)
  return {ST.CONFLICT, entry_version(cur), cur and cur[1] or false}
end

--[[
  The op at `at` (its key `key`, its entry `cur`: nil when absent) checked and planned:
  {kind, key, cur, value, hash, topic, ttl, plain, writes} and nil, or that table (writing
  nothing) and its failure: {status, ...} as TX_ABORTED's (NEEDS_HASH: the whole reply).
]]
local function plan_op(at, key, cur)
  local kind = ARGV[at]
  local plan = {kind, key, cur or false, false, false, '~', false, false, false}
  if kind == 'check' then
    local failed = check_fails(at, cur)
    if failed == 'hash' then
      return plan, {ST.NEEDS_HASH, key, entry_version(cur), cur[1]}
    elseif failed then
      return plan, conflict(cur)
    end
  elseif kind == 'set' then
    local cond = ARGV[at + 6]
    if cond ~= '' and entry_version(cur) ~= tonumber(string.sub(cond, 2)) then
      return plan, conflict(cur)
    end
    plan[4], plan[5], plan[6] = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
    plan[7], plan[8], plan[9] = tonumber(ARGV[at + 5]) or false, ARGV[at + 7] == '1', true
  elseif kind == 'cas' then
    local cond = ARGV[at + 4]
    if cond == 'a' then
      if cur and cur[1] ~= 'null' then
        return plan, conflict(cur)
      end
    elseif not cur then
      return plan, conflict(cur)
    elseif not cur[4] then
      return plan, {ST.NEEDS_HASH, key, entry_version(cur), cur[1]}
    elseif packed_hex(cur[4]) ~= string.sub(cond, 2) then
      return plan, conflict(cur)
    end
    plan[4], plan[5], plan[8], plan[9] = ARGV[at + 2], ARGV[at + 3], ARGV[at + 5] == '1', true
  elseif kind == 'delete' then
    if ARGV[at + 2] ~= '' and entry_version(cur) ~= tonumber(ARGV[at + 2]) then
      return plan, conflict(cur)
    end
    plan[9] = cur ~= nil
  else -- update
    if ARGV[at + 2] ~= '' and entry_version(cur) ~= tonumber(ARGV[at + 2]) then
      return plan, conflict(cur)
    end
    local plain = (cur == nil or cur[6] == '1') and ARGV[at + 5] == '1'
    JSON_NO_BRACKETS_IN_STRINGS = plain
    local new, errors = apply_ops(cur and cur[1] or '{}', cur == nil, at + 6)
    if #errors > 0 then
      return plan, {ST.OP_FAILED, errors[1], errors[2], errors[3]}
    end
    if new then
      if #new > tonumber(ARGV[11]) then
        return plan, {ST.VALUE_TOO_LARGE, #new}
      end
      plan[4], plan[6], plan[8], plan[9] = new, ARGV[at + 3], plain, true
      plan[7] = ARGV[at + 4] ~= '' and tonumber(ARGV[at + 4]) or false
    end
  end
  return plan, nil
end

--- @per-call
local dup, ctx = entry_start()
if dup then
  return dup
end
local prefix, ttl_prefix = ARGV[8], ARGV[9]
local each = ARGV[10] == '' -- set-many / delete-many: each op on its own, no `tx`
local ncompare, nthen, nelse = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local loaded = {} -- key -> {cur or false, expired}: each entry read once
local function load(key)
  local seen = loaded[key]
  if seen then
    return seen[1] or nil
  end
  entry_at(ctx, prefix, ttl_prefix, key)
  local cur, expired = entry_load(ctx)
  if expired then
    loaded[key] = {false, cur}
    return nil
  end
  loaded[key] = {cur or false, false}
  return cur
end

-- The branch: every compare item holds (an unknown stored hash is asked for first).
local at = 17
local branch = 1
for _ = 1, ncompare do
  local cur = load(ARGV[at + 1])
  local failed = check_fails(at, cur)
  if failed == 'hash' then
    return {ST.NEEDS_HASH, ARGV[at + 1], entry_version(cur), cur[1]}
  end
  if failed then
    branch = 0
  end
  at = next_item(at)
end
local count = nthen
if branch == 0 then
  for _ = 1, nthen do
    at = next_item(at)
  end
  count = nelse
end

-- Phase 1: every op checked and its new value built; nothing written. The first failure
-- ends a transaction; in `each` mode (set-many, delete-many) it only leaves its op out.
local plans = {} -- per op: {kind, key, cur, value, hash, topic, ttl, plain, writes}
local failures = {} -- `each` mode: index, status, 2 values, per failed op
local events, created = 0, 0
local creator = nil -- the index of the first op that creates a key
local limit = ARGV[12] ~= '' and tonumber(ARGV[12]) or false
local budget, spent = tonumber(ARGV[16]), 0 -- bytes of values read and written
for index = 0, count - 1 do
  local key = ARGV[at + 1]
  local cur = load(key)
  spent = spent + (cur and #cur[1] or 0) -- (read: into the event, the reply, an update)
  if spent > budget then
    return entry_finish({ST.CALL_TOO_LARGE, index, spent, budget})
  end
  local plan, failure = plan_op(at, key, cur)
  spent = spent + (plan[4] and #plan[4] or 0)
  if spent > budget then
    return entry_finish({ST.CALL_TOO_LARGE, index, spent, budget})
  end
  if not failure and each and plan[9] and not cur and plan[1] ~= 'delete' and limit then
    failure = entry_key_limit(ctx, nil, tostring(limit - created)) -- (this op's own count)
  end
  if failure then
    if failure[1] == ST.NEEDS_HASH then
      return failure
    end
    if not each then
      return entry_finish({ST.TX_ABORTED, branch, index, unpack(failure)})
    end
    if failure[1] == ST.KEY_LIMIT then -- (the live keys with those this call creates)
      failure[2], failure[3] = failure[2] + created, limit
    end
    local n = #failures
    failures[n + 1], failures[n + 2], failures[n + 3] = index, failure[1], failure[2]
    failures[n + 4] = failure[3] or false
    plan[9] = false
  end
  if plan[9] then
    events = events + 1
    if not cur and plan[1] ~= 'delete' then
      created = created + 1
      creator = creator or index
    elseif cur and plan[1] == 'delete' then
      created = created - 1
    end
  end
  plans[index + 1] = plan
  at = next_item(at)
end

if not each and created > 0 and limit then
  local full = entry_key_limit(ctx, nil, tostring(limit - created + 1))
  if full then
    return entry_finish({ST.TX_ABORTED, branch, creator, ST.KEY_LIMIT, full[2], limit})
  end
end

-- Phase 2: the writes, in op order.
for key, seen in pairs(loaded) do
  if seen[2] then
    entry_at(ctx, prefix, ttl_prefix, key)
    entry_drop_expired(ctx, seen[2])
  end
end
if not each then
  ctx.tx, ctx.txsize = ARGV[10], tostring(events)
end
local reply = {ST.OK, branch, false, ARGV[10]}
for index = 1, count do
  local plan = plans[index]
  local kind, cur = plan[1], plan[3] or nil
  local version, new = entry_version(cur), false
  if plan[9] then
    entry_at(ctx, prefix, ttl_prefix, plan[2])
    if kind == 'delete' then
      entry_delete(ctx, cur)
      version = 0
    else
      version = entry_write(ctx, cur, plan[4], plan[5], plan[6], plan[7], plan[8])
      if kind == 'update' then
        new = plan[4]
      end
    end
  elseif kind == 'update' and cur then
    new = cur[1]
  end
  local n = #reply
  reply[n + 1], reply[n + 2] = cur and cur[1] or false, new
  reply[n + 3], reply[n + 4] = version, (cur == nil and plan[9] and kind ~= 'delete') and 1 or 0
end
reply[3] = events > 0 and ctx.rev or false -- (an expired entry's drop is not the transaction's)
reply[#reply + 1] = failures
ctx.tx, ctx.txsize = false, false
return entry_finish(reply)
