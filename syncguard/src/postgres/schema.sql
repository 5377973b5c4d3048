-- syncguard: PostgreSQL schema. Tables and columns are those of the SyncGuard reference
-- design, so Rust and TypeScript services can share them. Idempotent.

-- Live locks: one row per held (or expired, not yet swept) lock.
CREATE TABLE IF NOT EXISTS "syncguard_locks" (
  key TEXT PRIMARY KEY,          -- storage key: make_storage_key("", key, 1700, 0)
  lock_id TEXT NOT NULL,         -- 22-char base64url
  expires_at_ms BIGINT NOT NULL, -- Unix ms, server time
  acquired_at_ms BIGINT NOT NULL,
  fence TEXT NOT NULL,           -- 15-digit zero-padded
  user_key TEXT NOT NULL         -- the NFC-normalized user key
);
CREATE UNIQUE INDEX IF NOT EXISTS "idx_syncguard_locks_lock_id" ON "syncguard_locks" (lock_id);
CREATE INDEX IF NOT EXISTS "idx_syncguard_locks_expires" ON "syncguard_locks" (expires_at_ms);

-- Fence counters: one row per key ever locked. NEVER delete from this table: fences must
-- keep increasing across releases, expiry, cleanup and restarts.
CREATE TABLE IF NOT EXISTS "syncguard_fence_counters" (
  fence_key TEXT PRIMARY KEY,    -- make_storage_key("", "fence:" + storage key, 1700, 0)
  fence BIGINT NOT NULL DEFAULT 0,
  key_debug TEXT
);

-- Acquire in one round trip: the reference's transaction (advisory lock on the storage key,
-- liveness check, fence increment, lock upsert) as one server-side call. The advisory lock is
-- the reference's, so acquires by TypeScript services serialize with these.
CREATE OR REPLACE FUNCTION "syncguard_locks_acquire"(
  p_key TEXT,
  p_user_key TEXT,
  p_fence_key TEXT,
  p_lock_id TEXT,
  p_ttl_ms BIGINT,
  p_tolerance_ms BIGINT,
  p_fence_max BIGINT
) RETURNS TABLE (acquired BOOLEAN, expires_at_ms BIGINT, fence BIGINT)
LANGUAGE plpgsql AS $syncguard$
#variable_conflict use_column
DECLARE
  v_now BIGINT;
  v_current BIGINT;
  v_fence BIGINT;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext(p_key));
  -- Taken after the advisory lock, so it is never older than a competing holder's write.
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT;

  SELECT l.expires_at_ms INTO v_current FROM "syncguard_locks" AS l WHERE l.key = p_key FOR UPDATE;
  IF FOUND AND v_current > v_now - p_tolerance_ms THEN
    RETURN QUERY SELECT FALSE, v_current, NULL::BIGINT;
    RETURN;
  END IF;

  INSERT INTO "syncguard_fence_counters" AS f (fence_key, fence, key_debug)
  VALUES (p_fence_key, 1, p_user_key)
  ON CONFLICT (fence_key) DO UPDATE SET fence = f.fence + 1
  RETURNING f.fence INTO v_fence;
  -- A counter damaged by hand (negative, or past the maximum) fails the call: raising an
  -- exception undoes the whole statement, so nothing is stored.
  IF v_fence < 1 THEN
    RAISE EXCEPTION 'syncguard fence counter for this key is %, not positive; repair or delete its row', v_fence
      USING ERRCODE = 'SGFEN';
  END IF;
  IF v_fence > p_fence_max THEN
    RAISE EXCEPTION 'syncguard fence % exceeds the maximum %; rotate the key namespace', v_fence, p_fence_max
      USING ERRCODE = 'SGFEN';
  END IF;

  INSERT INTO "syncguard_locks" AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
  VALUES (p_key, p_lock_id, v_now + p_ttl_ms, v_now, lpad(v_fence::TEXT, 15, '0'), p_user_key)
  ON CONFLICT (key) DO UPDATE SET
    lock_id = EXCLUDED.lock_id,
    expires_at_ms = EXCLUDED.expires_at_ms,
    acquired_at_ms = EXCLUDED.acquired_at_ms,
    fence = EXCLUDED.fence,
    user_key = EXCLUDED.user_key;
  RETURN QUERY SELECT TRUE, v_now + p_ttl_ms, v_fence;
END
$syncguard$;
