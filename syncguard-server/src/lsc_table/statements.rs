//! The SQL of the LSC-table mode, for one validated table name `T`: LSC's own DDL for `T`, our
//! two side tables, and one statement per operation (each one round trip, every decision on
//! the database clock).

/// The database's current epoch second, floored (LSC's API servers floor their clock; its
/// statements' `::bigint` rounds, see the module docs).
const NOW_S: &str = "floor(extract(epoch from now()))::bigint";

/// The lock id a row of `T` (aliased `t`) derives: base64url (no padding) of the first 16
/// bytes of SHA-256 over `namespace \0 lock_name \0 owner \0 instance_id` (UTF-8), the same as
/// [`derive_lock_id`](super::identity::derive_lock_id) computes.
fn derived_id(t: &str) -> String {
    format!(
        "translate(rtrim(encode(substring(sha256(\
         convert_to({t}.namespace, 'UTF8') || '\\x00'::bytea || \
         convert_to({t}.lock_name, 'UTF8') || '\\x00'::bytea || \
         convert_to({t}.owner, 'UTF8') || '\\x00'::bytea || \
         convert_to({t}.instance_id, 'UTF8')) from 1 for 16), 'base64'), '='), '+/', '-_')"
    )
}

/// Every statement, for one table.
#[derive(Debug, Clone)]
pub(super) struct Statements {
    /// Creates what is missing: LSC's table (its documented DDL, never altered when it
    /// exists), `T_syncguard` (lock id → key) and `T_fences` (never deleted from).
    pub(super) setup: String,
    /// `$1` ns, `$2` name, `$3` owner, `$4` instance id, `$5` D (s), `$6` lock id →
    /// `(expiry, lease_duration, fence)` when acquired, no row when refused.
    pub(super) acquire: String,
    /// `$1` lock id, `$2` seconds → `(expiry)` when the live row derives the lock id.
    pub(super) extend_by: String,
    /// `$1` lock id, `$2` D (s) → `(expiry)`: expiry = now_s + D, acquisition second kept.
    pub(super) extend: String,
    /// `$1` lock id → one row per deleted lock (0 or 1).
    pub(super) release: String,
    /// `$1` ns, `$2` name → `(owner, instance_id, lease_duration, expiry, fence)` if live
    /// (recording the row's counter and lock id when missing).
    pub(super) lookup_key: String,
    /// `$1` lock id → `(namespace, lock_name, owner, instance_id, lease_duration, expiry,
    /// fence)` if the live row derives it.
    pub(super) lookup_id: String,
    /// `$1` ns, `$2` name → `(bool)`.
    pub(super) is_locked: String,
    /// Installs (or replaces) the fence trigger on `T`: see [`FENCE_TRIGGER`].
    pub(super) install_fence_trigger: String,
    /// `→ (bool)`: whether `T` has the fence trigger.
    pub(super) has_fence_trigger: String,
}

/// The name of the trigger on LSC's table that bumps the fence counter on LSC's own
/// acquisitions (trigger names are per table, so one name serves every table).
pub(super) const FENCE_TRIGGER: &str = "syncguard_fence";

/// The transaction-local setting the server's acquire statement sets: its acquisition bumps
/// the counter itself (and returns the value), so the trigger must not bump it again.
const FENCED_MARKER: &str = "syncguard.lsc_fenced";

/// The trigger function, shared by every table (the counter table is its argument). It bumps
/// the counter when a row is inserted, changes holder, or is taken again by its holder after
/// expiring: exactly the writes of LSC's acquire that start a new hold. LSC's renew (same
/// holder, live row) and the server's own statements leave it alone.
fn fence_function() -> String {
    format!(
        "CREATE OR REPLACE FUNCTION syncguard_lsc_fence_bump() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('{FENCED_MARKER}', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT'
       OR OLD.owner <> NEW.owner OR OLD.instance_id <> NEW.instance_id
       OR OLD.expiry < {NOW_S} THEN
        EXECUTE format(
            'INSERT INTO %I.%I AS f (namespace, lock_name, fence) VALUES ($1, $2, 1)
             ON CONFLICT (namespace, lock_name) DO UPDATE SET fence = f.fence + 1',
            TG_TABLE_SCHEMA, TG_ARGV[0])
        USING NEW.namespace, NEW.lock_name;
    END IF;
    RETURN NULL;
END
$fn$;"
    )
}

