--[[
  The claims hash (scope -> functions prefix) of private namespaces, shared by claim.lua and
  release.lua (helpers prefixed claims_).
]]

-- Every scope `prefix` owns now, in the hash's order.
local function claims_owned(claims, prefix)
  local owned, all = {}, redis.call('HGETALL', claims)
  for i = 1, #all, 2 do
    if all[i + 1] == prefix then
      owned[#owned + 1] = all[i]
    end
  end
  return owned
end
