//! Letting a lock go at the end of a hold, as `min_hold` allows.

use super::state::Shared;
use crate::LockError;
use crate::backend::{ExtendOutcome, LockBackend, ReleaseOutcome};

/// Lets the lock go: released, or, before its `min_hold` is over, left to expire then (an
/// extend to the end of the minimum hold, which the caller counts as a release).
pub(super) async fn let_go(
    backend: &dyn LockBackend,
    shared: &Shared,
) -> Result<ReleaseOutcome, LockError> {
    let left = shared
        .keep_until
        .map(|until| until.saturating_duration_since(tokio::time::Instant::now()))
        .filter(|left| left.as_millis() >= 1);
    let Some(left) = left else {
        return backend.release(&shared.lock_id).await;
    };
    Ok(match backend.extend(&shared.lock_id, left).await? {
        ExtendOutcome::Extended { .. } => ReleaseOutcome::Released,
        ExtendOutcome::NotHeld(reason) => ReleaseOutcome::NotHeld(reason),
    })
}