impl Statements {
    /// The statements for table `t` (already validated as a plain identifier).
    pub(super) fn new(t: &str) -> Self {
        let side = format!("{t}_syncguard");
        let fences = format!("{t}_fences");
        let derived = derived_id("t");
        let setup = format!(
            "CREATE TABLE IF NOT EXISTS {t} (
    namespace      VARCHAR(255) NOT NULL,
    lock_name      VARCHAR(255) NOT NULL,
    owner          VARCHAR(255) NOT NULL,
    instance_id    VARCHAR(255) NOT NULL,
    lease_duration BIGINT       NOT NULL,
    expiry         BIGINT       NOT NULL,
    PRIMARY KEY (namespace, lock_name)
);
CREATE INDEX IF NOT EXISTS idx_{t}_expiry ON {t} (expiry);
CREATE TABLE IF NOT EXISTS {side} (
    lock_id   TEXT         PRIMARY KEY,
    namespace VARCHAR(255) NOT NULL,
    lock_name VARCHAR(255) NOT NULL
);
CREATE INDEX IF NOT EXISTS {side}_key ON {side} (namespace, lock_name);
CREATE TABLE IF NOT EXISTS {fences} (
    namespace VARCHAR(255) NOT NULL,
    lock_name VARCHAR(255) NOT NULL,
    fence     BIGINT       NOT NULL,
    PRIMARY KEY (namespace, lock_name)
);"
        );
        // `prev` locks the current row first (the upsert's source reads it, so it runs
        // before the upsert) and sees its latest version; a same-holder re-entry of a live
        // lock keeps its fence, any other acquisition bumps the counter.
        // `clock` also sets the marker that tells the fence trigger (when installed) that
        // this statement bumps the counter itself: `up` reads `clock`, so the marker is set
        // before the row is written, and the trigger (after the statement) sees it.
        let acquire = format!(
            "WITH clock AS (SELECT {NOW_S} AS s, set_config('{FENCED_MARKER}', 'on', true) AS marker),
prev AS MATERIALIZED (
    SELECT owner, instance_id, expiry FROM {t}
    WHERE namespace = $1 AND lock_name = $2 FOR UPDATE
),
up AS (
    INSERT INTO {t} AS t (namespace, lock_name, owner, instance_id, lease_duration, expiry)
    SELECT $1, $2, $3, $4, $5, clock.s + $5
    FROM clock LEFT JOIN prev ON true
    ON CONFLICT (namespace, lock_name) DO UPDATE SET
        owner = EXCLUDED.owner, instance_id = EXCLUDED.instance_id,
        lease_duration = EXCLUDED.lease_duration, expiry = EXCLUDED.expiry
    WHERE t.expiry < (SELECT s FROM clock)
       OR (t.owner = EXCLUDED.owner AND t.instance_id = EXCLUDED.instance_id)
    RETURNING t.expiry, t.lease_duration
),
kept AS (
    SELECT f.fence FROM {fences} f, prev, clock
    WHERE f.namespace = $1 AND f.lock_name = $2
      AND prev.expiry >= clock.s AND prev.owner = $3 AND prev.instance_id = $4
),
bumped AS (
    INSERT INTO {fences} AS f (namespace, lock_name, fence)
    SELECT $1, $2, 1 FROM up WHERE NOT EXISTS (SELECT 1 FROM kept)
    ON CONFLICT (namespace, lock_name) DO UPDATE SET fence = f.fence + 1
    RETURNING f.fence
),
side AS (
    INSERT INTO {side} (lock_id, namespace, lock_name)
    SELECT $6, $1, $2 FROM up
    ON CONFLICT (lock_id) DO NOTHING
),
pruned AS (
    DELETE FROM {side}
    WHERE namespace = $1 AND lock_name = $2 AND lock_id <> $6 AND EXISTS (SELECT 1 FROM up)
)
SELECT up.expiry AS expiry, up.lease_duration AS lease_duration,
       COALESCE((SELECT fence FROM bumped), (SELECT fence FROM kept)) AS fence
FROM up"
        );
        let live_derived = format!(
            "s.lock_id = $1 AND t.namespace = s.namespace AND t.lock_name = s.lock_name
  AND t.expiry >= {NOW_S} AND {derived} = $1"
        );
        let extend_by = format!(
            "UPDATE {t} AS t SET lease_duration = t.lease_duration + $2, expiry = t.expiry + $2
FROM {side} s
WHERE {live_derived}
RETURNING t.expiry AS expiry"
        );
        let extend = format!(
            "UPDATE {t} AS t
SET lease_duration = t.lease_duration + ({NOW_S} + $2 - t.expiry), expiry = {NOW_S} + $2
FROM {side} s
WHERE {live_derived}
RETURNING t.expiry AS expiry"
        );
        let release = format!(
            "WITH del AS (
    DELETE FROM {t} AS t USING {side} s
    WHERE {live_derived}
    RETURNING t.namespace
),
side AS (DELETE FROM {side} WHERE lock_id = $1 AND EXISTS (SELECT 1 FROM del))
SELECT namespace FROM del"
        );
        // A live row LSC wrote has no counter yet when no syncguard-server acquisition ever
        // took its key: it gets one (1) here, so the next acquisition here gets 2. Its lock
        // id is recorded too, so that the lock id this lookup reports can renew or release
        // it (the server looks a lock up, then acts with its lock id).
        let derived_cur = derived_id("cur");
        let lookup_key = format!(
            "WITH cur AS MATERIALIZED (
    SELECT namespace, lock_name, owner, instance_id, lease_duration, expiry FROM {t}
    WHERE namespace = $1 AND lock_name = $2 AND expiry >= {NOW_S}
),
recorded AS (
    INSERT INTO {side} (lock_id, namespace, lock_name)
    SELECT {derived_cur}, namespace, lock_name FROM cur
    ON CONFLICT (lock_id) DO NOTHING
),
created AS (
    INSERT INTO {fences} (namespace, lock_name, fence)
    SELECT namespace, lock_name, 1 FROM cur
    ON CONFLICT (namespace, lock_name) DO NOTHING
    RETURNING fence
)
SELECT cur.owner AS owner, cur.instance_id AS instance_id,
       cur.lease_duration AS lease_duration, cur.expiry AS expiry,
       COALESCE((SELECT fence FROM created),
                (SELECT fence FROM {fences} WHERE namespace = $1 AND lock_name = $2)) AS fence
