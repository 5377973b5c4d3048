-- syncguard is_locked: whether a live lock holds KEYS[1].
-- KEYS[1] lock key; ARGV[1] tolerance ms, ARGV[2] cleanup guard ms (0: no cleanup),
-- ARGV[3] index key prefix ("<prefix>:id:", or empty in the cluster layout, which has no index)
-- Returns 1 locked, 0 free.
local current = redis.call('GET', KEYS[1])
if not current then
  return 0
end
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local held = cjson.decode(current)
if held.expiresAtMs > now - tonumber(ARGV[1]) then
  return 1
end
local guard = tonumber(ARGV[2])
if guard > 0 and now - held.expiresAtMs > guard then
  -- Opt-in cleanup of lock data only: the lock key and its index, never a fence counter.
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' and type(held.lockId) == 'string' then
    local index = ARGV[3] .. held.lockId
    if redis.call('GET', index) == KEYS[1] then
      redis.call('DEL', index)
    end
  end
end
return 0
