-- syncguard acquire: take the lock on KEYS[1] unless a live lock holds it.
-- KEYS[1] lock key, KEYS[2] index key of the new lock id, KEYS[3] fence counter key
-- ARGV[1] new lock id, ARGV[2] ttl ms, ARGV[3] tolerance ms, ARGV[4] normalized user key,
-- ARGV[5] index key prefix ("<prefix>:id:")
-- Returns 0 when contended, {1, fence, expiresAtMs} when acquired.
--
-- Lock data is read with string patterns and written by concatenation instead of a cjson
-- decode/encode round: the bytes are those cjson writes for the same table (field order
-- included), at a fraction of the server time. Patterns anchored on `"name":` cannot match
-- inside the JSON-escaped key, whose quotes are escaped.
local current = redis.call('GET', KEYS[1])
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local tolerance = tonumber(ARGV[3])
if current then
  local held = tonumber(string.match(current, '"expiresAtMs":(%d+)'))
  if not held then
    return redis.error_reply('BADDATA syncguard: the lock key holds data that is not SyncGuard lock JSON')
  end
  if held > now - tolerance then
    return 0
  end
  -- The previous lock is dead: drop its reverse index if it still points here.
  local previous = string.match(current, '"lockId":"([%w_-]+)"')
  if previous then
    local stale = ARGV[5] .. previous
    if redis.call('GET', stale) == KEYS[1] then
      redis.call('DEL', stale)
    end
  end
end
-- The fence counter never expires and is never deleted.
local fence = string.format('%015d', redis.call('INCR', KEYS[3]))
local ttl = tonumber(ARGV[2])
local expires = now + ttl
local record = '{"key":' .. cjson.encode(ARGV[4]) .. ',"lockId":"' .. ARGV[1] .. '","fence":"' .. fence
  .. '","acquiredAtMs":' .. now .. ',"expiresAtMs":' .. expires .. '}'
-- Both keys outlive the expiry by the tolerance, so liveness is decided by the predicate only.
local px = ttl + tolerance
redis.call('SET', KEYS[1], record, 'PX', px)
redis.call('SET', KEYS[2], KEYS[1], 'PX', px)
return {1, fence, expires}
