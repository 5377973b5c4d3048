//! Acquires whose outcome is unknown: one that timed out, whose commit failed without a clear
//! refusal, or whose caller dropped it may have written its lock, or may still write it when a
//! commit held up in the network arrives. Nobody would hold that lock until its ttl ran out.
//! Its lock id is unique to the call, so releasing by it is safe whatever happened. An
//! acquire with a holder is never released so: a re-entry hands its lock id to a later caller
//! (see [holders](super#holders)).

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::FirestoreBackend;
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::backend::{LockBackend, NotHeldReason, ReleaseOutcome};
use crate::error::{ErrorCode, LockError};
use crate::lock_id::LockId;

/// How many releases that find nothing are made before the backend gives up: a commit held
/// up in the network can land after a release that found nothing.
const MISSES: u32 = 3;

/// A plain acquire on its way. Unless [`settle`](Self::settle)d with a known outcome, dropping
/// it releases its lock id in the background.
pub(super) struct AcquireInDoubt {
    /// What to release if the outcome stays unknown; `None` once settled.
    pending: Option<(FirestoreBackend, LockId, Duration)>,
}

impl AcquireInDoubt {
    pub(super) fn new(backend: &FirestoreBackend, lock_id: &LockId, ttl: Duration) -> Self {
        Self {
            pending: Some((backend.clone(), lock_id.clone(), ttl)),
        }
    }

    /// The outcome is known: the lock was taken (and handed to the caller) or certainly not.
    pub(super) fn settle(mut self) {
        self.pending = None;
    }

    /// Settles `self` if `error` says no commit of the call can land: bad input, refused
    /// credentials, or a document this library cannot read. Otherwise it stays in doubt.
    pub(super) fn settle_if_certain(self, error: &LockError) {
        if matches!(
            error.code(),
            ErrorCode::InvalidArgument | ErrorCode::AuthFailed | ErrorCode::Internal
        ) {
            self.settle();
        }
    }
}

impl Drop for AcquireInDoubt {
    fn drop(&mut self) {
        let Some((backend, lock_id, ttl)) = self.pending.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(release_in_doubt(backend, lock_id, ttl));
        }
    }
}

async fn release_in_doubt(backend: FirestoreBackend, lock_id: LockId, ttl: Duration) {
    // Past the lock's ttl and tolerance, it is free anyway.
    let gone = Instant::now() + ttl + Duration::from_millis(TIME_TOLERANCE_MS);
    let pause = backend.config().operation_timeout();
    let mut misses = 0;
    loop {
        match backend.release(&lock_id).await {
            Ok(ReleaseOutcome::Released) => {
                tracing::debug!("syncguard: released a Firestore lock whose acquire was in doubt");
                return;
            }
            Ok(ReleaseOutcome::NotHeld(Some(NotHeldReason::Expired))) => return,
            Ok(_) => {
                misses += 1;
                if misses >= MISSES {
                    return;
                }
            }
            // Out of reach: tried again while the lock can still be held.
            Err(_) => {}
        }
        if Instant::now() + pause >= gone {
            return;
        }
        sleep(pause).await;
    }
}
