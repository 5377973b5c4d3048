//! Acquiring, with or without a holder: a plain statement when the key has no row, else one
//! call of the acquire function; what a retry finds of its first run, and who releases a lock
//! whose acquire has an unknown outcome.
//!
//! # A retried, or lost, acquire with a holder
//!
//! A plain acquire's lock id is unique to the attempt: a retry recognizes its own lock by it,
//! and a lock taken by an acquire in doubt is released by it (`in_doubt.rs`), since nobody
//! else can know that id. An acquire with a holder (`acquire_as`) re-enters its holder's live
//! lock and answers with that lock's id, so the id of a lock it took can be handed out again.
//! Hence:
//!
//! - **Retried** after a dead connection: the first run may have taken the lock (a fresh one
//!   under this attempt's id, or a re-entry that restarted the holder's lease). The retry runs
//!   the same call, which re-enters whatever the first run left (it is stored with the same
//!   holder) and answers with that lock's id and fence: the caller gets the lock its holder
//!   holds, whichever run took it, and no lookup by lock id is needed. The retry is contended
//!   only when another holder's lock is live now, and then no lock of this holder is.
//! - **In doubt** (timed out, connection failed mid-statement, caller gone): the lock id the
//!   call generated is stored only if the call took a fresh lock. Released in the background
//!   (`in_doubt.rs`) by that id, but only while the lock is `unclaimed`: a later `acquire_as`
//!   of the same holder, in this process or in another one sharing the tables, re-enters such
//!   a lock and is told it holds it, under that lock id, and an extend by that id means
//!   someone holds it; both claim the lock, and releasing it then would take it from under
//!   that caller. A lost re-entry leaves no
//!   lock of that id (the lock re-entered keeps its own), so nothing is released: that lock is
//!   one its holder held before the call.

use std::time::Duration;

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::in_doubt::AcquireInDoubt;
use super::operations::as_bigint;
use super::rows;
use super::session::{Attempt, boxed};
use super::{MAX_STORAGE_KEY_BYTES, PostgresBackend};
use crate::backend::key::{make_fence_key, make_storage_key, normalize_key};
use crate::backend::time::{TIME_TOLERANCE_MS, ttl_millis};
use crate::backend::{AcquireOutcome, check_holder};
use crate::error::LockError;
use crate::fence::Fence;
use crate::lock_id::LockId;

