//! The operations, one statement each through the session, and the [`LockBackend`]
//! implementation on top.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::in_doubt::AcquireInDoubt;
use super::session::{Attempt, boxed};
use super::{CLEANUP_GUARD_MS, PostgresBackend, STORAGE_KEY_LIMIT_BYTES};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, Lease, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseOutcome, TimeAuthority,
};
use crate::key::{make_fence_key, make_storage_key, normalize_key};
use crate::time::{TIME_TOLERANCE_MS, ttl_millis};
use crate::{FENCE_MAX, Fence, LockError, LockId};

impl PostgresBackend {
    async fn acquire_impl(&self, key: &str, ttl: Duration) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?;
        let ttl_ms = ttl_millis(ttl)?;
        let storage_key = make_storage_key("", &key, STORAGE_KEY_LIMIT_BYTES, 0)?;
        let fence_key = make_fence_key("", &storage_key, STORAGE_KEY_LIMIT_BYTES, 0)?;
        let lock_id = LockId::generate();
        let (acquire, lookup_by_id) = (&self.inner.acquire, &self.inner.lookup_by_id);
        let in_doubt = AcquireInDoubt::new(self, &lock_id, ttl);
        let outcome = self
            .session
            .run(|conn, attempt| {
                let (key, storage_key, fence_key) =
                    (key.to_string(), storage_key.clone(), fence_key.clone());
                let lock_id = lock_id.as_str().to_owned();
                let (acquire, lookup_by_id) = (acquire.clone(), lookup_by_id.clone());
                boxed(async move {
                    let row = sqlx::query(acquire)
                        .bind(&storage_key)
                        .bind(&key)
                        .bind(&fence_key)
                        .bind(&lock_id)
                        .bind(as_bigint(ttl_ms))
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .bind(as_bigint(FENCE_MAX))
                        .fetch_one(&mut *conn)
                        .await?;
                    if attempt == Attempt::Retry && !row.try_get::<bool, _>(0)? {
                        // The first run may have taken the lock before its connection died:
                        // then the lock it finds is its own.
                        let own = sqlx::query(lookup_by_id)
                            .bind(&lock_id)
                            .bind(as_bigint(TIME_TOLERANCE_MS))
                            .fetch_optional(&mut *conn)
                            .await?;
                        return Ok(Acquired::from_lookup(own));
                    }
                    Ok(Acquired::Row(row))
                })
            })
            .await;
        match outcome {
            // A retry found another holder: the first run may still land, so the acquire stays
            // in doubt (released in the background when `in_doubt` drops).
            Ok(Acquired::HeldByAnother) => Ok(AcquireOutcome::Contended),
            Ok(Acquired::Row(row)) => {
                in_doubt.settle();
                if !row.try_get::<bool, _>(0).map_err(decode_error)? {
                    return Ok(AcquireOutcome::Contended);
                }
                let expires_at_ms = millis(&row, 1)?;
                let fence = Fence::new(millis(&row, 2)?)?;
                Ok(AcquireOutcome::Acquired(Lease::new(
                    lock_id,
                    expires_at_ms,
                    fence,
                )))
            }
            Ok(Acquired::OwnLock(row)) => {
                in_doubt.settle();
                let fence: String = row.try_get(4).map_err(decode_error)?;
                Ok(AcquireOutcome::Acquired(Lease::new(
                    lock_id,
                    millis(&row, 2)?,
                    fence.parse()?,
                )))
            }
            Err(error) => {
                in_doubt.settle_if_certain(&error);
                Err(error)
            }
        }
    }

    pub(super) async fn release_impl(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        let sql = &self.inner.release;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(lock_id.as_str().to_owned())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_one(conn),
                )
            })
            .await?;
        let released: bool = row.try_get(0).map_err(decode_error)?;
        let found: bool = row.try_get(1).map_err(decode_error)?;
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld(Some(not_held_reason(found)))
        })
    }

    async fn extend_impl(
        &self,
        lock_id: &LockId,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let sql = &self.inner.extend;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(lock_id.as_str().to_owned())
                        .bind(as_bigint(ttl_ms))
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_one(conn),
                )
            })
            .await?;
        let expires_at_ms: Option<i64> = row.try_get(0).map_err(decode_error)?;
        let found: bool = row.try_get(1).map_err(decode_error)?;
        Ok(match expires_at_ms {
            Some(ms) => ExtendOutcome::Extended {
                expires_at_ms: to_millis(ms)?,
            },
            None => ExtendOutcome::NotHeld(Some(not_held_reason(found))),
        })
    }

    async fn is_locked_impl(&self, key: &str) -> Result<bool, LockError> {
        let key = normalize_key(key)?;
        let storage_key = make_storage_key("", &key, STORAGE_KEY_LIMIT_BYTES, 0)?;
        let sql = &self.inner.is_locked;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(storage_key.clone())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .bind(guarded_tolerance_ms())
                        .fetch_optional(conn),
                )
            })
            .await?;
        let Some(row) = row else { return Ok(false) };
        let live: bool = row.try_get(0).map_err(decode_error)?;
        let sweepable: bool = row.try_get(1).map_err(decode_error)?;
        if sweepable && self.inner.config.cleanup_in_is_locked() {
            self.spawn_cleanup(storage_key);
        }
        Ok(live)
    }

    /// Fire-and-forget deletion of one expired row; failures only cost a later retry.
    fn spawn_cleanup(&self, storage_key: String) {
        let backend = self.clone();
        tokio::spawn(async move {
            let sql = &backend.inner.cleanup_key;
            let deleted = backend
                .session
                .run(|conn, _| {
                    boxed(
                        sqlx::query(sql.clone())
                            .bind(storage_key.clone())
                            .bind(guarded_tolerance_ms())
                            .execute(conn),
                    )
                })
                .await;
            if let Err(error) = deleted {
                tracing::debug!(%error, "syncguard is_locked cleanup failed");
            }
        });
    }

    async fn lookup_impl(&self, query: Lookup<'_>) -> Result<Option<LockInfo>, LockError> {
        let (sql, value) = match query {
            Lookup::Key(key) => {
                let key = normalize_key(key)?;
                (
                    &self.inner.lookup_by_key,
                    make_storage_key("", &key, STORAGE_KEY_LIMIT_BYTES, 0)?,
                )
            }
            Lookup::LockId(lock_id) => (&self.inner.lookup_by_id, lock_id.as_str().to_owned()),
        };
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(value.clone())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_optional(conn),
                )
            })
            .await?;
        let Some(row) = row else { return Ok(None) };
        let stored_id: String = row.try_get(1).map_err(decode_error)?;
        let stored_id = LockId::parse(&stored_id)
            .map_err(|_| LockError::internal("stored lock_id is malformed"))?;
        // Explicit ownership check (ADR-003), even though the query filtered on it.
        if let Lookup::LockId(lock_id) = query
            && stored_id != *lock_id
        {
            return Ok(None);
        }
        let fence: String = row.try_get(4).map_err(decode_error)?;
        Ok(Some(LockInfo::new(
            row.try_get(0).map_err(decode_error)?,
            stored_id,
            millis(&row, 2)?,
            millis(&row, 3)?,
            fence.parse()?,
        )))
    }
}

