//! The heartbeat: extends the lock on schedule (unless the options turn extends off) and
//! records its loss when an extend says it is gone or its lease runs out.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use super::state::{Extension, Shared};
use crate::backend::LockBackend;
use crate::far_future::later;

/// Extends shorter than this are not worth a round trip: the hold cap is as good as reached.
const SHORTEST_EXTEND: Duration = Duration::from_millis(1);

/// What the heartbeat does next.
enum Step {
    /// Sleep until then (or until the deadline moves, or the lock is lost).
    WaitUntil(Instant),
    /// Extend for this ttl; `true` if it is the last extend the hold cap allows.
    Extend(Duration, bool),
}

/// The heartbeat of a guard, run by a task or by the guard's owner.
pub(super) type Beating = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The heartbeat of `shared`, boxed, running in the hold's span. Without `extends` it only
/// records the loss when the lease runs out.
pub(super) fn beating(
    shared: &Arc<Shared>,
    backend: &Arc<dyn LockBackend>,
    extends: bool,
) -> Beating {
    let span = shared.span.clone();
    Box::pin(beat(Arc::clone(shared), Arc::clone(backend), extends).instrument(span))
}

/// Runs until the lock is lost (then it has recorded why). Dropping it stops the heartbeat.
async fn beat(shared: Arc<Shared>, backend: Arc<dyn LockBackend>, extends: bool) {
    // After a failed extend, try again this often while the lease lasts.
    let retry_every = (shared.ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut not_before: Option<Instant> = None;
    loop {
        // Listening before the state is read: a change made in between is not missed.
        let changed = shared.changed().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if shared.loss().is_some() {
            return;
        }
        match next_step(&shared, extends, not_before) {
            Step::WaitUntil(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = changed => {}
                }
            }
            Step::Extend(ttl, reaches_cap) => {
                match shared.extend(backend.as_ref(), ttl, reaches_cap).await {
                    Extension::Extended => {
                        shared.report_heartbeat(true);
                        tracing::debug!(lock = %shared.name, ttl_ms = ttl.as_millis(), "syncguard heartbeat extended the lock");
                        // However short the lease the answer leaves (a reported expiry earlier
                        // than the ttl, a slow answer), the next extend waits a third of it:
                        // extends never go back to back.
                        let pause = shared.belief().surely(ttl) / 3;
                        not_before = Some(later(Instant::now(), pause));
                    }
                    Extension::Lost => {
                        shared.report_heartbeat(false);
                        return;
                    }
                    Extension::Failed(error) => {
                        shared.report_heartbeat(false);
                        tracing::warn!(%error, lock = %shared.name, fence = %shared.fence, "syncguard heartbeat extend failed; retrying while the lease lasts");
                        not_before = Some(later(Instant::now(), retry_every));
                    }
                }
            }
        }
    }
}

fn next_step(shared: &Shared, extends: bool, not_before: Option<Instant>) -> Step {
    let belief = shared.belief();
    if !extends || belief.reaches_cap {
        return Step::WaitUntil(belief.deadline);
    }
    let ttl = shared.ttl;
    let now = Instant::now();
    // Extend once a third of the lease has passed since it was granted, but not sooner than a
    // failed extend allows. (After an unsettled extend for less than the ttl, the lease is
    // only as long as that extend's ttl: see `Belief`.)
    let lease = belief.surely(ttl);
    let mut due = belief
        .deadline
        .checked_sub(lease - lease / 3)
        .unwrap_or(now);
    if let Some(retry_at) = not_before {
        due = due.max(retry_at);
    }
    if due > now {
        return Step::WaitUntil(due.min(belief.deadline));
    }
    let cap_left = shared
        .hold_until
        .map(|cap| cap.saturating_duration_since(now));
    match cap_left {
        Some(left) if left < SHORTEST_EXTEND => {
            shared.lease_reaches_cap();
            Step::WaitUntil(belief.deadline)
        }
        Some(left) if left <= ttl => Step::Extend(left, true),
        _ => Step::Extend(ttl, false),
    }
}
