-- syncguard: PostgreSQL schema. Tables and columns are those of the SyncGuard reference
-- design, so Rust and TypeScript services can share them. Idempotent.

-- Live locks: one row per held (or expired, not yet swept) lock.
CREATE TABLE IF NOT EXISTS "syncguard_locks" (
  key TEXT PRIMARY KEY,          -- storage key: make_storage_key("", key, 1700, 0)
  lock_id TEXT NOT NULL,         -- 22-char base64url
  expires_at_ms BIGINT NOT NULL, -- Unix ms, server time
  acquired_at_ms BIGINT NOT NULL,
  fence TEXT NOT NULL,           -- 15-digit zero-padded
  user_key TEXT NOT NULL,        -- the NFC-normalized user key
  holder TEXT,                   -- who took it (LockBackend::acquire_as); NULL when nobody said
  contended BOOLEAN,             -- an acquire was refused during this hold: its release announces
                                 -- itself; FALSE: nobody was; NULL: not known (announced)
  unclaimed BOOLEAN              -- TRUE while only the acquire with a holder that took it has used
                                 -- its lock id (no re-entry, extend or release since): a release
                                 -- of that acquire in doubt may delete it
);
CREATE UNIQUE INDEX IF NOT EXISTS "idx_syncguard_locks_lock_id" ON "syncguard_locks" (lock_id);
CREATE INDEX IF NOT EXISTS "idx_syncguard_locks_expires" ON "syncguard_locks" (expires_at_ms);

-- The holder column, added to tables created without it (by an older syncguard, or by the
-- TypeScript reference, whose statements never name it). The catalog is checked first: ALTER
-- TABLE locks the table exclusively even when the column exists, and would wait for (and make
-- every lock operation wait behind) any long reader of the table, such as a pg_dump.
DO $syncguard$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = '"syncguard_locks"'::regclass AND attname = 'holder' AND NOT attisdropped) THEN
    ALTER TABLE "syncguard_locks" ADD COLUMN IF NOT EXISTS holder TEXT;
  END IF;
END
$syncguard$;

-- The contended column, added likewise to tables created without it (by an older syncguard, or
-- by the TypeScript reference). Existing rows read NULL: not known, so their releases announce
-- themselves, as they always did.
DO $syncguard$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = '"syncguard_locks"'::regclass AND attname = 'contended' AND NOT attisdropped) THEN
    ALTER TABLE "syncguard_locks" ADD COLUMN IF NOT EXISTS contended BOOLEAN;
  END IF;
END
$syncguard$;

-- The unclaimed column, added likewise. Existing rows read NULL: claimed, never released in doubt.
DO $syncguard$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = '"syncguard_locks"'::regclass AND attname = 'unclaimed' AND NOT attisdropped) THEN
    ALTER TABLE "syncguard_locks" ADD COLUMN IF NOT EXISTS unclaimed BOOLEAN;
  END IF;
END
$syncguard$;

-- A holder belongs to the lock it was stored with. A writer that gives the row another lock id
-- without naming the holder (the TypeScript reference's upsert over an expired lock, or an
-- older syncguard's) would otherwise hand the new lock the previous holder, who could then
-- re-enter a lock it never took: the row loses its holder instead. Whether anyone was refused
-- is not known of the new lock either (NULL: its release announces itself). This library never
-- changes a row's lock id by UPDATE (its acquire deletes the expired row and inserts the new one).
CREATE OR REPLACE FUNCTION "syncguard_locks_clear_holder"() RETURNS trigger
LANGUAGE plpgsql AS $syncguard$
BEGIN
  NEW.holder := NULL;
  NEW.contended := NULL;
  NEW.unclaimed := NULL;
  RETURN NEW;
END
$syncguard$;
DO $syncguard$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_trigger
                 WHERE tgrelid = '"syncguard_locks"'::regclass AND tgname = 'syncguard_clear_holder') THEN
    CREATE TRIGGER syncguard_clear_holder BEFORE UPDATE ON "syncguard_locks"
      FOR EACH ROW WHEN (NEW.lock_id IS DISTINCT FROM OLD.lock_id)
      EXECUTE FUNCTION "syncguard_locks_clear_holder"();
  END IF;
END
$syncguard$;

