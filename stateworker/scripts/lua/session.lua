--[[
  A console session (app/logins.py) opened or closed. A session is no state: PostgreSQL never
  holds one, and a wiped Redis ends them all (their principals log in again).
  Input:
    KEYS[1] the session (string: its record; PXAT its end; keys.KeySpace.session)
    KEYS[2] its principal's sessions (zset: session key -> its end in ms;
            keys.KeySpace.sessions_of)
    ARGV[1] "open" or "close"
    ARGV[2] open: the session's record (app/logins.py); close: ""
    ARGV[3] now, epoch ms
    ARGV[4] open: the session's end, epoch ms; close: ""
    ARGV[5] open: the sessions a principal keeps at most (a new one ends its oldest); close: ""
  Output:
    {ST.OK, n}  open: the principal's sessions ended to keep the cap; close: 1 when the
                session was open, else 0
  Events: none.
]]
local session, mine = KEYS[1], KEYS[2]
-- (sessions past their end: Redis expired their keys, their places go)
redis.call('ZREMRANGEBYSCORE', mine, '-inf', ARGV[3])
if ARGV[1] == 'close' then
  redis.call('ZREM', mine, session)
  return {ST.OK, redis.call('DEL', session)}
end
local over = redis.call('ZCARD', mine) - tonumber(ARGV[5]) + 1
local ended = 0
if over > 0 then
  -- All last as long, so the oldest end first: those make room.
  local oldest = redis.call('ZRANGE', mine, 0, over - 1)
  redis.call('ZREM', mine, unpack(oldest))
  ended = redis.call('DEL', unpack(oldest))
end
redis.call('SET', session, ARGV[2], 'PXAT', ARGV[4])
redis.call('ZADD', mine, ARGV[4], session)
redis.call('PEXPIREAT', mine, ARGV[4]) -- (the newest ends last: the index goes with it)
return {ST.OK, ended}