impl PostgresBackend {
    /// Takes the lock on `key` for `ttl`; with a `holder`, stores it with the lock and
    /// re-enters that holder's live lock.
    pub(super) async fn acquire_impl(
        &self,
        key: &str,
        ttl: Duration,
        holder: Option<&str>,
    ) -> Result<AcquireOutcome, LockError> {
        let key = normalize_key(key)?;
        let ttl_ms = ttl_millis(ttl)?;
        if let Some(holder) = holder {
            check_holder(holder)?;
        }
        let storage_key = make_storage_key("", &key, MAX_STORAGE_KEY_BYTES, 0)?;
        let fence_key = make_fence_key("", &storage_key, MAX_STORAGE_KEY_BYTES, 0)?;
        let lock_id = LockId::generate();
        // A key without a row is taken by a plain statement; a lock there (live or expired),
        // or another acquire of the key under way, leaves it to the acquire function, which
        // then runs after it. Both keep the same guarantees (`statements.rs`). An acquire with
        // a holder, often a re-entry, and one of a key refused lately (`refused.rs`) likely
        // finds a row: they call the function alone.
        let try_free = holder.is_none() && !self.refused.contains(&storage_key);
        let statements = (
            &self.inner.acquire_free,
            &self.inner.acquire,
            &self.inner.lookup_by_id,
        );
        let in_doubt = AcquireInDoubt::new(self, &lock_id, ttl, holder.is_some());
        let outcome = self
            .session
            .run(|conn, attempt| {
                let (key, storage_key, fence_key) =
                    (key.to_string(), storage_key.clone(), fence_key.clone());
                let lock_id = lock_id.as_str().to_owned();
                let holder = holder.map(str::to_owned);
                let (acquire_free, acquire, lookup_by_id) = (
                    statements.0.clone(),
                    statements.1.clone(),
                    statements.2.clone(),
                );
                boxed(async move {
                    if try_free {
                        let free = sqlx::query(acquire_free)
                            .bind(&storage_key)
                            .bind(&key)
                            .bind(&fence_key)
                            .bind(&lock_id)
                            .bind(as_bigint(ttl_ms))
                            .bind(as_bigint(Fence::MAX.get()))
                            .bind(&holder)
                            .fetch_optional(&mut *conn)
                            .await;
                        match free {
                            Ok(Some(row)) => return Ok(Acquired::Row(row)),
                            Ok(None) => {}
                            // An acquire of the key committed after this statement's snapshot
                            // was taken: nothing was stored; the function sees that lock.
                            Err(error) if is_unique_violation(&error) => {}
                            Err(error) => return Err(error),
                        }
                    }
                    let row = sqlx::query(acquire)
                        .bind(&storage_key)
                        .bind(&key)
                        .bind(&fence_key)
                        .bind(&lock_id)
                        .bind(as_bigint(ttl_ms))
                        .bind(as_bigint(TIME_TOLERANCE_MS))
                        .bind(as_bigint(Fence::MAX.get()))
                        .bind(&holder)
                        .fetch_one(&mut *conn)
                        .await?;
                    // With a holder, the call itself re-entered what the first run took, so a
                    // refusal means another holder holds the key now; the first run may still
                    // land once it lets go.
                    if attempt == Attempt::Retry && !row.try_get::<bool, _>(rows::ACQUIRED)? {
                        if holder.is_some() {
                            return Ok(Acquired::HeldByAnother(row));
                        }
                        // The first run may have taken the lock before its connection died:
                        // then the lock it finds is its own.
                        let own = sqlx::query(lookup_by_id)
                            .bind(&lock_id)
                            .bind(as_bigint(TIME_TOLERANCE_MS))
                            .fetch_optional(&mut *conn)
                            .await?;
                        return Ok(Acquired::from_lookup(own, row));
                    }
                    Ok(Acquired::Row(row))
                })
            })
            .await;
        let outcome = match outcome {
            // A retry found another holder: the first run may still land, so the acquire stays
            // in doubt (released in the background when `in_doubt` drops).
            Ok(Acquired::HeldByAnother(refusal)) => rows::refusal(&refusal),
            // Settled only once the row is read: a lock whose row cannot be read is in doubt,
            // and released in the background (the statements cast every column, so that a
            // table altered by hand fails the statement instead).
            Ok(Acquired::Row(row)) => settled(in_doubt, rows::acquire_answer(&row)),
            Ok(Acquired::OwnLock(row)) => settled(in_doubt, rows::own_lock(lock_id, &row)),
            Err(error) => {
                in_doubt.settle_if_certain(&error);
                Err(error)
            }
        };
        match &outcome {
            Ok(AcquireOutcome::Acquired(_)) => self.refused.taken(&storage_key),
            Ok(AcquireOutcome::Contended(_)) => self.refused.refused(&storage_key),
            Err(_) => {}
        }
        outcome
    }
}

/// `outcome`, with the acquire no longer in doubt if it was read.
fn settled(
    in_doubt: AcquireInDoubt,
    outcome: Result<AcquireOutcome, LockError>,
) -> Result<AcquireOutcome, LockError> {
    if outcome.is_ok() {
        in_doubt.settle();
    }
    outcome
}

fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|error| error.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// What an acquire statement found.
enum Acquired {
    /// The row of the plain statement (taken) or of the acquire function (taken, re-entered,
    /// or contended).
    Row(PgRow),
    /// A retried plain acquire found the lock its first run took (a lookup row).
    OwnLock(PgRow),
    /// A retried acquire found another holder (the refusing row of the acquire function).
    HeldByAnother(PgRow),
}

impl Acquired {
    fn from_lookup(own: Option<PgRow>, refusal: PgRow) -> Self {
        match own {
            Some(own) => Self::OwnLock(own),
            None => Self::HeldByAnother(refusal),
        }
    }
}
