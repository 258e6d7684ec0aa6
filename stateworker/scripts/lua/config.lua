--[[
  state::on-config-change: the live settings' overrides written (those the call gives) and
  every replica told to reload them, in one step, so no replica reloads a half-written set.
  The overrides are checked before they come here; what is stored is checked again by each
  replica as it reloads (state/core/live.py), since anyone with Redis access may write it.
  Input:
    KEYS[1] the live settings (hash: setting name -> value as text)
    KEYS[2] the registry stream (shares KEYS[1]'s hash tag)
    ARGV[1] registry entries kept (MAXLEN ~)
    ARGV[2..] setting name, value pairs; an empty value removes the setting's override
  Output:
    {ST.OK, {name, value, ...}}   every override stored now
  Events: none (no entry changes); one registry entry `kind settings`.
]]

for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'kind', 'settings')
return {ST.OK, redis.call('HGETALL', KEYS[1])}