impl LockBackend for PostgresBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_impl(key, ttl))
    }

    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
        Box::pin(self.release_impl(lock_id))
    }

    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_impl(lock_id, ttl))
    }

    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
        Box::pin(self.is_locked_impl(key))
    }

    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
        Box::pin(self.lookup_impl(query))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("postgres", TimeAuthority::Server)
    }
}

/// What an acquire statement found.
enum Acquired {
    /// The acquire function's row: taken, or contended.
    Row(PgRow),
    /// A retried acquire found the lock its first run took (a lookup row).
    OwnLock(PgRow),
    /// A retried acquire found another holder.
    HeldByAnother,
}

impl Acquired {
    fn from_lookup(row: Option<PgRow>) -> Self {
        row.map_or(Self::HeldByAnother, Self::OwnLock)
    }
}

fn not_held_reason(found: bool) -> NotHeldReason {
    if found {
        NotHeldReason::Expired
    } else {
        NotHeldReason::NotFound
    }
}

pub(super) fn guarded_tolerance_ms() -> i64 {
    as_bigint(TIME_TOLERANCE_MS + CLEANUP_GUARD_MS)
}

/// Our millisecond values (validated ttls, constants) always fit a BIGINT.
fn as_bigint(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn millis(row: &PgRow, index: usize) -> Result<u64, LockError> {
    to_millis(row.try_get::<i64, _>(index).map_err(decode_error)?)
}

fn to_millis(value: i64) -> Result<u64, LockError> {
    u64::try_from(value)
        .map_err(|_| LockError::internal(format!("stored timestamp {value} is negative")))
}

fn decode_error(error: sqlx::Error) -> LockError {
    LockError::internal("unexpected column in a syncguard PostgreSQL result").with_source(error)
}