FROM cur"
        );
        let lookup_id = format!(
            "SELECT t.namespace AS namespace, t.lock_name AS lock_name, t.owner AS owner,
       t.instance_id AS instance_id, t.lease_duration AS lease_duration, t.expiry AS expiry,
       f.fence AS fence
FROM {side} s
JOIN {t} t ON t.namespace = s.namespace AND t.lock_name = s.lock_name
LEFT JOIN {fences} f ON f.namespace = t.namespace AND f.lock_name = t.lock_name
WHERE {live_derived}"
        );
        let is_locked = format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE namespace = $1 AND lock_name = $2 AND expiry >= {NOW_S}) AS locked"
        );
        let install_fence_trigger = format!(
            "{function}
DROP TRIGGER IF EXISTS {FENCE_TRIGGER} ON {t};
CREATE TRIGGER {FENCE_TRIGGER} AFTER INSERT OR UPDATE ON {t}
    FOR EACH ROW EXECUTE FUNCTION syncguard_lsc_fence_bump('{fences_folded}');",
            function = fence_function(),
            // The name as PostgreSQL stored the unquoted identifier; the function quotes it.
            fences_folded = fences.to_ascii_lowercase()
        );
        let has_fence_trigger = format!(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger
    WHERE tgrelid = to_regclass('{t}') AND tgname = '{FENCE_TRIGGER}' AND NOT tgisinternal)"
        );
        Self {
            setup,
            acquire,
            extend_by,
            extend,
            release,
            lookup_key,
            lookup_id,
            is_locked,
            install_fence_trigger,
            has_fence_trigger,
        }
    }
}
