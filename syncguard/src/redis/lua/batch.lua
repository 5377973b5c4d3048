-- syncguard batch: acquire, release and extend operations run in order in one atomic call,
-- so that concurrent operations of a process share one call, one TIME and one round trip.
-- Run as a script (EVALSHA: this file and `return batch(KEYS, ARGV)`) or as a function (Redis
-- 7 and later: this file in a library that registers `batch`), see batch_function.rs.
-- Each operation does exactly what its single-operation script in the reference does, with the
-- same return codes; running them back to back inside one script changes nothing for any of
-- them (a script is atomic, and all of them see the same server time).
--
-- ARGV[1] tolerance ms, ARGV[2] index key prefix ("<prefix>:id:", or empty in the cluster
-- layout, which has no index; "{}" for a node call, below), ARGV[3] release channel
-- ("<prefix>:released"; "{}" and the channel on a Redis Cluster, for the lock's own shard
-- channel; empty for none), then per operation:
--   'A' lockId ttlMs pxMs userKey          KEYS: lock key, [index key], fence key
--   'H' lockId ttlMs pxMs userKey holder   KEYS: lock key, [index key], fence key
--   'R' lockId                             KEYS: index key
--   'O' lockId                             KEYS: index key
--   'E' lockId ttlMs pxMs                  KEYS: index key
--   'B' lockId byMs                        KEYS: index key
--   'T' lockId atMs                        KEYS: index key
--   'r' lockId                             KEYS: lock key, [index key]
--   'q' lockId                             KEYS: lock key, [index key]
--   'Q' lockId                             KEYS: index key
--   'o' lockId                             KEYS: lock key, [index key]
--   'e' lockId ttlMs pxMs                  KEYS: lock key, [index key]
--   'b' lockId byMs                        KEYS: lock key, [index key]
--   't' lockId atMs                        KEYS: lock key, [index key]
-- A node call of a Redis Cluster (ARGV[2] "{}", cluster layout) carries the operations of
-- locks in many slots of one node: it declares no key (a cluster refuses declared keys of more
-- than one slot), their keys come in ARGV after their count (ARGV[4]), in the order above,
-- before the operations, and the client sends it to the node it means. The function is
-- registered with allow-cross-slot-keys; a script (EVALSHA, no flags) may reach other slots of
-- its node as it is. Without a declared key the call is never redirected, so it never runs
-- with ASKING: a key is served only where it lives (a key of a slot being migrated, only on
-- the node that has it). An operation whose key the node does not serve (the slot is
-- elsewhere, or moving and the key not here, or the cluster is down) fails at its first
-- command on that key, before it writes anything, and replies -101: the client sends it again
-- in a call that declares its keys, which the cluster redirects as it should.
-- [index key] is there in the reference layout only. The upper-case forms find the lock key
-- through the index; the lower-case forms are for locks whose lock key the caller knows (it
-- took the lock itself, or the cluster layout derives the key from the lock id), so they skip
-- reading it. The cluster layout uses only those, and every key of an operation is in one
-- hash slot (the lock key's tag), so that a Redis Cluster runs it on one node.
-- 'H' is acquire as a holder (re-entrant by holder), 'B'/'b' extend by an amount (added to the
-- current expiry instead of to now), 'T'/'t' set the expiry to a fixed time (earlier or later),
-- 'Q'/'q' release as 'R'/'r' do, for a caller that has nobody waiting: an unpublished release
-- replies 1 instead of the lock's key, which it then need not read out of the record.
-- 'O' releases the lock an acquire as a holder took for a caller that never learnt it, only
-- while it is unclaimed (else it replies 0: a re-entry handed its lock id to a caller, or an
-- extend used it).
-- pxMs (ttl + tolerance) comes as text: handing Redis a Lua number costs a float formatting.
-- Returns the server time (ms) of the batch, then one reply per operation:
--   acquire the fence (15 digits) when acquired, expiring at time + ttl; when contended, the
--           live holder's expiresAtMs (an integer, never 0)
--   acquire as a holder: as acquire; {fence, lockId} when it re-entered the live lock of the
--           same holder (kept lock id and fence, a fresh lease expiring at time + ttl)
--   release 1, 0 (held by another lock id), -1 (not found), -2 (expired); with a release
--           channel, the lock's key instead of 1 when released without publishing (nobody was
--           refused during the hold), so that the caller wakes its own waiters of the key
--           (not for 'Q'/'q')
--   extend  1 when extended to time + ttl; 0, -1, -2 as release
--   extend by {1, new expiresAtMs} when extended; 0, -1, -2 as release
--   expire at {1, atMs} when set (at or below the dead line: the lock is expired, its keys
--           gone a millisecond later); 0, -1, -2 as release
--   or {-100, 'CODE message'} when that operation hit data it cannot use (WRONGTYPE, BADDATA);
--   it took, extended or released nothing, and the other operations are unaffected;
--   or -101 when the node does not serve its key (see node calls above); it ran nothing.
-- (The reference's scripts return {1, fence, expiresAtMs} and {1, expiresAtMs}: the same
-- values, without a table per operation.)
--
-- Lock data is read with plain finds and anchored matches and written by concatenation instead
-- of a cjson decode/encode round: the bytes are those cjson writes for the same table (field
-- order included). Finds anchored on `"name":` cannot match inside the JSON-escaped key or
-- holder, whose quotes are escaped.
--
-- The holder (acquire as a holder) is an optional `holder` field, absent when there is none:
-- `..,"acquiredAtMs":N,"holder":"..","expiresAtMs":M}`, which is what cjson writes for the
-- reference's table with `holder` added first. The reference ignores fields it does not know.
-- A lock taken with a holder also carries `"unclaimed":true` after the expiry (before the
-- contended mark, if any) until its lock id is used after the acquire that took it: a
-- re-entry rewrites the record without it, and an extend of any kind removes it. The release
-- of an acquire as a holder in doubt ('O') deletes only an unclaimed lock.
-- Its extend, as its specification prescribes it (cjson.decode, set expiresAtMs,
-- cjson.encode; its scripts are not in this repository), keeps the holder, fields reordered:
-- the finds here still read that record, and a re-entry rewrites it in this layout
-- (tests/redis/holders.rs runs that pattern). Its acquire of an expired lock writes a record
-- without holder, and a record without one (or with `null`) is re-entered by no holder.
-- A re-entry renews the index of the kept lock id, `prefix:id:<lockId>`, a key derived in the
-- script as the cleanup of a stale index is.
--
-- A release of a live lock that an acquire was refused on (and only that: not an uncontended
-- release, nobody waits on it; not an expired lock's cleanup) publishes the lock's normalized
-- key, as stored in its `key` field, on the release channel, so that the waiters of every
-- process subscribed to it try the lock at once. On a Redis Cluster (ARGV[3] "{}<channel>")
-- it goes by SPUBLISH to the lock's own shard channel "<lock key>:released", in the lock
-- key's slot, which only that slot's shard (its primary and replicas) sends to its
-- subscribers (the waiters of the key subscribe there, with SSUBSCRIBE); where SPUBLISH is
-- refused (before Redis 7, or by an ACL), by PUBLISH on the channel. The refusal marks the
-- lock: a last field `"contended":true` (the reference ignores fields it does not know, and
-- its cjson extend keeps it; a quote in the key or holder is escaped, so the anchored find
-- cannot match inside them), written once per hold, with the lock's TTL kept. Both the mark
-- and the publish are hints, sent with redis.pcall, so that a user without permission to
-- publish (or a server over maxmemory) still releases, and still refuses: the waiters then
-- poll. A backend without release notifications (empty channel) neither marks nor publishes.

-- The per-call state, set by `batch` before any operation runs. As a function library (Redis 7
-- and later) this file is loaded once and these outlive a call: every call sets them all first.
local now, nowText, dead, indexPrefix, releaseChannel, sharded
local BADDATA = 'BADDATA syncguard: the lock key holds data that is not SyncGuard lock JSON'
local EXPIRES = '"expiresAtMs":'
local CONTENDED = '"contended":true'
local UNCLAIMED = '"unclaimed":true'
local KEY = '"key":"'
-- The largest expiry an extend by an amount reaches: the largest integer a Lua number (a
-- double) holds exactly.
local MAX_EXPIRES = 9007199254740991
-- The reply of an operation whose key this cluster node does not serve.
local NOT_SERVED_HERE = -101

-- now + ttl as text; the operations of a batch mostly share their ttl, so it is formatted once
-- per call (`batch` forgets the last one: it is of an earlier call's time).
local lastTtl, lastExpires
local function expiresText(ttl)
  if ttl ~= lastTtl then
    lastTtl, lastExpires = ttl, string.format('%d', now + tonumber(ttl))
  end
  return lastExpires
end

-- The expiry in lock data, with the position of its digits; nil when the data is not lock JSON.
local function expiry(data)
  local at = string.find(data, EXPIRES, 1, true)
  if not at then
    return nil
  end
  local first = at + #EXPIRES
  local digits = string.match(data, '^%d+', first)
  if not digits then
    return nil
  end
  return tonumber(digits), first, first + #digits
end

-- The user key in lock data (the normalized key its waiters wait on); nil when there is none.
-- A quote inside a JSON string is escaped, so the first `"key":"` is the field itself, and
-- the string ends at the first quote not escaped. Most keys hold no escape (cjson escapes `/`
-- as well) and are taken as they are; the others are decoded.
local function storedKey(data)
  local at = string.find(data, KEY, 1, true)
  if not at then
    return nil
  end
  local first = at + #KEY
  local from, escaped = first, false
  while true do
    local stop = string.find(data, '["\\]', from)
    if not stop then
      return nil
    end
    if string.byte(data, stop) == 34 then
      if not escaped then
        return string.sub(data, first, stop - 1)
      end
      local ok, key = pcall(cjson.decode, string.sub(data, first - 1, stop))
      if ok and type(key) == 'string' then
        return key
      end
      return nil
    end
    -- A backslash: the character after it is escaped (a quote among them).
    from, escaped = stop + 2, true
  end
end

local function owned(data, lockId)
  -- Explicit ownership check (ADR-003): a validated 22-character id, matched literally.
  return string.find(data, '"lockId":"' .. lockId .. '"', 1, true) ~= nil
end

-- The lock data of a lock taken now for ttl (holder: nil when taken without one).
local function record(key, lockId, fence, holder, ttl)
  local holderField = ''
  if holder then
    holderField = ',"holder":' .. cjson.encode(holder)
  end
  return '{"key":' .. cjson.encode(key) .. ',"lockId":"' .. lockId .. '","fence":"' .. fence
    .. '","acquiredAtMs":' .. nowText .. holderField .. ',"expiresAtMs":' .. expiresText(ttl)
    .. '}'
end

-- Whether the lock data carries the contended mark.
local function marked(data)
  return string.find(data, CONTENDED, 1, true) ~= nil
end

-- data, with `field` added as its last field.
local function withField(data, field)
  return string.sub(data, 1, -2) .. ',' .. field .. '}'
end

-- data, with the contended mark added as its last field.
local function withMark(data)
  return withField(data, CONTENDED)
end

-- data without the unclaimed mark: whoever uses its lock id holds the lock. The mark is a
-- field after another one as this script writes it, or the first field as cjson may reorder
-- a record (the comma after it then goes with it).
local function claimed(data)
  local at = string.find(data, UNCLAIMED, 1, true)
  if not at then
    return data
  end
  local after = at + #UNCLAIMED
  if string.byte(data, at - 1) == 44 then
    return string.sub(data, 1, at - 2) .. string.sub(data, after)
  end
  return string.sub(data, 1, at - 1) .. string.sub(data, after + 1)
end

-- Marks the live lock an acquire was refused on, so that its release publishes (once per hold).
local function markContended(lockKey, current)
  if releaseChannel ~= '' and string.byte(current, -1) == 125 and not marked(current) then
    redis.pcall('SET', lockKey, withMark(current), 'KEEPTTL')
  end
end

-- A live lock met by an acquire as `holder`: re-taken when that same holder took it (the lock
-- id and fence kept, a fresh lease from now, the index's TTL renewed), else contended (another
-- holder, or none). The data is decoded here only, on the contended path of a holder.
-- held: the live lock's expiry, the reply when contended.
local function reenter(lockKey, current, held, holder, ttl, px, key)
  local ok, data = pcall(cjson.decode, current)
  if not ok or type(data) ~= 'table' then
    return {-100, BADDATA}
  end
  if data.holder ~= holder then
    markContended(lockKey, current)
    return held
  end
  local lockId, fence = data.lockId, data.fence
  if type(lockId) ~= 'string' or #lockId ~= 22 or not string.match(lockId, '^[%w_-]+$')
    or type(fence) ~= 'string' or #fence ~= 15 or not string.match(fence, '^%d+$') then
    return {-100, BADDATA}
  end
  -- Claimed (rewritten without the unclaimed mark): its lock id now belongs to this caller, so
  -- the release of an acquire in doubt ('O') leaves it. A re-entry keeps the contended mark:
  -- whoever was refused still waits.
  local renewed = record(key, lockId, fence, holder, ttl)
  if marked(current) then
    renewed = withMark(renewed)
  end
  redis.call('SET', lockKey, renewed, 'PX', px)
  if indexPrefix ~= '' then
    redis.call('SET', indexPrefix .. lockId, lockKey, 'PX', px)
  end
  return {fence, lockId}
end

-- The lock's keys gone: the lock key and, in the reference layout, its index.
local function deleteLock(lockKey, indexKey)
  if indexKey then
    redis.call('DEL', lockKey, indexKey)
  else
    redis.call('DEL', lockKey)
  end
end

-- Sets the index of a lock (reference layout) to lockKey for px ms; nothing without an index.
local function setIndex(indexKey, lockKey, px)
  if indexKey then
    redis.call('SET', indexKey, lockKey, 'PX', px)
  end
end

-- holder: nil for a plain acquire. indexKey: nil in the cluster layout.
local function acquire(lockKey, indexKey, fenceKey, lockId, ttl, px, key, holder)
  local current = redis.call('GET', lockKey)
  if current then
    local held, first, after = expiry(current)
    if not held then
      return {-100, BADDATA}
    end
    if held > dead then
      if owned(current, lockId) then
        -- This very acquire, applied already: a client that sends a call again after its
        -- connection dropped (the cluster connection does) must not be told it was refused
        -- a lock it holds. Its lock id is fresh, so nobody else's lock matches. The lease
        -- starts again from now, as the caller reckons it from this call's time.
        local fence = string.match(current, '"fence":"(%d+)"')
        if not fence then
          return {-100, BADDATA}
        end
        redis.call('SET', lockKey, string.sub(current, 1, first - 1) .. expiresText(ttl)
          .. string.sub(current, after), 'PX', px)
        setIndex(indexKey, lockKey, px)
        return fence
      end
      if holder then
        return reenter(lockKey, current, held, holder, ttl, px, key)
      end
      markContended(lockKey, current)
      return held
    end
    -- The previous lock is dead: drop its reverse index if it still points here.
    local previous = indexKey and string.match(current, '"lockId":"([%w_-]+)"')
    if previous then
      local stale = indexPrefix .. previous
      if redis.call('GET', stale) == lockKey then
        redis.call('DEL', stale)
      end
    end
  end
  -- The fence counter never expires and is never deleted.
  local fence = string.format('%015d', redis.call('INCR', fenceKey))
  local data = record(key, lockId, fence, holder, ttl)
  if holder then
    data = withField(data, UNCLAIMED)
  end
  -- Both keys outlive the expiry by the tolerance, so liveness is decided by the predicate.
  redis.call('SET', lockKey, data, 'PX', px)
  setIndex(indexKey, lockKey, px)
  return fence
end

-- The live lock data of lockId: lockKey, data, and the span of the expiry's digits; or nil and
-- the operation's reply. lockKey is read from the index unless the caller knows it; indexKey
-- is nil in the cluster layout.
local function find(lockKey, indexKey, lockId)
  if not lockKey then
    lockKey = redis.call('GET', indexKey)
    if not lockKey then
      return nil, -1
    end
  end
  local current = redis.call('GET', lockKey)
  if not current then
    if indexKey then
      redis.call('DEL', indexKey)
    end
    return nil, -1
  end
  local held, first, after = expiry(current)
  if not held then
    return nil, {-100, BADDATA}
  end
  if not owned(current, lockId) then
    -- A stale index of this lock id: it is ours to drop; the other owner's lock stays.
    if indexKey then
      redis.call('DEL', indexKey)
    end
    return nil, 0
  end
  if held <= dead then
    deleteLock(lockKey, indexKey)
    return nil, -2
  end
  return lockKey, current, first, after
end

-- quiet: the caller has no waiters to wake, so an unpublished release replies 1 (not the key).
local function release(knownKey, indexKey, lockId, quiet)
  local lockKey, current = find(knownKey, indexKey, lockId)
  if not lockKey then
    return current -- the reply
  end
  deleteLock(lockKey, indexKey)
  if releaseChannel == '' then
    return 1
  end
  local contended = marked(current)
  if quiet and not contended then
    return 1
  end
  local key = storedKey(current)
  if not key then
    return 1
  end
  if contended then
    -- Sharded: the lock's own channel, in its slot; a refused SPUBLISH (an error table:
    -- before Redis 7, or an ACL) falls back to the channel.
    if not sharded or type(redis.pcall('SPUBLISH', lockKey .. ':released', key)) == 'table' then
      redis.pcall('PUBLISH', releaseChannel, key)
    end
    return 1
  end
  -- Nobody was refused during this hold: the only waiters may be the caller's own, queued
  -- behind the one that took it; it wakes them by this key.
  return key
end

local function releaseOrphan(knownKey, indexKey, lockId)
  local lockKey, current = find(knownKey, indexKey, lockId)
  if not lockKey then
    return current -- the reply
  end
  if not string.find(current, UNCLAIMED, 1, true) then
    return 0
  end
  return release(lockKey, indexKey, lockId)
end

local function extend(knownKey, indexKey, lockId, ttl, px)
  local lockKey, current, first, after = find(knownKey, indexKey, lockId)
  if not lockKey then
    return current -- the reply
  end
  -- Never revive an expired lock (find refused it); only the expiry changes (and the lock is
  -- claimed), every other byte of the lock data stays as written.
  redis.call('SET', lockKey, claimed(string.sub(current, 1, first - 1) .. expiresText(ttl)
    .. string.sub(current, after)), 'PX', px)
  setIndex(indexKey, lockKey, px)
  return 1
end

local function extendBy(knownKey, indexKey, lockId, by)
  local lockKey, current, first, after = find(knownKey, indexKey, lockId)
  if not lockKey then
    return current -- the reply
  end
  -- Added to the live lock's expiry (find refused an expired one); every other byte stays.
  local expires = math.min(tonumber(string.sub(current, first, after - 1)) + tonumber(by),
    MAX_EXPIRES)
  local px = string.format('%d', expires - dead)
  redis.call('SET', lockKey, claimed(string.sub(current, 1, first - 1)
    .. string.format('%d', expires) .. string.sub(current, after)), 'PX', px)
  setIndex(indexKey, lockKey, px)
  return {1, expires}
end

local function expireAt(knownKey, indexKey, lockId, at)
  local lockKey, current, first, after = find(knownKey, indexKey, lockId)
  if not lockKey then
    return current -- the reply
  end
  -- Set on the live lock (find refused an expired one), earlier or later; every other byte
  -- stays. Its keys outlive it by the tolerance, as the predicate counts it live: a time
  -- already past leaves the lock expired, its keys gone in a millisecond.
  local expires = tonumber(at)
  local px = string.format('%d', math.max(expires - dead, 1))
  redis.call('SET', lockKey, claimed(string.sub(current, 1, first - 1)
    .. string.format('%d', expires) .. string.sub(current, after)), 'PX', px)
  setIndex(indexKey, lockKey, px)
  return {1, expires}
end

-- Runs one operation; an error (a wrong type under one of its keys, a key of a slot this node
-- does not serve) becomes its reply alone. The commands that can fail come before the lock
-- writes, so a failed operation took, extended or released nothing (at most an acquire dropped
-- the stale index of a dead lock, in the reference layout, which no cluster runs).
local function run(operation, ...)
  local ok, reply = pcall(operation, ...)
  if ok then
    return reply
  end
  if type(reply) == 'table' then
    reply = reply.err
  end
  reply = tostring(reply)
  -- A cluster's refusal of a key the node does not serve, or of any key while the cluster is
  -- down: "Script attempted to access a non local key ..." and the like.
  if string.find(reply, 'Script attempted to', 1, true) then
    return NOT_SERVED_HERE
  end
  return {-100, reply}
end

-- The whole call: KEYS and ARGV as described at the top. Run as a script (EVALSHA), the file
-- ends with `return batch(KEYS, ARGV)`; as a function library, with its registration.
local function batch(KEYS, ARGV)
  local clock = redis.call('TIME')
  now = clock[1] * 1000 + math.floor(clock[2] / 1000)
  -- %d formats an integer; a bare number in a concatenation goes through %.14g, far slower.
  nowText = string.format('%d', now)
  -- A lock whose expiresAtMs is at or below this is expired (the liveness predicate).
  dead = now - tonumber(ARGV[1])
  indexPrefix, releaseChannel = ARGV[2], ARGV[3]
  local keys, a = KEYS, 4
  if indexPrefix == '{}' then
    -- A node call: the keys in ARGV after their count.
    local count = tonumber(ARGV[4])
    keys, a, indexPrefix = {unpack(ARGV, 5, 4 + count)}, 5 + count, ''
  end
  -- "{}" cannot start a channel of a prefix (prefixes have no braces): the cluster's marker.
  sharded = string.sub(releaseChannel, 1, 2) == '{}'
  if sharded then
    releaseChannel = string.sub(releaseChannel, 3)
  end
  lastTtl = nil
  local replies = {now}
  -- The reference layout passes each operation's index key after its lock key; the cluster
  -- layout has none.
  local ik = (indexPrefix ~= '') and 1 or 0
  local k, n = 1, 1
  while a <= #ARGV do
    local op = ARGV[a]
    n = n + 1
    -- The index key after a known lock key (nil in the cluster layout).
    local index = (ik == 1) and keys[k + 1] or nil
    if op == 'A' then
      replies[n] = run(acquire, keys[k], index, keys[k + 1 + ik], ARGV[a + 1], ARGV[a + 2],
        ARGV[a + 3], ARGV[a + 4])
      k, a = k + 2 + ik, a + 5
    elseif op == 'H' then
      replies[n] = run(acquire, keys[k], index, keys[k + 1 + ik], ARGV[a + 1], ARGV[a + 2],
        ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
      k, a = k + 2 + ik, a + 6
    elseif op == 'r' then
      replies[n] = run(release, keys[k], index, ARGV[a + 1])
      k, a = k + 1 + ik, a + 2
    elseif op == 'q' then
      replies[n] = run(release, keys[k], index, ARGV[a + 1], true)
      k, a = k + 1 + ik, a + 2
    elseif op == 'o' then
      replies[n] = run(releaseOrphan, keys[k], index, ARGV[a + 1])
      k, a = k + 1 + ik, a + 2
    elseif op == 'e' then
      replies[n] = run(extend, keys[k], index, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
      k, a = k + 1 + ik, a + 4
    elseif op == 'b' then
      replies[n] = run(extendBy, keys[k], index, ARGV[a + 1], ARGV[a + 2])
      k, a = k + 1 + ik, a + 3
    elseif op == 't' then
      replies[n] = run(expireAt, keys[k], index, ARGV[a + 1], ARGV[a + 2])
      k, a = k + 1 + ik, a + 3
    elseif op == 'R' then
      replies[n] = run(release, nil, keys[k], ARGV[a + 1])
      k, a = k + 1, a + 2
    elseif op == 'Q' then
      replies[n] = run(release, nil, keys[k], ARGV[a + 1], true)
      k, a = k + 1, a + 2
    elseif op == 'O' then
      replies[n] = run(releaseOrphan, nil, keys[k], ARGV[a + 1])
      k, a = k + 1, a + 2
    elseif op == 'E' then
      replies[n] = run(extend, nil, keys[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
      k, a = k + 1, a + 4
    elseif op == 'B' then
      replies[n] = run(extendBy, nil, keys[k], ARGV[a + 1], ARGV[a + 2])
      k, a = k + 1, a + 3
    elseif op == 'T' then
      replies[n] = run(expireAt, nil, keys[k], ARGV[a + 1], ARGV[a + 2])
      k, a = k + 1, a + 3
    else
      return redis.error_reply('ERR syncguard batch: unknown operation ' .. tostring(op))
    end
  end
  return replies
end
