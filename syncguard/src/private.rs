//! Items the `#[locked]` macro's generated code and `syncguard-tower` use. Not public API: no
//! stability promise.

use std::sync::Arc;
use std::task::{Context, Poll};

pub use std::time::Duration;

pub use crate::guard::GuardView;
pub use crate::key_text::KeyText;
pub use crate::lock::{acquire_shared, default_backend, release_logged, run_guarded};
pub use crate::{
    Backoff, Jitter, LockBackend, LockError, LockGuard, LockOptions, LostReason, OnLost,
    RetryPolicy,
};

/// The result types a `#[locked]` function may return: a `Result` whose error can hold a
/// [`LockError`].
#[diagnostic::on_unimplemented(
    message = "`#[locked]` functions must return `Result<T, E>` where `E: From<syncguard::LockError>`, not `{Self}`",
    label = "this return type cannot carry a `syncguard::LockError`",
    note = "return a `Result` whose error type implements `From<syncguard::LockError>` (for example `syncguard::LockError` itself, `Box<dyn std::error::Error + Send + Sync>`, or your own error with a `From` impl)"
)]
pub trait LockedResult {
    /// The error result for a lock failure.
    fn from_lock_error(error: LockError) -> Self;
}

impl<T, E: From<LockError>> LockedResult for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// A shared handle on the backend named by `backend = ...`. Called with method syntax, so
/// that auto-deref finds the backend behind references, `Arc`s and `LazyLock` statics.
#[diagnostic::on_unimplemented(
    message = "`backend = ...` must name a `syncguard::LockBackend` that is `Clone + 'static`; `{Self}` is not",
    label = "not a lock backend"
)]
pub trait SharedBackend {
    /// The backend behind an `Arc`.
    fn shared_backend(&self) -> Arc<dyn LockBackend>;
}

impl<B: LockBackend + Clone + 'static> SharedBackend for B {
    fn shared_backend(&self) -> Arc<dyn LockBackend> {
        crate::lock::share(self)
    }
}

/// Acquires like [`acquire_shared`], but nobody keeps the lock until the guard's owner runs
/// [`poll_keeper`] (or [`detach_keeper`]): for an owner that is itself a future, which then
/// holds the lock without a task of its own. The key comes apart from the options, which an
/// owner may share between acquisitions (their own key is not read); it moves into the guard.
///
/// # Errors
/// As [`acquire_shared`], with the key given back.
pub async fn acquire_driven(
    backend: Arc<dyn LockBackend>,
    key: String,
    options: &LockOptions,
) -> Result<LockGuard, (LockError, String)> {
    crate::lock::acquire_driven(backend, key, options).await
}

pub use crate::lock::AcquiredNow;

/// [`acquire_driven`] without a future, when the backend answers at once
/// ([`LockBackend::try_acquire_now`]): the lock taken, the failure, or [`AcquiredNow::Later`]
/// when only [`acquire_driven`] can decide.
pub fn acquire_driven_now(
    backend: &Arc<dyn LockBackend>,
    key: KeyText,
    options: &LockOptions,
) -> AcquiredNow {
    crate::lock::acquire_driven_now(backend, key, options)
}

/// Releases `guard` without a future when its backend answers at once
/// ([`LockBackend::try_release_now`]), as [`LockGuard::release`] would; `None`, with nothing
/// done, when it cannot.
pub fn release_now(guard: &mut LockGuard) -> Option<Result<bool, LockError>> {
    guard.release_now()
}

/// Runs the keeper of a guard from [`acquire_driven`]: call it from the owner's `poll` each
/// time the owner is about to return `Pending` while holding the lock. `Ready` with the reason
/// once the lock is lost; `Pending` while it is held, with the waker of `cx` woken when the
/// next extend is due (or an extend in flight completes). The heartbeat only runs while the
/// owner is polled.
///
/// On a guard whose keeper is a task (from [`acquire_shared`], or detached) it only reports a
/// loss and registers no waker.
pub fn poll_keeper(guard: &mut LockGuard, cx: &mut Context<'_>) -> Poll<LostReason> {
    guard.poll_keeper(cx)
}

/// Hands the keeper of a guard from [`acquire_driven`] over to a spawned task, for when the
/// lock must be kept while nobody polls the owner (a response body waiting for a slow
/// client). The guard then behaves as one from [`acquire_shared`]. Must be called within a
/// tokio runtime.
pub fn detach_keeper(guard: &mut LockGuard) {
    guard.detach_keeper();
}

/// The error a `#[locked]` function returns when its lock was lost.
pub fn lost(reason: LostReason) -> LockError {
    LockError::LockLost { reason }
}
