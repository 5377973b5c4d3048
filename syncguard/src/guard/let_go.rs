//! Letting a lock go at the end of a hold, as `min_hold` allows.

use tokio::time::Instant;

use super::state::Shared;
use crate::backend::{ExtendOutcome, LockBackend, ReleaseOutcome};
use crate::error::LockError;

/// Lets the lock go: released, or, before its `min_hold` is over, left to expire then: its
/// expiry set to the end of the minimum hold on the backend's clock (which the caller counts
/// as a release). A fixed time, not a ttl: a request that lands late (held up in a partition)
/// can never keep the lock past it.
pub(super) async fn let_go(
    backend: &dyn LockBackend,
    shared: &Shared,
) -> Result<ReleaseOutcome, LockError> {
    let keeps = shared
        .keep_until
        .is_some_and(|until| until.saturating_duration_since(Instant::now()).as_millis() >= 1);
    let (true, Some(until_ms)) = (keeps, shared.keep_until_ms) else {
        return backend.release(&shared.lock_id).await;
    };
    Ok(match backend.expire_at(&shared.lock_id, until_ms).await? {
        ExtendOutcome::Extended { .. } => ReleaseOutcome::Released,
        ExtendOutcome::NotHeld(reason) => ReleaseOutcome::NotHeld(reason),
    })
}
