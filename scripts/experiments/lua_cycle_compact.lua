-- Experiment only (scripts/experiments/lua_cycle_cost.py): the least an acquire and a release can
-- do with a fixed-width record (fence 15, expiry 16, lock id 22, then the key) and the fence
-- counter kept in the lock's own key; no holders, marks or release channel.
local now, dead
local function acquire(lockKey, lockId, ttl, px, key)
  local current = redis.call('GET', lockKey)
  local fence = 0
  if current then
    fence = tonumber(string.sub(current, 1, 15))
    if #current > 15 then
      local held = tonumber(string.sub(current, 16, 31))
      if held > dead then
        return held
      end
    end
  end
  fence = string.format('%015d', fence + 1)
  redis.call('SET', lockKey, fence .. string.format('%016d', now + tonumber(ttl)) .. lockId .. key)
  return fence
end
local function release(lockKey, lockId)
  local current = redis.call('GET', lockKey)
  if not current or #current == 15 then return -1 end
  if string.sub(current, 32, 53) ~= lockId then return 0 end
  if tonumber(string.sub(current, 16, 31)) <= dead then
    redis.call('SET', lockKey, string.sub(current, 1, 15))
    return -2
  end
  redis.call('SET', lockKey, string.sub(current, 1, 15))
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
      replies[n] = acquire(KEYS[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
      k, a = k + 2, a + 5
    elseif op == 'r' then
      replies[n] = release(KEYS[k], ARGV[a + 1])
      k, a = k + 1, a + 2
    end
  end
  return replies
end