-- Fence counters: one row per key ever locked. NEVER delete from this table: fences must
-- keep increasing across releases, expiry, cleanup and restarts.
CREATE TABLE IF NOT EXISTS "syncguard_fence_counters" (
  fence_key TEXT PRIMARY KEY,    -- make_storage_key("", "fence:" + storage key, 1700, 0)
  fence BIGINT NOT NULL DEFAULT 0,
  key_debug TEXT
);

-- Acquire in one round trip: the reference's transaction (advisory lock on the storage key,
-- liveness check, fence increment, lock upsert) as one server-side call. The advisory lock is
-- the reference's, so acquires by TypeScript services serialize with these. With a holder
-- (p_holder, NULL for none), a live lock stored with the same holder is re-entered: a fresh
-- lease (expires now + ttl, acquired now), the same lock id, fence and contended mark, and
-- claimed (its lock id is handed to this caller: a release of the acquire that took it, in
-- doubt, leaves it be). A new lock taken with a holder is unclaimed until then. A new
-- lock is not contended. Returns the lock id held: the new one, or the re-entered one;
-- refused, it returns FALSE with the live holder's expires_at_ms (the waiter tries again when
-- that lease ends), and marks the lock contended, so that its release wakes the waiters (the
-- release statement announces only such releases). (Installations set up before
-- holders also keep the seven-argument version of this function, which older syncguard
-- versions call.)
CREATE OR REPLACE FUNCTION "syncguard_locks_acquire"(
  p_key TEXT,
  p_user_key TEXT,
  p_fence_key TEXT,
  p_lock_id TEXT,
  p_ttl_ms BIGINT,
  p_tolerance_ms BIGINT,
  p_fence_max BIGINT,
  p_holder TEXT
) RETURNS TABLE (acquired BOOLEAN, expires_at_ms BIGINT, fence BIGINT, lock_id TEXT)
LANGUAGE plpgsql AS $syncguard$
#variable_conflict use_column
DECLARE
  v_now BIGINT;
  v_current RECORD;
  v_stored BOOLEAN;
  v_fence BIGINT;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext(p_key));
  -- Taken after the advisory lock, so it is never older than a competing holder's write.
  v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT;

  SELECT l.expires_at_ms, l.lock_id, l.fence, l.holder, l.contended INTO v_current
    FROM "syncguard_locks" AS l WHERE l.key = p_key FOR UPDATE;
  v_stored := FOUND;
  IF v_stored AND v_current.expires_at_ms > v_now - p_tolerance_ms THEN
    IF p_holder IS NOT NULL AND v_current.holder = p_holder THEN
      UPDATE "syncguard_locks" AS l SET expires_at_ms = v_now + p_ttl_ms, acquired_at_ms = v_now,
        unclaimed = NULL
        WHERE l.key = p_key;
      RETURN QUERY SELECT TRUE, v_now + p_ttl_ms, v_current.fence::BIGINT, v_current.lock_id;
      RETURN;
    END IF;
    -- Refused: the lock's release must announce itself. Only the first refusal of a hold
    -- writes. The row is locked (FOR UPDATE above) until this call commits, so a release
    -- cannot slip between the read and the mark: it waits, then deletes the marked row. A
    -- refusal stores nothing of value (a lost mark costs a notification, and waiters poll), so
    -- it does not wait for its commit to be flushed (nor would anything else the calling
    -- transaction writes: this library runs the call as a statement of its own).
    PERFORM set_config('synchronous_commit', 'off', true);
    IF v_current.contended IS FALSE THEN
      UPDATE "syncguard_locks" AS l SET contended = TRUE WHERE l.key = p_key;
    END IF;
    RETURN QUERY SELECT FALSE, v_current.expires_at_ms::BIGINT, NULL::BIGINT, NULL::TEXT;
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

  -- The expired lock is replaced by delete and insert, not by an update that changes its lock
  -- id (which clears the holder, see above). The advisory lock and the row lock keep the key
  -- to this call meanwhile.
  IF v_stored THEN
    DELETE FROM "syncguard_locks" AS l WHERE l.key = p_key;
  END IF;
  INSERT INTO "syncguard_locks" (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key, holder, contended, unclaimed)
  VALUES (p_key, p_lock_id, v_now + p_ttl_ms, v_now, lpad(v_fence::TEXT, 15, '0'), p_user_key, p_holder, FALSE,
          CASE WHEN p_holder IS NOT NULL THEN TRUE END);
  RETURN QUERY SELECT TRUE, v_now + p_ttl_ms, v_fence, p_lock_id;
END
$syncguard$;
