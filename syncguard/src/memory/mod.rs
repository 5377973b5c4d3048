//! The in-process backend.
//!
//! - `store.rs`: the tables (fence counters and stored locks by key hash, the reverse index
//!   by lock id) and the atomic steps on them: acquire, release, extend.
//! - `entries.rs`: what a table slot holds (a key's fence counter and its stored locks).
//! - `sweep.rs`: keeping memory bounded: dropping expired locks, forgetting fence counters.
//! - `operations.rs`: the [`LockBackend`](crate::LockBackend) implementation on top.

mod entries;
mod operations;
mod store;
mod sweep;

use std::sync::{Arc, Mutex, MutexGuard};

use store::State;

use crate::backend::ReleaseNotifier;

/// Locks within one process: the embedded default backend.
///
/// It implements the whole contract, fences included: each key's fences only grow, across
/// release and expiry, for the life of the backend. Memory stays bounded however many
/// distinct keys are locked (a fresh idempotency key per request, say):
///
/// - The fence counters of held keys, and of up to 32 other recently locked keys, are kept,
///   so their fences go 1, 2, 3, ...
/// - Beyond that, the counters of released keys are forgotten, and a forgotten (or new) key
///   goes on from above every fence a forgotten key ever had: still strictly increasing for
///   that key, with a gap.
///
/// Counters are kept under a 64-bit keyed hash of the key, not the key itself (two keys whose
/// hashes collide, which clients cannot aim for, would share a counter: their fences still
/// only grow, with gaps). A key costs about 150 bytes while its counter is kept (its lock
/// shares the slot, keys up to 62 bytes inline), and a held lock about 40 bytes more.
/// Time authority is the local clock.
///
/// Waiters wake on release: every release wakes the key's first waiter in this process (see
/// [`ReleaseNotifier`]); a lock that expires instead is retried when its lease ends.
///
/// Clones share the same locks, so clone it freely into tasks. Locks are not shared between
/// processes: use PostgreSQL, Redis or Firestore for that. So there is nothing to set up, no
/// storage layout to share with other services, and no I/O to fail: keys are checked and
/// normalized as by every backend ([`normalize_key`](crate::backend::key::normalize_key)), and bad
/// input (a key, a ttl) is [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let guard = syncguard::acquire(&backend, "report:daily", &LockOptions::default()).await?;
/// println!("holding with fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
    /// Wakes this process's waiters on every release (see [`LockBackend::release_notifier`]).
    notifier: ReleaseNotifier,
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the maps half-updated (every mutation completes
        // before any call that could panic), so a poisoned lock is safe to keep using.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryBackend")
            .field("held", &state.ids.len())
            .field("fence_counters", &state.keys.len())
            .finish()
    }
}
