//! Items the `#[locked]` macro's generated code uses. Not public API: no stability promise.

use std::sync::Arc;

pub use std::time::Duration;

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
        Arc::new(self.clone())
    }
}

/// The error a `#[locked]` function returns when its lock was lost.
pub fn lost(reason: LostReason) -> LockError {
    LockError::LockLost { reason }
}
