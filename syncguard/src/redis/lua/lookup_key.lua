-- syncguard lookup by key: the stored lock data of KEYS[1] with the server time.
-- KEYS[1] lock key
-- Returns {} when there is no lock, {nowMs, lockData} otherwise; the caller checks liveness.
local current = redis.call('GET', KEYS[1])
if not current then
  return {}
end
local clock = redis.call('TIME')
return {clock[1] * 1000 + math.floor(clock[2] / 1000), current}
