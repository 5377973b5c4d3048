-- Experiment only (scripts/experiments/lua_cycle_cost.py): the floor of the cluster layout's
-- Lua, the five commands a correct cycle needs and nearly nothing else. An acquire reads the
-- lock (is it live?), bumps the fence counter (a key of its own, never reset) and writes the
-- record with its expiry; a release reads the lock (whose is it?) and deletes it: Redis 7.0 has
-- no compare-and-delete. No JSON, no pcall, no holders, marks or release channel.
local now, dead
local function acquire(lockKey, fenceKey, lockId, ttl, px, key)
  local current = redis.call('GET', lockKey)
  if current and tonumber(string.sub(current, 1, 16)) > dead then
    return 0
  end
  local fence = redis.call('INCR', fenceKey)
  redis.call('SET', lockKey, string.format('%016d', now + tonumber(ttl)) .. lockId .. key,
    'PX', px)
  return fence
end
local function release(lockKey, lockId)
  local current = redis.call('GET', lockKey)
  if not current or string.sub(current, 17, 38) ~= lockId then
    return 0
  end
  redis.call('DEL', lockKey)
  return 1
end
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
    elseif op == 'r' then
      replies[n] = release(KEYS[k], ARGV[a + 1])
      k, a = k + 1, a + 2
    end
  end
  return replies
end
