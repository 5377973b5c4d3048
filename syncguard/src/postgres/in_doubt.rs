//! Acquires whose outcome is unknown: one that timed out, whose connection failed, or whose
//! caller dropped it mid-statement may have taken the lock, or may still take it when a
//! statement held up in the network arrives. Nobody would hold that lock until its ttl ran
//! out. Its lock id is unique to that attempt, so releasing it is safe whatever happened. An
//! acquire with a holder is released only while its lock is unclaimed: a re-entry hands the
//! lock id to another caller, and an extend uses it, after which the lock is theirs (see
//! `acquire.rs`).

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::PostgresBackend;
use crate::backend::ReleaseOutcome;
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::error::{ErrorCode, LockError};
use crate::lock_id::LockId;

/// How many times a lock in doubt is released before the backend gives up on it: a statement
/// held up in the network can land after a release that found nothing.
const RELEASES: u32 = 3;

/// An acquire on its way. Unless [`settle`](Self::settle)d with a known outcome, dropping it
/// releases its lock id in the background.
pub(super) struct AcquireInDoubt {
    /// What to release if the outcome stays unknown; `None` once settled.
    pending: Option<Pending>,
}

struct Pending {
    backend: PostgresBackend,
    lock_id: LockId,
    ttl: Duration,
    /// An acquire with a holder: its lock is released only while nobody claimed it.
    holder: bool,
}

impl AcquireInDoubt {
    /// `holder`: an acquire with a holder, whose lock a re-entry may have handed to another
    /// caller since (see `acquire.rs`).
    pub(super) fn new(
        backend: &PostgresBackend,
        lock_id: &LockId,
        ttl: Duration,
        holder: bool,
    ) -> Self {
        Self {
            pending: Some(Pending {
                backend: backend.clone(),
                lock_id: lock_id.clone(),
                ttl,
                holder,
            }),
        }
    }

    /// The outcome is known: the lock was taken (and handed to the caller) or certainly not.
    pub(super) fn settle(mut self) {
        self.pending = None;
    }

    /// Settles `self` if `error` says the statement cannot have taken the lock: it was never
    /// sent (every pooled connection busy, a refused connection, bad input) or the server
    /// refused it whole (a raised exception undoes the statement). Otherwise it stays in
    /// doubt.
    pub(super) fn settle_if_certain(self, error: &LockError) {
        let certain = matches!(
            error.code(),
            ErrorCode::RateLimited
                | ErrorCode::InvalidArgument
                | ErrorCode::AuthFailed
                | ErrorCode::Internal
        );
        if certain {
            self.settle();
        }
    }
}

impl Drop for AcquireInDoubt {
    fn drop(&mut self) {
        let Some(Pending {
            backend,
            lock_id,
            ttl,
            holder,
        }) = self.pending.take()
        else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(release_in_doubt(backend, lock_id, ttl, holder));
    }
}

async fn release_in_doubt(backend: PostgresBackend, lock_id: LockId, ttl: Duration, holder: bool) {
    let statements = backend.inner.clone();
    let release = if holder {
        &statements.release_orphan
    } else {
        &statements.release
    };
    // Past the lock's ttl and tolerance, it is gone anyway.
    let gone = Instant::now() + ttl + Duration::from_millis(TIME_TOLERANCE_MS);
    // Long enough for a statement still in flight to have landed.
    let pause = backend.config().operation_timeout() * 2;
    for _ in 0..RELEASES {
        match backend.release_with(release, &lock_id).await {
            Ok(ReleaseOutcome::Released) => {
                tracing::debug!("syncguard: released a PostgreSQL lock whose acquire was in doubt");
                return;
            }
            // Tables set up by an older version (no `unclaimed` column): nothing to retry.
            Err(error) if error.code() == ErrorCode::Internal => {
                tracing::warn!(%error, "syncguard: could not release a PostgreSQL lock whose acquire was in doubt; it stays until its ttl");
                return;
            }
            _ => {}
        }
        if Instant::now() + pause >= gone {
            return;
        }
        sleep(pause).await;
    }
}
