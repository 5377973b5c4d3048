//! The answers of the statements, read by column name (`statements.rs` names each column
//! with `AS`).
//!
//! Expiry and fence are both BIGINT, so a row read by position would still decode after a
//! SELECT's columns were reordered, with the two swapped. Read by name, a reordered SELECT is
//! read right, and a column renamed or missing fails the read (an internal error naming it).

use sqlx::postgres::PgRow;
use sqlx::{Decode, Postgres, Row, Type};

use crate::backend::{AcquireOutcome, Lease, LockInfo};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

/// Whether an acquire took (or re-entered) the lock.
pub(super) const ACQUIRED: &str = "acquired";
/// The lock's expiry (Unix ms): the new lease's, or the refusing holder's.
pub(super) const EXPIRES_AT_MS: &str = "expires_at_ms";
/// The fence, a BIGINT in acquire answers and the stored 15-digit TEXT in lookups.
pub(super) const FENCE: &str = "fence";
pub(super) const LOCK_ID: &str = "lock_id";
pub(super) const USER_KEY: &str = "user_key";
pub(super) const ACQUIRED_AT_MS: &str = "acquired_at_ms";
pub(super) const HOLDER: &str = "holder";
/// Whether a release was announced to the waiters (only with release notifications).
pub(super) const ANNOUNCED: &str = "announced";
/// Whether a row of the lock id exists.
pub(super) const FOUND: &str = "found";
pub(super) const LIVE: &str = "live";
pub(super) const SWEEPABLE: &str = "sweepable";

fn decode_error(error: sqlx::Error) -> LockError {
    LockError::internal("unexpected column in a syncguard PostgreSQL result").with_source(error)
}

/// The value of `column` in `row`.
pub(super) fn read<'r, T>(row: &'r PgRow, column: &str) -> Result<T, LockError>
where
    T: Decode<'r, Postgres> + Type<Postgres>,
{
    row.try_get(column).map_err(decode_error)
}

/// The milliseconds of `column` in `row`, never negative.
pub(super) fn millis(row: &PgRow, column: &str) -> Result<u64, LockError> {
    to_millis(read(row, column)?)
}

/// A stored millisecond value, never negative.
pub(super) fn to_millis(value: i64) -> Result<u64, LockError> {
    u64::try_from(value)
        .map_err(|_| LockError::internal(format!("stored timestamp {value} is negative")))
}

/// The outcome an acquire statement's row says: taken (this call's lock id, or the re-entered
/// lock's), or contended.
pub(super) fn acquire_answer(row: &PgRow) -> Result<AcquireOutcome, LockError> {
    if !read::<bool>(row, ACQUIRED)? {
        return refusal(row);
    }
    let held: String = read(row, LOCK_ID)?;
    Ok(AcquireOutcome::Acquired(Lease::new(
        parse_lock_id(&held)?,
        millis(row, EXPIRES_AT_MS)?,
        Fence::new(millis(row, FENCE)?)?,
    )))
}

/// The lock a retried plain acquire found its first run took (a lookup row).
pub(super) fn own_lock(lock_id: LockId, row: &PgRow) -> Result<AcquireOutcome, LockError> {
    let fence: String = read(row, FENCE)?;
    Ok(AcquireOutcome::Acquired(Lease::new(
        lock_id,
        millis(row, EXPIRES_AT_MS)?,
        fence.parse()?,
    )))
}

/// A refusal, with the live holder's expiry that the acquire function read under its row lock
/// (the `expires_at_ms` column of a refusing row): a waiter tries again when that lease ends.
pub(super) fn refusal(refusal: &PgRow) -> Result<AcquireOutcome, LockError> {
    let expires_at_ms: Option<i64> = read(refusal, EXPIRES_AT_MS)?;
    // Never negative in a live lock; a row damaged by hand is just not reported.
    let expires_at_ms = expires_at_ms.and_then(|ms| u64::try_from(ms).ok());
    Ok(AcquireOutcome::contended(expires_at_ms))
}

/// The lock a lookup row describes.
pub(super) fn lock_info(row: &PgRow) -> Result<LockInfo, LockError> {
    let stored_id: String = read(row, LOCK_ID)?;
    let fence: String = read(row, FENCE)?;
    Ok(LockInfo::new(
        read(row, USER_KEY)?,
        parse_lock_id(&stored_id)?,
        millis(row, EXPIRES_AT_MS)?,
        millis(row, ACQUIRED_AT_MS)?,
        fence.parse()?,
    )
    .with_holder(read(row, HOLDER)?))
}

/// A lock id read from the table.
fn parse_lock_id(stored: &str) -> Result<LockId, LockError> {
    LockId::parse(stored).map_err(|_| LockError::internal("stored lock_id is malformed"))
}

#[cfg(test)]
mod tests {
    //! On the test PostgreSQL (`SYNCGUARD_TEST_POSTGRES_URL`, as `bash
    //! scripts/with-services.sh` exports it): the columns each statement answers with, as the
    //! server prepares it, are the ones the readers ask for; and a reader given the columns in
    //! another order reads the same values.

    use sqlx::{Column, Executor, PgPool, SqlStr, Statement};

    use super::*;
    use crate::postgres::statements::Inner;
    use crate::postgres::{PostgresConfig, setup_schema};

