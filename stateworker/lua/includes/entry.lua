--[[
  Entry helpers shared by the mutating scripts. `ctx` holds the names and arguments of the
  entry being changed:
    ctx.entry, ctx.keyIndex, ctx.scopes, ctx.ttl, ctx.events  -- key names
    ctx.scope, ctx.key, ctx.member                             -- the entry's address
    ctx.now, ctx.maxlen, ctx.by                                -- call time (ms), stream cap, writer
]]

-- Append one change event; its stream id is the revision, returned.
local function emit(ctx, etype, old, new, version)
  return redis.call('XADD', ctx.events, 'MAXLEN', '~', ctx.maxlen, '*',
    'type', etype, 'scope', ctx.scope, 'key', ctx.key,
    'old_value', old, 'new_value', new, 'version', version,
    'ts_ms', ctx.now, 'by', ctx.by)
end

-- Remove the entry and every index member that points at it.
local function unlink(ctx)
  redis.call('DEL', ctx.entry)
  redis.call('ZREM', ctx.keyIndex, ctx.key)
  redis.call('ZREM', ctx.ttl, ctx.member)
  if redis.call('ZCARD', ctx.keyIndex) == 0 then
    redis.call('ZREM', ctx.scopes, ctx.scope)
  end
end

-- The live entry as {value, version, expires_at, hash} or nil. An entry whose expiry has
-- passed is deleted here, with the state:deleted event the reaper would have written.
local function load_live(ctx)
  local f = redis.call('HMGET', ctx.entry, 'v', 'n', 'x', 'h')
  if not f[1] then
    return nil
  end
  if f[3] and tonumber(f[3]) <= ctx.now then
    unlink(ctx)
    local by = ctx.by
    ctx.by = ''
    emit(ctx, 'state:deleted', f[1], 'null', f[2])
    ctx.by = by
    return nil
  end
  return f
end
