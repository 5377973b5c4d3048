-- Experiment only: the floor of the cluster layout's Lua, the commands a correct cycle needs and
-- nearly nothing else. No JSON, no pcall, no holders, marks, lookups or release channel; the
-- record is fixed-width: 16 digits of expiry, the lock id, the key.
--
-- Two tools load it as a function library: scripts/experiments/lua_cycle_cost.py (its CPU per
-- cycle, apart from any client) and scripts/experiments/bench_floor.sh (the Redis bench's
-- cluster-layout row through the backend's own client, which is why the replies have the
-- batch function's shapes: the server time, then a 15-digit fence or the holder's expiry per
-- acquire, 1 / 0 / -1 per release).
--
-- An acquire reads the lock (is it live?), bumps the fence counter (a key of its own, never
-- reset) and writes the record with its expiry: three commands. With SET_NX_GET (Redis 7.0 and
-- later; bench_floor.sh turns it on for its `floor4` variant) it bumps the counter first and
-- writes only where no lock is, reading the old value in the same command: two commands when
-- the key is free, and a refusal takes the counter back down. A release reads the lock (whose
-- is it?) and deletes it: Redis 7.0 has no compare-and-delete.
local SET_NX_GET = false
local now, dead

local function record(lockId, ttl, key)
  return string.format('%016d', now + tonumber(ttl)) .. lockId .. key
end

local function acquire(lockKey, fenceKey, lockId, ttl, px, key)
  if SET_NX_GET then
    local fence = redis.call('INCR', fenceKey)
    local data = record(lockId, ttl, key)
    local current = redis.call('SET', lockKey, data, 'NX', 'GET', 'PX', px)
    if current then
      local held = tonumber(string.sub(current, 1, 16))
      if held > dead then
        redis.call('DECR', fenceKey)
        return held
      end
      redis.call('SET', lockKey, data, 'PX', px)
    end
    return string.format('%015d', fence)
  end
  local current = redis.call('GET', lockKey)
  if current then
    local held = tonumber(string.sub(current, 1, 16))
    if held > dead then
      return held
    end
  end
  local fence = redis.call('INCR', fenceKey)
  redis.call('SET', lockKey, record(lockId, ttl, key), 'PX', px)
  return string.format('%015d', fence)
end

local function release(lockKey, lockId)
  local current = redis.call('GET', lockKey)
  if not current then
    return -1
  end
  if string.sub(current, 17, 38) ~= lockId then
    return 0
  end
  redis.call('DEL', lockKey)
  return 1
end

-- The batch function's call shape, cluster layout: ARGV[1] tolerance, ARGV[2] and ARGV[3]
-- ignored, then 'A' lockId ttlMs pxMs userKey (KEYS: lock key, fence key) and 'r' or 'q'
-- lockId (KEYS: lock key).
local function batch(KEYS, ARGV)
  local clock = redis.call('TIME')
  now = clock[1] * 1000 + math.floor(clock[2] / 1000)
  dead = now - tonumber(ARGV[1])
  local replies = {now}
  local k, a, n = 1, 4, 1
  while a <= #ARGV do
    local op = ARGV[a]
    n = n + 1
    if op == 'A' then
      replies[n] = acquire(KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      k, a = k + 2, a + 5
    elseif op == 'r' or op == 'q' then
      replies[n] = release(KEYS[k], ARGV[a + 1])
      k, a = k + 1, a + 2
    else
      return redis.error_reply('ERR floor: only acquire and release, not ' .. tostring(op))
    end
  end
  return replies
end
