//! What a held lock shows: the read-only handle on a guard, whose accessors the guard has too.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::state::Shared;
use crate::error::LostReason;
use crate::fence::Fence;
use crate::lock_id::LockId;
use crate::lock_name::LockName;

/// What a held lock shows (key, lock id, fence, expiry) and its loss: the accessors of a
/// [`LockGuard`](crate::LockGuard), which derefs to its handle, and a cheap read-only view for
/// code that must not own the guard: the work's own tasks, a request's extensions (the Tower
/// layer's `HeldLock` derefs to one too), an integration's context. Get one from
/// [`handle`](Self::handle). Cloning it copies no string.
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
    pub(super) shared: Arc<Shared>,
}

impl LockHandle {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// A handle of its own on this lock (a clone of this one: a pointer and a count), for code
    /// that must not own the guard: the work's tasks, a request's extensions. A
    /// [`LockGuard`](crate::LockGuard), the Tower layer's `HeldLock` and a
    /// [`Leadership`](crate::leader::Leadership) all give one, through their deref to this
    /// handle.
    pub fn handle(&self) -> LockHandle {
        self.clone()
    }

    /// The (NFC-normalized) key of the lock.
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// How errors and logs name this lock: its key hash, and its key with
    /// [`show_key`](crate::LockOptionsBuilder::show_key).
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// The lock id of this acquisition.
    pub fn lock_id(&self) -> &LockId {
        &self.shared.lock_id
    }

    /// The fencing token of this acquisition: pass it to the resource the lock protects. It
    /// only grows from one holder to the next, so a resource can refuse a stale holder.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The ttl each extend asks for.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The latest authoritative expiry (Unix ms of the backend's time authority).
    pub fn expires_at_ms(&self) -> u64 {
        self.shared.belief().expires_at_ms
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.shared.acquired_at.elapsed()
    }

    /// Whether the lock can still be relied on, as of now: its guard neither released it (or
    /// was dropped) nor lost it. Check this, not [`is_lost`](Self::is_lost), before a side
    /// effect made from a task that may outlive the guard.
    pub fn is_held(&self) -> bool {
        self.shared.is_held()
    }

    /// Whether the lock is lost, as of now: also when the lease ran out while nobody (not even
    /// the heartbeat) looked. After the guard released the lock this stays `false` (a release
    /// is no loss): see [`is_held`](Self::is_held).
    pub fn is_lost(&self) -> bool {
        self.shared.loss().is_some()
    }

    /// Why the lock is lost, as of now; `None` while it is held, and after a release.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.loss()
    }

    /// Completes when the lock is lost, with the reason (at once if it already is, or if the
    /// lease has run out); never completes while it is held, nor after a release.
    pub async fn lost(&self) -> LostReason {
        self.shared.lost().await
    }

    /// A token that is cancelled when the lock is lost, for work that already listens to a
    /// [`CancellationToken`]. It is not cancelled by a release. A token asked for after the
    /// lease ran out is already cancelled; one asked for earlier is cancelled by the
    /// heartbeat at the deadline (late if the heartbeat's thread is blocked: check
    /// [`is_lost`](Self::is_lost) after a blocking section).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost_token().clone()
    }

    /// The hold's `syncguard.hold` span, to run code of the hold in it (for example tasks the
    /// work spawns: `task.instrument(lock.span().clone())`).
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
