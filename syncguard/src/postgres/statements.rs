//! The SQL of every operation, rendered once for the configured table names: the server's
//! clock in each statement, values always bound.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlStr};

use super::config::{Names, PostgresConfig};
use crate::LockError;

/// The server's clock in Unix milliseconds, in every statement.
macro_rules! now_ms {
    () => {
        "floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

/// The configuration, and the statements rendered from it.
pub(super) struct Inner {
    pub(super) config: PostgresConfig,
    pub(super) acquire: SqlStr,
    pub(super) release: SqlStr,
    pub(super) extend: SqlStr,
    pub(super) extend_by: SqlStr,
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
            acquire: acquire_fn,
            ..
        } = Names::new(&config);
        let now = now_ms!();
        // A live lock deleted is announced to the waiters (`listener.rs`) when an acquire was
        // refused while it was held (the acquire function marks it `contended`; NULL, in rows
        // written without the mark, counts as contended). An uncontended release, the common
        // case, sends nothing: PostgreSQL serializes the commits of notifying transactions
        // server-wide until they are flushed, which would stop concurrent releases from sharing
        // their WAL flushes. The mark is read through the row's JSON so that the statement
        // runs on a table `setup_schema` has not upgraded yet (no column: announced, as
        // before). NOTIFY is transactional: only a committed release is announced. The payload
        // is the normalized key; PostgreSQL refuses payloads of 8000 bytes or more, which no
        // key of ours reaches (512 at most) but a row written by hand could: such a release is
        // not announced rather than failed. The aggregate makes PostgreSQL call `pg_notify`
        // once per deleted row. An unannounced release answers with its key, so that this
        // process's own waiters are woken without the server (`release_impl`).
        let (returning, announce) = if config.release_notifications() {
            (
                ", (to_jsonb(l) -> 'contended') IS DISTINCT FROM 'false'::jsonb \
                 AND octet_length(l.user_key) < 8000 AS announce",
                format!(
                    ", (SELECT count(pg_notify('{channel}', user_key)) FROM released WHERE announce) AS announced, \
                     (SELECT user_key FROM released WHERE NOT announce) AS unannounced",
                    channel = config.release_channel()
                ),
            )
        } else {
            ("", String::new())
        };
        let lookup = |column: &str| {
            statement(format!(
                "SELECT user_key, lock_id, expires_at_ms, acquired_at_ms, fence, holder FROM {locks} \
                 WHERE {column} = $1 AND expires_at_ms > {now} - $2"
            ))
        };
        Ok(Self {
            // With a holder ($8, NULL for none) it also re-enters that holder's live lock, and
            // answers with the lock id held (the re-entered one).
            acquire: statement(format!(
                "SELECT acquired, expires_at_ms, fence, lock_id \
                 FROM {acquire_fn}($1, $2, $3, $4, $5, $6, $7, $8)"
            )),
            // Resolve, verify ownership and liveness, and delete in one atomic statement. A
            // competing writer makes PostgreSQL re-check `lock_id` and expiry on the row's
            // newest version, so a lock taken over in between is never deleted, and the mark
            // of a refusal that committed meanwhile is read.
            release: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 released AS (DELETE FROM {locks} AS l WHERE l.lock_id = $1 AND l.expires_at_ms > {now} - $2 \
                   RETURNING l.user_key{returning}) \
                 SELECT EXISTS (SELECT 1 FROM released) AS released, EXISTS (SELECT 1 FROM target) AS found{announce}"
            )),
            extend: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 clock AS (SELECT {now} AS ms), \
                 extended AS (UPDATE {locks} SET expires_at_ms = clock.ms + $2 FROM clock \
                   WHERE lock_id = $1 AND expires_at_ms > clock.ms - $3 RETURNING expires_at_ms) \
                 SELECT (SELECT expires_at_ms FROM extended) AS expires_at_ms, EXISTS (SELECT 1 FROM target) AS found"
            )),
            // As `extend`, adding $2 to the stored expiry instead of to the clock.
            extend_by: statement(format!(
                "WITH target AS (SELECT 1 FROM {locks} WHERE lock_id = $1), \
                 clock AS (SELECT {now} AS ms), \
                 extended AS (UPDATE {locks} SET expires_at_ms = expires_at_ms + $2 FROM clock \
                   WHERE lock_id = $1 AND expires_at_ms > clock.ms - $3 RETURNING expires_at_ms) \
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
