--[[
  A bus call answered by its own script (helpers prefixed answer_; context.Answer): on one
  Redis, where the reply list and the call's stream share the node with the state. The last
  four ARGV of such a script: the reply list's expiry (ms), the consumer group, the entry's
  id and the reply document's head (`{"id":<id>,"ok":true,"result":`). What the service's
  flush did in a round trip of its own: the reply LPUSHed (the list given its expiry), the
  call's entry acknowledged and deleted. A script answers only a call that succeeded; an
  error (and a replayed call) goes back to the service, which answers it.
]]
local ANSWER_DONE = {ST.ANSWERED}

-- Send `result` (the call's result, JSON) on reply list `list`, acknowledge and delete the
-- call's entry in `stream`; {ST.ANSWERED}, the script's reply.
local function answer_send(list, stream, result)
  local n = #ARGV
  redis.call('LPUSH', list, ARGV[n] .. result .. '}')
  redis.call('PEXPIRE', list, ARGV[n - 3])
  redis.call('XACK', stream, ARGV[n - 2], ARGV[n - 1])
  redis.call('XDEL', stream, ARGV[n - 1])
  return ANSWER_DONE
end
