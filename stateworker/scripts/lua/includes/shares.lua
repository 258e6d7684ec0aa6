--[[
  Each owner's share of the trigger registrations (helpers prefixed shares_), shared by
  trigger.lua and keeptrigger.lua: the hash `KeySpace.trigger_owners` holds, per owner (the
  `owner` string of its registrations' JSON; an ownerless one, `off` mode, counts in no
  share), "n|<owner>" its registrations and "b|<owner>" their bytes of JSON, and the field
  "." once it is built. Kept in the script that changes a registration, so a cap check is
  two HMGET fields, never a decode of every registration (docs/decisions/0064).
  A restore deletes the hash; it is built again, from every registration, by the next
  script that needs it (as on the first call after an upgrade that added it).
]]

-- The `owner` of a registration's JSON; nil when it has none (or is no JSON).
local function shares_owner_of(registration)
  local ok, decoded = pcall(cjson.decode, registration)
  if ok and type(decoded) == 'table' and type(decoded.owner) == 'string'
      and decoded.owner ~= '' then
    return decoded.owner
  end
  return nil
end

-- Add `count` registrations and `bytes` bytes to `owner`'s share (negative: remove); the
-- fields go once its count is 0. Nothing for no owner.
local function shares_add(shares, owner, count, bytes)
  if not owner then
    return
  end
  local left = redis.call('HINCRBY', shares, 'n|' .. owner, count)
  if left <= 0 then
    redis.call('HDEL', shares, 'n|' .. owner, 'b|' .. owner)
  else
    redis.call('HINCRBY', shares, 'b|' .. owner, bytes)
  end
end

-- Build the shares from every registration in `registrations` unless built ("." set).
local function shares_ready(shares, registrations)
  if redis.call('HEXISTS', shares, '.') == 1 then
    return
  end
  redis.call('DEL', shares)
  local all = redis.call('HGETALL', registrations)
  for i = 2, #all, 2 do
    shares_add(shares, shares_owner_of(all[i]), 1, #all[i])
  end
  redis.call('HSET', shares, '.', 1)
end

-- `owner`'s registrations and their bytes (0, 0: none).
local function shares_of(shares, owner)
  local held = redis.call('HMGET', shares, 'n|' .. owner, 'b|' .. owner)
  return tonumber(held[1] or 0), tonumber(held[2] or 0)
end
