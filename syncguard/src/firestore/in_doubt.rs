//! Acquires whose outcome is unknown: one that timed out, whose commit failed after it was
//! sent, or whose caller dropped it may have written its lock, or may still write it when a
//! commit held up in the network arrives. Nobody would hold that lock until its ttl ran out.
//! Its lock id is unique to the call, so releasing by it is safe whatever happened. An
//! acquire with a holder is never released so: a re-entry hands its lock id to a later caller
//! (see [holders](super#holders)).

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::FirestoreBackend;
use super::transaction::TxFailure;
use crate::backend::time::TIME_TOLERANCE_MS;
use crate::backend::{LockBackend, NotHeldReason, ReleaseOutcome};
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

    /// Settles `self` if the acquire failed before it sent a commit: only then is it certain
    /// that nothing was written. After a commit request was sent no error is proof: a
    /// connection lost while the answer was on its way leaves a written lock behind, whatever
    /// the transport reports (an HTTP/2 error code gRPC does not name becomes an unknown gRPC
    /// code, an internal error). Releasing a lock id never written costs only a query.
    pub(super) fn settle_unless_sent(self, failure: &TxFailure) {
        if !failure.commit_sent {
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
