-- syncguard acquire: take the lock on KEYS[1] unless a live lock holds it.
-- KEYS[1] lock key, KEYS[2] index key of the new lock id, KEYS[3] fence counter key
-- ARGV[1] new lock id, ARGV[2] ttl ms, ARGV[3] tolerance ms, ARGV[4] normalized user key,
-- ARGV[5] index key prefix ("<prefix>:id:")
-- Returns 0 when contended, {1, fence, expiresAtMs} when acquired.
local current = redis.call('GET', KEYS[1])
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local tolerance = tonumber(ARGV[3])
if current then
  local held = cjson.decode(current)
  if held.expiresAtMs > now - tolerance then
    return 0
  end
  -- The previous lock is dead: drop its reverse index if it still points here.
  if type(held.lockId) == 'string' then
    local stale = ARGV[5] .. held.lockId
    if redis.call('GET', stale) == KEYS[1] then
      redis.call('DEL', stale)
    end
  end
end
-- The fence counter never expires and is never deleted.
local fence = string.format('%015d', redis.call('INCR', KEYS[3]))
local ttl = tonumber(ARGV[2])
local expires = now + ttl
local record = cjson.encode({lockId = ARGV[1], expiresAtMs = expires, acquiredAtMs = now, key = ARGV[4], fence = fence})
-- Both keys outlive the expiry by the tolerance, so liveness is decided by the predicate only.
local px = ttl + tolerance
redis.call('SET', KEYS[1], record, 'PX', px)
redis.call('SET', KEYS[2], KEYS[1], 'PX', px)
return {1, fence, expires}
