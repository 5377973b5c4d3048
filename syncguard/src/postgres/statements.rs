//! The SQL of every operation, rendered once for the configured table names: the server's
//! clock in each statement, values always bound.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlStr};

use super::config::{Names, PostgresConfig};
use crate::error::LockError;

/// The server's clock in Unix milliseconds, in every statement.
macro_rules! now_ms {
    () => {
        "floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

/// The configuration, and the statements rendered from it.
pub(super) struct Inner {
    pub(super) config: PostgresConfig,
    pub(super) acquire_free: SqlStr,
    pub(super) acquire: SqlStr,
    pub(super) release: SqlStr,
    /// Whether a row of the lock id exists: after a release deleted nothing, it tells an
    /// expired lock from one not found.
    pub(super) lock_id_stored: SqlStr,
    pub(super) extend: SqlStr,
    pub(super) extend_by: SqlStr,
    pub(super) expire_at: SqlStr,
    pub(super) release_orphan: SqlStr,
    pub(super) is_locked: SqlStr,
    pub(super) lookup_by_key: SqlStr,
    pub(super) lookup_by_id: SqlStr,
    pub(super) cleanup_key: SqlStr,
    pub(super) sweep: SqlStr,
}

fn statement(sql: String) -> SqlStr {
    // Only validated identifiers (PostgresConfig::validate) are interpolated, the release
    // channel among them (a string literal of identifier characters); values are bound.
    sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(Arc::<str>::from(sql)))
}

impl Inner {
    pub(super) fn new(config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let Names {
            locks,
            fences,
            acquire: acquire_fn,
            ..
        } = Names::new(&config);
        let now = now_ms!();
        // A live lock deleted is announced to the waiters (`listener.rs`) when an acquire was
        // refused while it was held (the acquire function marks it `contended`; NULL, in rows
        // written without the mark, counts as contended). An uncontended release, the common
        // case, sends nothing: PostgreSQL serializes the commits of notifying transactions
        // server-wide until they are flushed, which would stop concurrent releases from sharing
        // their WAL flushes. The column is there on every table these statements run on
        // (`setup_schema` adds it; the plain acquire writes it). NOTIFY is transactional: only a committed release is announced. The payload
        // is the normalized key; PostgreSQL refuses payloads of 8000 bytes or more, which no
        // key of ours reaches (512 at most) but a row written by hand could: such a release is
        // not announced rather than failed. `RETURNING` calls `pg_notify` for the deleted row
        // only. A release answers with its key and whether it was announced, so that this
        // process's own waiters of an unannounced one are woken without the server
        // (`release_impl`).
        let announced = if config.release_notifications() {
            format!(
                ", (CASE WHEN l.contended IS DISTINCT FROM FALSE \
                 AND octet_length(l.user_key) < 8000 \
                 THEN pg_notify('{channel}', l.user_key) END) IS NOT NULL AS announced",
                channel = config.release_channel()
            )
        } else {
            String::new()
        };
        let lookup = |column: &str| {
            statement(format!(
                "SELECT user_key::TEXT AS user_key, lock_id::TEXT AS lock_id, \
                 expires_at_ms::BIGINT AS expires_at_ms, acquired_at_ms::BIGINT AS acquired_at_ms, \
                 fence::TEXT AS fence, holder::TEXT AS holder FROM {locks} \
                 WHERE {column} = $1 AND expires_at_ms > {now} - $2"
            ))
        };
        // Every column a statement answers with is named with `AS`, as `columns.rs` reads it,
        // and cast to the type this backend reads: a
        // column a DBA altered (to NUMERIC, say) is converted inside the statement, or fails it
        // (rolled back, nothing stored), and never fails the decoding of a row whose write has
        // committed.
        Ok(Self {
            // A key without a row, the common case, taken by one plain statement, which costs
            // the server far less than the acquire function. It inserts only while no row of
            // the key exists and it holds the reference's advisory lock on the key, which every
            // writer of a lock row holds (this library's acquires, and the reference's): one
            // that committed between this statement's snapshot and its advisory lock makes the
            // insert fail on the key's unique index (a unique violation), so it never overwrites
            // a lock. It takes nothing (no row, so the caller runs the acquire function) when a
            // row exists (live, expired or being released), when another transaction holds
            // the advisory lock (it does not wait for it: a wait would leave it reading an older
            // snapshot), or when the fence counter would leave 1..=$6 (the function then says
            // so). The counter is only incremented with the insert, in the same statement.
            acquire_free: statement(format!(
                "WITH fence AS (\
                   INSERT INTO {fences} AS f (fence_key, fence, key_debug) \
                   SELECT $3, 1, $2 \
                   WHERE NOT EXISTS (SELECT 1 FROM {locks} AS l WHERE l.key = $1) \
                     AND pg_try_advisory_xact_lock(hashtext($1)) \
                   ON CONFLICT (fence_key) DO UPDATE SET fence = f.fence + 1 \
                     WHERE f.fence >= 0 AND f.fence < $6 \
                   RETURNING f.fence), \
                 clock AS (SELECT {now} AS ms) \
                 INSERT INTO {locks} AS l (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key, holder, contended) \
                 SELECT $1, $4, clock.ms + $5, clock.ms, lpad(fence.fence::TEXT, 15, '0'), $2, $7, FALSE \
                 FROM fence, clock \
                 RETURNING TRUE AS acquired, l.expires_at_ms::BIGINT AS expires_at_ms, l.fence::BIGINT AS fence, l.lock_id::TEXT AS lock_id"
            )),
            // With a holder ($8, NULL for none) it also re-enters that holder's live lock, and
            // answers with the lock id held (the re-entered one).
            acquire: statement(format!(
                "SELECT acquired AS acquired, expires_at_ms AS expires_at_ms, fence AS fence, \
                 lock_id AS lock_id \
                 FROM {acquire_fn}($1, $2, $3, $4, $5, $6, $7, $8)"
            )),
            // Verify ownership and liveness, and delete, in one atomic statement: a row when
            // released, none otherwise (`lock_id_stored` tells not found from expired). A
            // competing writer makes PostgreSQL re-check `lock_id` and expiry on the row's
            // newest version, so a lock taken over in between is never deleted, and the mark of
            // a refusal that committed meanwhile is read. With notifications, the second
            // column says whether the release was announced (`pg_notify` returns void, which is
            // not NULL; it runs only for the row deleted).
            release: statement(format!(
                "DELETE FROM {locks} AS l WHERE l.lock_id = $1 AND l.expires_at_ms > {now} - $2 \
                 RETURNING l.user_key::TEXT AS user_key{announced}"
            )),
            // As `release`, for a lock an acquire with a holder may have taken for a caller
            // that never learnt it: only while it is unclaimed (no re-entry, extend or release
            // has used its lock id since).
            release_orphan: statement(format!(
                "DELETE FROM {locks} AS l WHERE l.lock_id = $1 AND l.expires_at_ms > {now} - $2 \
                 AND l.unclaimed RETURNING l.user_key::TEXT AS user_key{announced}"
            )),
            lock_id_stored: statement(format!(
                "SELECT EXISTS (SELECT 1 FROM {locks} WHERE lock_id = $1) AS found"
            )),
            // Every extend claims the lock: its lock id is in use (see `release_orphan`).
            extend: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 clock AS (SELECT {now} AS ms), \
                 extended AS (UPDATE {locks} SET expires_at_ms = clock.ms + $2, unclaimed = NULL FROM clock \
                   WHERE lock_id = $1 AND expires_at_ms > clock.ms - $3 RETURNING expires_at_ms::BIGINT AS expires_at_ms) \
                 SELECT (SELECT expires_at_ms FROM extended) AS expires_at_ms, EXISTS (SELECT 1 FROM target) AS found"
            )),
            // As `extend`, adding $2 to the stored expiry instead of to the clock.
            extend_by: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 clock AS (SELECT {now} AS ms), \
                 extended AS (UPDATE {locks} SET expires_at_ms = expires_at_ms + $2, unclaimed = NULL FROM clock \
                   WHERE lock_id = $1 AND expires_at_ms > clock.ms - $3 RETURNING expires_at_ms::BIGINT AS expires_at_ms) \
                 SELECT (SELECT expires_at_ms FROM extended) AS expires_at_ms, EXISTS (SELECT 1 FROM target) AS found"
            )),
            // As `extend`, setting the expiry to $2 (earlier or later than it is).
            expire_at: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 clock AS (SELECT {now} AS ms), \
                 extended AS (UPDATE {locks} SET expires_at_ms = $2, unclaimed = NULL FROM clock \
                   WHERE lock_id = $1 AND expires_at_ms > clock.ms - $3 RETURNING expires_at_ms::BIGINT AS expires_at_ms) \
                 SELECT (SELECT expires_at_ms FROM extended) AS expires_at_ms, EXISTS (SELECT 1 FROM target) AS found"
            )),
            is_locked: statement(format!(
                "SELECT expires_at_ms > {now} - $2 AS live, expires_at_ms < {now} - $3 AS sweepable \
                 FROM {locks} WHERE key = $1"
            )),
            lookup_by_key: lookup("key"),
            lookup_by_id: lookup("lock_id"),
            cleanup_key: statement(format!(
                "DELETE FROM {locks} WHERE key = $1 AND expires_at_ms < {now} - $2"
            )),
            sweep: statement(format!(
                "DELETE FROM {locks} WHERE expires_at_ms < {now} - $1"
            )),
            config,
        })
    }
}