    /// The answer of `acquire_free` and `acquire`.
    const ACQUIRE: &[&str] = &[ACQUIRED, EXPIRES_AT_MS, FENCE, LOCK_ID];
    /// The answer of `release` and `release_orphan` with release notifications (without them,
    /// only [`USER_KEY`]).
    const RELEASE: &[&str] = &[USER_KEY, ANNOUNCED];
    /// The answer of `extend`, `extend_by` and `expire_at`.
    const EXTEND: &[&str] = &[EXPIRES_AT_MS, FOUND];
    /// The answer of `lock_id_stored`.
    const LOCK_ID_STORED: &[&str] = &[FOUND];
    const IS_LOCKED: &[&str] = &[LIVE, SWEEPABLE];
    /// The answer of `lookup_by_key` and `lookup_by_id`.
    const LOOKUP: &[&str] = &[
        USER_KEY,
        LOCK_ID,
        EXPIRES_AT_MS,
        ACQUIRED_AT_MS,
        FENCE,
        HOLDER,
    ];

    async fn pool() -> PgPool {
        let url = std::env::var("SYNCGUARD_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!(
                "SYNCGUARD_TEST_POSTGRES_URL is not set: run `bash scripts/test-all.sh`, which \
                 installs PostgreSQL (apt-get install postgresql) and starts it, or \
                 `bash scripts/with-services.sh cargo test ...`"
            )
        });
        PgPool::connect(&url).await.expect("test PostgreSQL")
    }

    async fn columns(pool: &PgPool, sql: &SqlStr) -> Vec<String> {
        let statement = pool.prepare(sql.clone()).await.expect("prepared");
        statement
            .columns()
            .iter()
            .map(|column| column.name().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn every_statement_answers_the_columns_its_reader_reads() {
        let pool = pool().await;
        for notifications in [true, false] {
            let config = PostgresConfig::new()
                .with_lock_table("syncguard_columns_locks")
                .with_fence_table("syncguard_columns_fences")
                .with_release_notifications(notifications);
            setup_schema(&pool, &config).await.expect("schema");
            let inner = Inner::new(config).expect("statements");
            let release: &[&str] = if notifications {
                RELEASE
            } else {
                &RELEASE[..1]
            };
            let expected: [(&str, &SqlStr, &[&str]); 11] = [
                ("acquire_free", &inner.acquire_free, ACQUIRE),
                ("acquire", &inner.acquire, ACQUIRE),
                ("release", &inner.release, release),
                ("release_orphan", &inner.release_orphan, release),
                ("lock_id_stored", &inner.lock_id_stored, LOCK_ID_STORED),
                ("extend", &inner.extend, EXTEND),
                ("extend_by", &inner.extend_by, EXTEND),
                ("expire_at", &inner.expire_at, EXTEND),
                ("is_locked", &inner.is_locked, IS_LOCKED),
                ("lookup_by_key", &inner.lookup_by_key, LOOKUP),
                ("lookup_by_id", &inner.lookup_by_id, LOOKUP),
            ];
            for (name, sql, read) in expected {
                assert_eq!(
                    columns(&pool, sql).await,
                    read,
                    "{name} (notifications: {notifications})"
                );
            }
        }
    }

    /// Expiry and fence, both BIGINT, given in the other order than the statements'.
    #[tokio::test]
    async fn readers_read_reordered_columns_by_name() {
        let pool = pool().await;
        let lock_id = crate::LockId::generate();
        let acquired = sqlx::query(
            "SELECT TRUE AS acquired, 7::BIGINT AS fence, \
             1700000000000::BIGINT AS expires_at_ms, $1::TEXT AS lock_id",
        )
        .bind(lock_id.as_str())
        .fetch_one(&pool)
        .await
        .expect("row");
        let AcquireOutcome::Acquired(lease) = acquire_answer(&acquired).expect("read") else {
            panic!("not acquired");
        };
        assert_eq!(lease.expires_at_ms, 1_700_000_000_000);
        assert_eq!(lease.fence.get(), 7);
        assert_eq!(lease.lock_id, lock_id);

        let found = sqlx::query(
            "SELECT 'h'::TEXT AS holder, '000000000000007'::TEXT AS fence, \
             1700000000000::BIGINT AS acquired_at_ms, 1700000005000::BIGINT AS expires_at_ms, \
             $1::TEXT AS lock_id, 'k'::TEXT AS user_key",
        )
        .bind(lock_id.as_str())
        .fetch_one(&pool)
        .await
        .expect("row");
        let found = lock_info(&found).expect("read").reveal();
        assert_eq!(found.info.expires_at_ms, 1_700_000_005_000);
        assert_eq!(found.info.acquired_at_ms, 1_700_000_000_000);
        assert_eq!(found.info.fence.get(), 7);
        assert_eq!(found.key, "k");
        assert_eq!(found.holder.as_deref(), Some("h"));
    }

    #[tokio::test]
    async fn a_missing_column_fails_the_read() {
        let pool = pool().await;
        let row = sqlx::query("SELECT TRUE AS acquired, 7::BIGINT AS fence")
            .fetch_one(&pool)
            .await
            .expect("row");
        let error = millis(&row, EXPIRES_AT_MS).expect_err("no expiry column");
        assert_eq!(error.code(), crate::ErrorCode::Internal);
    }
}
