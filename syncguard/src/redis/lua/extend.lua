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
local held = tonumber(string.match(current, '"expiresAtMs":(%d+)'))
if not held then
  return redis.error_reply('BADDATA syncguard: the lock key holds data that is not SyncGuard lock JSON')
end
if not string.find(current, '"lockId":"' .. ARGV[1] .. '"', 1, true) then
  redis.call('DEL', KEYS[1])
  return 0
end
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local tolerance = tonumber(ARGV[2])
if held <= now - tolerance then
  -- Never revive an expired lock.
  redis.call('DEL', lockKey, KEYS[1])
  return -2
end
local ttl = tonumber(ARGV[3])
local expires = now + ttl
-- Only the expiry changes; every other byte of the lock data stays as written.
local updated = string.gsub(current, '"expiresAtMs":%d+', '"expiresAtMs":' .. expires, 1)
local px = ttl + tolerance
redis.call('SET', lockKey, updated, 'PX', px)
redis.call('SET', KEYS[1], lockKey, 'PX', px)
return {1, expires}
