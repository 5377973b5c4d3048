//! Hooks into the life of a held lock, for instrumentation.

use std::time::Duration;

use super::Lease;
use crate::error::{LockError, LostReason};
use crate::lock_id::LockId;

/// Receives the events of acquiring and holding locks that single backend calls cannot see:
/// how long an acquire waited, heartbeats, how long a lock was held, losses.
///
/// A backend that wants them (the telemetry decorators do) returns an observer from
/// [`LockBackend::observer`](crate::LockBackend::observer); [`acquire`](crate::acquire),
/// [`LockGuard`](crate::LockGuard) and so [`with_lock`](crate::with_lock), `#[locked]` and the
/// Tower layer then report to it. Every method has an empty default; they are called inline,
/// so keep them quick and never block.
pub trait LockObserver: Send + Sync {
    /// A lock was acquired after `wait` and `attempts` acquire calls.
    fn acquired(&self, key: &str, lease: &Lease, wait: Duration, attempts: u32) {
        let _ = (key, lease, wait, attempts);
    }

    /// Acquiring gave up (contention past the retry policy, or a backend error) after `wait`.
    fn gave_up(&self, key: &str, error: &LockError, wait: Duration, attempts: u32) {
        let _ = (key, error, wait, attempts);
    }

    /// The heartbeat extended the lock held by `lock_id` (`ok`) or failed to (a backend error
    /// or "not held").
    fn heartbeat(&self, key: &str, lock_id: &LockId, ok: bool) {
        let _ = (key, lock_id, ok);
    }

    /// The holder released the lock held by `lock_id` after holding it for `held`.
    fn released(&self, key: &str, lock_id: &LockId, held: Duration) {
        let _ = (key, lock_id, held);
    }

    /// The lock held by `lock_id` was lost after being held for `held`.
    fn lost(&self, key: &str, lock_id: &LockId, reason: LostReason, held: Duration) {
        let _ = (key, lock_id, reason, held);
    }
}
