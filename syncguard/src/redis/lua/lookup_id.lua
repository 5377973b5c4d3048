-- syncguard lookup by lock id: the lock data its index KEYS[1] points to, read atomically.
-- KEYS[1] index key of the lock id
-- Returns {} when there is no lock, {nowMs, lockData} otherwise; the caller checks ownership
-- and liveness.
local lockKey = redis.call('GET', KEYS[1])
if not lockKey then
  return {}
end
local current = redis.call('GET', lockKey)
if not current then
  return {}
end
local clock = redis.call('TIME')
return {clock[1] * 1000 + math.floor(clock[2] / 1000), current}
