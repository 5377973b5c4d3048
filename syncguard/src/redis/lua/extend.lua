-- syncguard extend: set the expiry of the live lock held by ARGV[1] to now + ttl.
-- KEYS[1] index key of the lock id; ARGV[1] lock id, ARGV[2] tolerance ms, ARGV[3] ttl ms
-- Returns {1, expiresAtMs} extended, 0 held by another lock id, -1 not found, -2 expired.
local lockKey = redis.call('GET', KEYS[1])
if not lockKey then
  return -1
end
local current = redis.call('GET', lockKey)
if not current then
  redis.call('DEL', KEYS[1])
  return -1
end
local held = cjson.decode(current)
if held.lockId ~= ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 0
end
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local tolerance = tonumber(ARGV[2])
if held.expiresAtMs <= now - tolerance then
  -- Never revive an expired lock.
  redis.call('DEL', lockKey, KEYS[1])
  return -2
end
local ttl = tonumber(ARGV[3])
local expires = now + ttl
held.expiresAtMs = expires
local px = ttl + tolerance
redis.call('SET', lockKey, cjson.encode(held), 'PX', px)
redis.call('SET', KEYS[1], lockKey, 'PX', px)
return {1, expires}
