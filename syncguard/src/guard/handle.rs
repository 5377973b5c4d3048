//! The cheap read-only handle on a guard.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::state::Shared;
use crate::error::LostReason;
use crate::fence::Fence;
use crate::lock_id::LockId;
use crate::lock_name::LockName;

/// A cheap read-only handle on what a [`LockGuard`](crate::LockGuard) holds (key, lock id,
/// fence, expiry) and on its loss, for code that must not own the guard: the work's own
/// tasks, a request's extensions, an integration's context. Cloning it copies no string.
///
/// It does not keep the lock: that stays the guard's job. Once the guard has released the
/// lock (or was dropped), [`is_held`](Self::is_held) is `false` and no new loss is reported.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let guard = syncguard::acquire(&backend, "cache:warm", &LockOptions::default()).await?;
/// let handle = guard.handle();
/// let task = tokio::spawn(async move {
///     // Check before each side effect made from a task that may outlive the guard.
///     handle.is_held().then(|| handle.fence())
/// });
/// assert_eq!(task.await.unwrap(), Some(guard.fence()));
/// let handle = guard.handle();
/// guard.release().await?;
/// assert!(!handle.is_held() && !handle.is_lost());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockHandle {
    shared: Arc<Shared>,
}

impl LockHandle {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// As [`LockGuard::key`](crate::LockGuard::key).
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// As [`LockGuard::name`](crate::LockGuard::name).
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// As [`LockGuard::lock_id`](crate::LockGuard::lock_id).
    pub fn lock_id(&self) -> &LockId {
        &self.shared.lock_id
    }

    /// As [`LockGuard::fence`](crate::LockGuard::fence).
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// As [`LockGuard::ttl`](crate::LockGuard::ttl).
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// As [`LockGuard::expires_at_ms`](crate::LockGuard::expires_at_ms).
    pub fn expires_at_ms(&self) -> u64 {
        self.shared.belief().expires_at_ms
    }

    /// As [`LockGuard::held_for`](crate::LockGuard::held_for).
    pub fn held_for(&self) -> Duration {
        self.shared.acquired_at.elapsed()
    }

    /// Whether the lock can still be relied on: its guard neither released it (or was
    /// dropped) nor lost it. Check this, not [`is_lost`](Self::is_lost), before a side effect
    /// made from a task that may outlive the guard.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// As [`LockGuard::is_lost`](crate::LockGuard::is_lost). After the guard released the
    /// lock this stays `false` (a release is no loss): see [`is_held`](Self::is_held).
    pub fn is_lost(&self) -> bool {
        self.shared.loss().is_some()
    }

    /// As [`LockGuard::lost_reason`](crate::LockGuard::lost_reason).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.loss()
    }

    /// As [`LockGuard::lost`](crate::LockGuard::lost); never completes after a release.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// As [`LockGuard::lost_token`](crate::LockGuard::lost_token).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost_token().clone()
    }

    /// As [`LockGuard::span`](crate::LockGuard::span).
    pub fn span(&self) -> &tracing::Span {
        &self.shared.span
    }
}

impl fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockHandle")
            .field("lock", &self.shared.name)
            .field("lock_id", &self.shared.lock_id)
            .field("fence", &self.shared.fence)
            .field("lost", &self.lost_reason())
            .finish()
    }
}
