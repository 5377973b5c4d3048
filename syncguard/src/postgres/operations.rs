//! The operations other than acquire (`acquire.rs`), one statement each through the session,
//! and the [`LockBackend`] implementation on top.

use std::time::Duration;

use sqlx::SqlStr;

use super::rows::{self, read, to_millis};
use super::session::boxed;
use super::{MAX_STORAGE_KEY_BYTES, PostgresBackend};
use crate::backend::key::{make_storage_key, normalize_key};
use crate::backend::time::CLEANUP_GUARD_MS;
use crate::backend::time::{TIME_TOLERANCE_MS, check_expiry, ttl_millis};
use crate::backend::{
    AcquireOutcome, BoxFuture, Capabilities, ExtendOutcome, LockBackend, LockInfo, Lookup,
    NotHeldReason, ReleaseNotifier, ReleaseOutcome, TimeAuthority,
};
use crate::error::LockError;
use crate::lock_id::LockId;

impl PostgresBackend {
    pub(super) async fn release_impl(&self, lock_id: &LockId) -> Result<ReleaseOutcome, LockError> {
        self.release_with(&self.inner.release, lock_id).await
    }

    /// Runs `release`, the release statement or the orphan one, on the lock of `lock_id`.
    pub(super) async fn release_with(
        &self,
        release: &SqlStr,
        lock_id: &LockId,
    ) -> Result<ReleaseOutcome, LockError> {
        let lock_id_stored = &self.inner.lock_id_stored;
        let released = self
            .session
            .run(|conn, _| {
                let (release, lock_id_stored) = (release.clone(), lock_id_stored.clone());
                let lock_id = lock_id.as_str().to_owned();
                boxed(async move {
                    let row = sqlx::query(release)
                        .bind(lock_id.clone())
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_optional(&mut *conn)
                        .await?;
                    if let Some(row) = row {
                        return Ok(Ok(row));
                    }
                    // Nothing deleted, the rare case: whether the lock is there (expired) or
                    // gone tells the caller why.
                    let found: bool = sqlx::query_scalar(lock_id_stored)
                        .bind(lock_id)
                        .fetch_one(&mut *conn)
                        .await?;
                    Ok(Err(not_held_reason(found)))
                })
            })
            .await?;
        let row = match released {
            Ok(row) => row,
            Err(reason) => return Ok(ReleaseOutcome::NotHeld(Some(reason))),
        };
        // A release the server did not announce (nobody was refused during the hold) may
        // still have waiters in this process: those queued behind one of theirs that took the
        // lock wait for their turn without trying it, so were never refused. They are woken
        // here.
        if let Some(listener) = &self.listener {
            let announced: bool = read(&row, rows::ANNOUNCED)?;
            if !announced {
                let key: String = read(&row, rows::USER_KEY)?;
                listener.released_here(&key);
            }
        }
        Ok(ReleaseOutcome::Released)
    }

    /// Runs `sql`, the extend statement, the extend-by one or the expire-at one, on the live
    /// lock of `lock_id` with `value_ms` (a ttl, the time to add to the expiry, or the expiry).
    ///
    /// Extends set the expiry from the clock, and expire-at to a fixed time, so a retry after
    /// a dead connection is harmless.
    /// An extend by an amount is not idempotent: if the first run was applied and only its
    /// answer lost (the connection died while the answer was on its way), the retry adds the
    /// amount once more. It still never revives a lock nor touches another one, and its answer
    /// is the stored expiry, so the caller learns the lock's true expiry.
    async fn extend_with(
        &self,
        sql: &SqlStr,
        lock_id: &LockId,
        value_ms: Result<u64, LockError>,
    ) -> Result<ExtendOutcome, LockError> {
        let value_ms = value_ms?;
        let row = self
            .session
            .run(|conn, _| {
                boxed(
                    sqlx::query(sql.clone())
                        .bind(lock_id.as_str().to_owned())
                        .bind(as_bigint(value_ms))
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .fetch_one(conn),
                )
            })
            .await?;
        let found: bool = read(&row, rows::FOUND)?;
        Ok(match read::<Option<i64>>(&row, rows::EXPIRES_AT_MS)? {
            Some(ms) => ExtendOutcome::Extended {
                expires_at_ms: to_millis(ms)?,
            },
            None => ExtendOutcome::NotHeld(Some(not_held_reason(found))),
        })
    }

    async fn is_locked_impl(&self, key: &str) -> Result<bool, LockError> {
        let key = normalize_key(key)?;
        let storage_key = make_storage_key("", &key, MAX_STORAGE_KEY_BYTES, 0)?;
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
        let live: bool = read(&row, rows::LIVE)?;
        let sweepable: bool = read(&row, rows::SWEEPABLE)?;
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
                    make_storage_key("", &key, MAX_STORAGE_KEY_BYTES, 0)?,
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
        let info = rows::lock_info(&row)?;
        // Explicit ownership check (ADR-003), even though the query filtered on it.
        if let Lookup::LockId(lock_id) = query
            && info.lock_id() != lock_id
        {
            return Ok(None);
        }
        Ok(Some(info))
    }
}

impl LockBackend for PostgresBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_impl(key, ttl, None))
    }

    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        Box::pin(self.acquire_impl(key, ttl, Some(holder)))
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
        Box::pin(self.extend_with(&self.inner.extend, lock_id, ttl_millis(ttl)))
    }

    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        Box::pin(self.extend_with(&self.inner.extend_by, lock_id, ttl_millis(by)))
    }

    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let sql = &self.inner.expire_at;
        Box::pin(self.extend_with(sql, lock_id, check_expiry(expires_at_ms)))
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
        Capabilities::new("postgres", TimeAuthority::Server).with_holders()
    }

    /// Starts the listening connection the first time something waits (see
    /// [waiting](super#waiting)); `None` when releases are not announced.
    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        self.listener
            .as_ref()?
            .notifier(self.session.pool(), &self.inner.config)
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
pub(super) fn as_bigint(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
