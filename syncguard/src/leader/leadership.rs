//! Leading: the leadership a campaign won, its term, its loss and its resignation.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crate::error::LockError;
use crate::fence::Fence;
use crate::guard::{LockGuard, LockHandle};

/// The leadership of an election, won by [`Election::campaign`](super::Election::campaign):
/// the leader's lock, kept by the heartbeat.
///
/// - **Term.** [`term`](Self::term) is the lock's fence: it strictly increases from one leader
///   to the next, across resignations, crashes and restarts of the store. Pass it to what the
///   leader writes to, so that a deposed leader that has not noticed yet (its thread blocked,
///   its lock deleted behind its back) is refused.
/// - **Loss** is that of a [`LockGuard`]: signalled when an extend answers that the lock is
///   no longer held, or when the lease runs out without a successful extend (so before the
///   store lets another candidate in). A leadership derefs to the lock's [`LockHandle`], whose
///   [`lost`](LockHandle::lost) (await), [`is_lost`](LockHandle::is_lost),
///   [`lost_reason`](LockHandle::lost_reason) and [`lost_token`](LockHandle::lost_token) tell
///   it (as do its key, expiry and span); [`handle`](LockHandle::handle) gives one to the
///   leader's own tasks. [`run`](Self::run) cancels the work with the election's default
///   [`OnLost::Cancel`](crate::OnLost::Cancel). A loss is final: campaign again.
/// - **Resigning.** [`resign`](Self::resign) releases the lock, and the next candidate, woken
///   by the release, leads at once. Dropping the leadership resigns too, **in the
///   background** (see [`LockGuard`]'s release on drop).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::MemoryBackend;
/// use syncguard::leader::Election;
///
/// let backend = MemoryBackend::new();
/// let election = Election::builder(&backend, "compactor").identity("node-a").build()?;
/// let leadership = election.campaign().await?;
/// let term = leadership.term(); // hand it to what the leader writes to
/// let compacted = leadership.run(async { 3 }).await?; // cancelled if leadership is lost
/// assert_eq!(compacted, 3);
///
/// // The lock's handle, for the leader's own tasks: check it before each side effect.
/// let handle = leadership.handle();
/// let task = tokio::spawn(async move { handle.is_held().then(|| handle.fence()) });
/// assert_eq!(task.await.unwrap(), Some(term));
/// let deposed = leadership.lost_token(); // cancelled if leadership is lost, not on resign
/// assert!(!deposed.is_cancelled());
/// assert!(leadership.resign().await?);
/// # Ok(()) }
/// ```
#[must_use = "dropping a Leadership resigns (in the background) at once"]
pub struct Leadership {
    pub(super) guard: LockGuard,
    identity: Arc<str>,
}

/// A leadership has the accessors of its lock's [`LockHandle`] (term as its fence, the loss).
impl std::ops::Deref for Leadership {
    type Target = LockHandle;

    fn deref(&self) -> &LockHandle {
        &self.guard
    }
}

impl Leadership {
    pub(super) fn new(guard: LockGuard, identity: Arc<str>) -> Self {
        Self { guard, identity }
    }

    /// This leader's term: the fence of its lock, greater than every earlier leader's.
    pub fn term(&self) -> Fence {
        self.guard.fence()
    }

    /// The identity observers see for this leader.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Runs `work` while leading: as [`LockGuard::run`], with the election's
    /// [`on_lost`](super::ElectionBuilder::on_lost). By default a loss drops `work` at once
    /// and returns [`ErrorCode::LockLost`](crate::ErrorCode::LockLost); work that finishes after
    /// leadership was lost gets `LockLost` too, not its output.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let leadership = Election::new(&backend, "consumer")?.campaign().await?;
    /// let term = leadership.term();
    /// let handled = leadership
    ///     .run(async {
    ///         // ... consume, writing with `term` as the fence ...
    ///         term.get()
    ///     })
    ///     .await?;
    /// assert_eq!(handled, term.get());
    /// # leadership.resign().await?; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ErrorCode::LockLost`](crate::ErrorCode::LockLost) when leadership was lost before `work`
    /// finished.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        self.guard.run(work).await
    }

    /// Resigns: stops the heartbeat and releases the lock, so that the next candidate leads
    /// at once. Returns `true` if this call released it, `false` if leadership was already
    /// lost (expired or taken over).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use syncguard::MemoryBackend;
    /// use syncguard::leader::Election;
    ///
    /// let backend = MemoryBackend::new();
    /// let election = Election::new(&backend, "cron")?;
    /// let leadership = election.campaign().await?;
    /// assert!(leadership.resign().await?);
    /// assert_eq!(election.leader().await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Backend errors as they come; the lock then expires at the end of its ttl, and the next
    /// candidate leads then.
    pub async fn resign(self) -> Result<bool, LockError> {
        self.guard.release().await
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("term", &self.term())
            .field("identity", &self.identity)
            .field("lost", &self.lost_reason())
            .finish_non_exhaustive()
    }
}
