-- syncguard release: delete the lock held by ARGV[1], found through its index KEYS[1].
-- KEYS[1] index key of the lock id; ARGV[1] lock id, ARGV[2] tolerance ms
-- Returns 1 released, 0 held by another lock id, -1 not found, -2 expired.
local lockKey = redis.call('GET', KEYS[1])
if not lockKey then
  return -1
end
local current = redis.call('GET', lockKey)
if not current then
  redis.call('DEL', KEYS[1])
  return -1
end
local expires = tonumber(string.match(current, '"expiresAtMs":(%d+)'))
if not expires then
  return redis.error_reply('BADDATA syncguard: the lock key holds data that is not SyncGuard lock JSON')
end
-- Explicit ownership check (a validated 22-character id, matched literally).
if not string.find(current, '"lockId":"' .. ARGV[1] .. '"', 1, true) then
  -- A stale index of this lock id: it is ours to drop; the other owner's lock stays.
  redis.call('DEL', KEYS[1])
  return 0
end
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
redis.call('DEL', lockKey, KEYS[1])
if expires > now - tonumber(ARGV[2]) then
  return 1
end
return -2
