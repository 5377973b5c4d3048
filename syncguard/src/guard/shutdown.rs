//! The locks this process holds, so that [`shutdown`] can release them all.
//!
//! Every guard registers when it is made and leaves when its release has reached the backend
//! (a dropped guard's background release included). A release spawned by a dropped guard
//! dies with its runtime; calling [`shutdown`] before the runtime ends sends those releases,
//! and releases the locks of guards still alive, instead of leaving them held for their ttl.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, timeout_at};

use super::state::Shared;
use crate::backend::{LockBackend, ReleaseOutcome};
use crate::error::LostReason;
use crate::far_future::later;

struct Held {
    backend: Arc<dyn LockBackend>,
    shared: Arc<Shared>,
}

static HELD: LazyLock<Mutex<HashMap<u64, Held>>> = LazyLock::new(Mutex::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn held() -> std::sync::MutexGuard<'static, HashMap<u64, Held>> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lock's entry among the locks this process holds; dropping it removes the entry.
pub(super) struct Registration {
    id: u64,
}

impl Registration {
    pub(super) fn new(backend: &Arc<dyn LockBackend>, shared: &Arc<Shared>) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let entry = Held {
            backend: Arc::clone(backend),
            shared: Arc::clone(shared),
        };
        held().insert(id, entry);
        Self { id }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // The entry may hold the last handles on the backend and its observer: they are
        // dropped after the registry's mutex, never under it.
        let removed = held().remove(&self.id);
        drop(removed);
    }
}

/// What [`shutdown`] did with the locks this process still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Locks released.
    pub released: usize,
    /// Locks no longer held (expired, or taken over): nothing to release.
    pub already_free: usize,
    /// Releases that failed; those locks stay held until their ttl runs out.
    pub failed: usize,
    /// Releases unanswered at the timeout; they go on in the background while the runtime
    /// lives.
    pub unanswered: usize,
}

impl ShutdownReport {
    /// Whether every lock is known to be free now.
    pub fn all_free(&self) -> bool {
        self.failed == 0 && self.unanswered == 0
    }
}

/// Releases every lock this process still holds, and waits for the backends' answers up to
/// `timeout`: the locks of guards still alive (which then report the loss as
/// [`LostReason::Shutdown`], before their lock is released) and the background releases of
/// dropped guards not yet sent or answered.
///
/// Call it when the work has stopped, before the runtime ends (returning from a
/// `#[tokio::main]` function ends it, and with it every release still waiting in a task).
/// Locks acquired after the call are not covered. Each lock that could not be released is
/// logged at warn level with its key hash.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use std::time::Duration;
/// use syncguard::{LockOptions, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let guard = syncguard::acquire(&backend, "worker:1", &LockOptions::default()).await?;
/// tokio::select! {
///     _ = tokio::signal::ctrl_c() => {}
///     _ = tokio::time::sleep(Duration::from_millis(10)) => {} // the work
/// }
/// let report = syncguard::shutdown(Duration::from_secs(5)).await;
/// assert!(report.all_free());
/// assert!(guard.is_lost()); // its lock was released
/// # Ok(()) }
/// ```
pub async fn shutdown(timeout: Duration) -> ShutdownReport {
    let deadline = later(Instant::now(), timeout);
    let held: Vec<(Arc<dyn LockBackend>, Arc<Shared>)> = held()
        .values()
        .map(|held| (Arc::clone(&held.backend), Arc::clone(&held.shared)))
        .collect();
    let mut report = ShutdownReport::default();
    let mut releases = JoinSet::new();
    let mut names = HashMap::new();
    for (backend, shared) in held {
        if shared.lost_reason() == Some(LostReason::NotHeld) {
            report.already_free += 1;
            continue;
        }
        // The holder learns first that the lock is gone; then it is released.
        shared.end_by_shutdown();
        let key_hash = shared.name.to_string();
        let task = releases.spawn(async move {
            let outcome = shared.let_go(backend.as_ref()).await;
            (shared, outcome)
        });
        names.insert(task.id(), key_hash);
    }
    while let Ok(Some(joined)) = timeout_at(deadline, releases.join_next_with_id()).await {
        match joined {
            Ok((id, (_, Ok(ReleaseOutcome::Released)))) => {
                names.remove(&id);
                report.released += 1;
            }
            Ok((id, (_, Ok(ReleaseOutcome::NotHeld(_))))) => {
                names.remove(&id);
                report.already_free += 1;
            }
            Ok((id, (_, Err(error)))) => {
                let key_hash = names.remove(&id).unwrap_or_default();
                tracing::warn!(lock = %key_hash, %error, "syncguard::shutdown could not release a lock; it stays held until its ttl runs out");
                report.failed += 1;
            }
            Err(error) => {
                let key_hash = names.remove(&error.id()).unwrap_or_default();
                tracing::warn!(lock = %key_hash, %error, "syncguard::shutdown: a release task failed; the lock stays held until its ttl runs out");
                report.failed += 1;
            }
        }
    }
    report.unanswered = releases.len();
    for key_hash in names.values() {
        tracing::warn!(lock = %key_hash, ?timeout, "syncguard::shutdown: no answer to a release within the timeout; the lock may stay held until its ttl runs out");
    }
    releases.detach_all();
    report
}
