--[[
  A bus call answered by its own script (helpers prefixed answer_; context.Answer): where the
  reply list shares the node with the state (always on one Redis; on a cluster when the
  layout puts them together). What the service's flush did in a round trip of its own: the
  reply LPUSHed (the list given its expiry), the call's entry acknowledged and deleted. A
  script answers only a call that succeeded; an error (and a replayed call) goes back to the
  service, which answers it.
  Input, the last six ARGV of such a script (its header says `@arguments answer`; n = #ARGV):
    ARGV[n-5] the reply list        ARGV[n-4] the call's stream ("": the service acknowledges
            the entry, which is on another node)
    ARGV[n-3] the reply list's expiry (ms); 0: PUBLISH the reply on the channel of the reply
            list's name instead (the bus on a Redis of its own: the caller listens here)
    ARGV[n-2] the consumer group
    ARGV[n-1] the entry's id        ARGV[n] the reply document's head (`{"id":<id>,"ok":true,
            "result":`)

  The two names are arguments, not KEYS: a script's KEYS must share one slot on a cluster,
  and these are in other slots (the scripts that answer are flagged allow-cross-slot-keys). On
  a cluster the service sends the call here only when its map puts the names on this node;
  a map gone stale (a slot moved since) would make the LPUSH fail after the writes, so
  `answer_here(true)` asks first, before the script's first write.
]]
local ANSWER_DONE = {ST.ANSWERED}
-- A larger result is answered on the bus, not published: Redis closes a subscriber whose
-- output passes its pub/sub buffer limit (32 MB by default), and a burst of large replies would.
local ANSWER_PUBLISHED_MAX = 65536

-- Whether the reply list and the stream can be written from here: on one Redis always; on a
-- cluster (`check`) when each is on this node (a command on a name elsewhere is refused, and
-- redis.pcall hands the refusal back instead of ending the script).
local function answer_here(check)
  if not check then
    return true
  end
  local n = #ARGV
  for _, name in ipairs({ARGV[n - 5], ARGV[n - 4]}) do
    if name ~= '' and type(redis.pcall('EXISTS', name)) == 'table' then
      return false
    end
  end
  return true
end

-- Send `result` (the call's result, JSON) on the reply list, acknowledge and delete the call's
-- entry (unless the service does: no stream given); {ST.ANSWERED}, the script's reply. A
-- reply list's name holding another type (a caller's SET under the reply prefix) refuses the
-- LPUSH (WRONGTYPE): the reply is dropped and that key left as it is, the call's change and
-- record stay (a script error here would come after them), and the entry is acknowledged.
-- A published reply (expiry 0) is not logged: it is no write, and a read that logs nothing
-- waits for no fsync; a write's still leaves Redis after its turn's fsync, as every reply of
-- the turn. Results over ANSWER_PUBLISHED_MAX bytes go back to the service. Pub/sub keeps
-- nothing: when no one heard it (the caller not subscribed, or
-- PUBLISH refused by the service user's rule) the result goes back to the service, which
-- answers on the bus: {ST.UNHEARD, result}.
local function answer_send(result)
  local n = #ARGV
  local list, stream = ARGV[n - 5], ARGV[n - 4]
  if ARGV[n - 3] == '0' then
    if #result > ANSWER_PUBLISHED_MAX then
      return {ST.UNHEARD, result}
    end
    redis.set_repl(redis.REPL_NONE)
    local heard = redis.pcall('PUBLISH', list, ARGV[n] .. result .. '}')
    redis.set_repl(redis.REPL_ALL)
    if type(heard) ~= 'number' or heard == 0 then
      return {ST.UNHEARD, result}
    end
  elseif type(redis.pcall('LPUSH', list, ARGV[n] .. result .. '}')) == 'number' then
    redis.call('PEXPIRE', list, ARGV[n - 3])
  end
  if stream ~= '' then
    redis.call('XACK', stream, ARGV[n - 2], ARGV[n - 1])
    redis.call('XDEL', stream, ARGV[n - 1])
  end
  return ANSWER_DONE
end
