//! The keeper: extends the lock on schedule (when the heartbeat is on) and records its loss
//! when an extend says it is gone or its lease runs out.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use super::lease::later;
use super::state::{Extension, Shared};
use crate::backend::LockBackend;

/// Extends shorter than this are not worth a round trip: the hold cap is as good as reached.
const SHORTEST_EXTEND: Duration = Duration::from_millis(1);

/// What the keeper does next.
enum Step {
    /// Sleep until then (or until the deadline moves, or the lock is lost).
    WaitUntil(Instant),
    /// Extend for this ttl; `true` if it is the last extend the hold cap allows.
    Extend(Duration, bool),
}

/// The keeper of `shared`, boxed, running in the hold's span.
pub(super) fn keeping(
    shared: &Arc<Shared>,
    backend: &Arc<dyn LockBackend>,
    heartbeat: bool,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let span = shared.span.clone();
    Box::pin(keep(Arc::clone(shared), Arc::clone(backend), heartbeat).instrument(span))
}

/// Runs until the lock is lost (then it has recorded why). Dropping it stops the heartbeat.
async fn keep(shared: Arc<Shared>, backend: Arc<dyn LockBackend>, heartbeat: bool) {
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
        match next_step(&shared, heartbeat, not_before) {
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

fn next_step(shared: &Shared, heartbeat: bool, not_before: Option<Instant>) -> Step {
    let belief = shared.belief();
    if !heartbeat || belief.reaches_cap {
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
