-- syncguard batch: acquire, release and extend operations run in order in one atomic call,
-- so that concurrent operations of a process share one EVALSHA, one TIME and one round trip.
-- Each operation does exactly what its single-operation script in the reference does, with the
-- same return codes; running them back to back inside one script changes nothing for any of
-- them (a script is atomic, and all of them see the same server time).
--
-- ARGV[1] tolerance ms, ARGV[2] index key prefix ("<prefix>:id:"), then per operation:
--   'A' lockId ttlMs pxMs userKey   KEYS: lock key, index key, fence key
--   'R' lockId                       KEYS: index key
--   'E' lockId ttlMs pxMs            KEYS: index key
--   'r' lockId                       KEYS: lock key, index key
--   'e' lockId ttlMs pxMs            KEYS: lock key, index key
-- The lower-case forms are for locks the caller took itself and whose lock key it knows: the
-- index holds that same key (it is written with the lock), so they skip reading it.
-- pxMs (ttl + tolerance) comes as text: handing Redis a Lua number costs a float formatting.
-- Returns the server time (ms) of the batch, then one reply per operation:
--   acquire the fence (15 digits) when acquired, expiring at time + ttl; 0 when contended
--   release 1, 0 (held by another lock id), -1 (not found), -2 (expired)
--   extend  1 when extended to time + ttl; 0, -1, -2 as release
--   or {-100, 'CODE message'} when that operation hit data it cannot use (WRONGTYPE, BADDATA);
--   it took, extended or released nothing, and the other operations are unaffected.
-- (The reference's scripts return {1, fence, expiresAtMs} and {1, expiresAtMs}: the same
-- values, without a table per operation.)
--
-- Lock data is read with plain finds and anchored matches and written by concatenation instead
-- of a cjson decode/encode round: the bytes are those cjson writes for the same table (field
-- order included). Finds anchored on `"name":` cannot match inside the JSON-escaped key, whose
-- quotes are escaped.
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
-- %d formats an integer; a bare number in a concatenation goes through %.14g, far slower.
local nowText = string.format('%d', now)
-- A lock whose expiresAtMs is at or below this is expired (the liveness predicate).
local dead = now - tonumber(ARGV[1])
local indexPrefix = ARGV[2]
local BADDATA = 'BADDATA syncguard: the lock key holds data that is not SyncGuard lock JSON'
local EXPIRES = '"expiresAtMs":'

-- now + ttl as text; the operations of a batch mostly share their ttl, so it is formatted once.
local lastTtl, lastExpires
local function expiresText(ttl)
  if ttl ~= lastTtl then
    lastTtl, lastExpires = ttl, string.format('%d', now + tonumber(ttl))
  end
  return lastExpires
end

-- The expiry in lock data, with the position of its digits; nil when the data is not lock JSON.
local function expiry(data)
  local at = string.find(data, EXPIRES, 1, true)
  if not at then
    return nil
  end
  local first = at + #EXPIRES
  local digits = string.match(data, '^%d+', first)
  if not digits then
    return nil
  end
  return tonumber(digits), first, first + #digits
end

local function owned(data, lockId)
  -- Explicit ownership check (ADR-003): a validated 22-character id, matched literally.
  return string.find(data, '"lockId":"' .. lockId .. '"', 1, true) ~= nil
end

local function acquire(lockKey, indexKey, fenceKey, lockId, ttl, px, key)
  local current = redis.call('GET', lockKey)
  if current then
    local held = expiry(current)
    if not held then
      return {-100, BADDATA}
    end
    if held > dead then
      return 0
    end
    -- The previous lock is dead: drop its reverse index if it still points here.
    local previous = string.match(current, '"lockId":"([%w_-]+)"')
    if previous then
      local stale = indexPrefix .. previous
      if redis.call('GET', stale) == lockKey then
        redis.call('DEL', stale)
      end
    end
  end
  -- The fence counter never expires and is never deleted.
  local fence = string.format('%015d', redis.call('INCR', fenceKey))
  -- Both keys outlive the expiry by the tolerance, so liveness is decided by the predicate.
  redis.call('SET', lockKey, '{"key":' .. cjson.encode(key) .. ',"lockId":"' .. lockId
    .. '","fence":"' .. fence .. '","acquiredAtMs":' .. nowText .. ',"expiresAtMs":'
    .. expiresText(ttl) .. '}', 'PX', px)
  redis.call('SET', indexKey, lockKey, 'PX', px)
  return fence
end

-- The live lock data of lockId: lockKey, data, and the span of the expiry's digits; or nil and
-- the operation's reply. lockKey is read from the index unless the caller knows it.
local function find(lockKey, indexKey, lockId)
  if not lockKey then
    lockKey = redis.call('GET', indexKey)
    if not lockKey then
      return nil, -1
    end
  end
  local current = redis.call('GET', lockKey)
  if not current then
    redis.call('DEL', indexKey)
    return nil, -1
  end
  local held, first, after = expiry(current)
  if not held then
    return nil, {-100, BADDATA}
  end
  if not owned(current, lockId) then
    -- A stale index of this lock id: it is ours to drop; the other owner's lock stays.
    redis.call('DEL', indexKey)
    return nil, 0
  end
  if held <= dead then
    redis.call('DEL', lockKey, indexKey)
    return nil, -2
  end
  return lockKey, current, first, after
end

local function release(knownKey, indexKey, lockId)
  local lockKey, reply = find(knownKey, indexKey, lockId)
  if not lockKey then
    return reply
  end
  redis.call('DEL', lockKey, indexKey)
  return 1
end

local function extend(knownKey, indexKey, lockId, ttl, px)
  local lockKey, current, first, after = find(knownKey, indexKey, lockId)
  if not lockKey then
    return current -- the reply
  end
  -- Never revive an expired lock (find refused it); only the expiry changes, every other byte
  -- of the lock data stays as written.
  redis.call('SET', lockKey, string.sub(current, 1, first - 1) .. expiresText(ttl)
    .. string.sub(current, after), 'PX', px)
  redis.call('SET', indexKey, lockKey, 'PX', px)
  return 1
end

-- Runs one operation; an error (a wrong type under one of its keys) becomes its reply alone.
-- The commands that can fail (on a wrong type) come before the lock writes, so a failed
-- operation took, extended or released nothing (at most an acquire dropped the stale index of
-- a dead lock).
local function run(operation, ...)
  local ok, reply = pcall(operation, ...)
  if ok then
    return reply
  end
  if type(reply) == 'table' then
    reply = reply.err
  end
  return {-100, tostring(reply)}
end

local replies = {now}
local k, a, n = 1, 3, 1
while a <= #ARGV do
  local op = ARGV[a]
  n = n + 1
  if op == 'A' then
    replies[n] = run(acquire, KEYS[k], KEYS[k + 1], KEYS[k + 2], ARGV[a + 1], ARGV[a + 2],
      ARGV[a + 3], ARGV[a + 4])
    k, a = k + 3, a + 5
  elseif op == 'r' then
    replies[n] = run(release, KEYS[k], KEYS[k + 1], ARGV[a + 1])
    k, a = k + 2, a + 2
  elseif op == 'e' then
    replies[n] = run(extend, KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
    k, a = k + 2, a + 4
  elseif op == 'R' then
    replies[n] = run(release, nil, KEYS[k], ARGV[a + 1])
    k, a = k + 1, a + 2
  elseif op == 'E' then
    replies[n] = run(extend, nil, KEYS[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
    k, a = k + 1, a + 4
  else
    return redis.error_reply('ERR syncguard batch: unknown operation ' .. tostring(op))
  end
end
return replies
