//! What the code `#[locked]` generates uses, beside the public API; not for direct use.
//!
//! The code `#[locked]` generates calls [`LockOptions::builder`](crate::LockOptions::builder),
//! [`acquire`](crate::acquire), [`LockGuard::run`](crate::LockGuard::run) and
//! [`LockGuard::release_in_background`](crate::LockGuard::release_in_background), as anyone
//! can. It needs two things more, both traits with a blanket implementation: one turns a [`LockError`] into
//! the function's own error type, the other finds the backend behind the expression given as
//! `backend = ...`; and, for `skip_if_held = true`, a third that gives a skipped run's result
//! ([`try_acquire`](crate::try_acquire) found the lock held). They are public, and documented, so that a compile error about a misused
//! `#[locked]` names them plainly.

use crate::backend::LockBackend;
use crate::error::LockError;

/// The return types of a `#[locked]` function: a `Result` whose error type can hold a
/// [`LockError`] (`E: From<LockError>`), through which lock failures (contention, a backend
/// error, a lost lock) reach the caller.
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

/// The backend named by `backend = ...`: a [`LockBackend`] that is `Clone + 'static`, as
/// [`acquire`](crate::acquire) takes. Called with method syntax, so that auto-deref finds the
/// backend behind references, `Arc`s and `LazyLock` statics.
#[diagnostic::on_unimplemented(
    message = "`backend = ...` must name a `syncguard::LockBackend` that is `Clone + 'static`; `{Self}` is not",
    label = "not a lock backend"
)]
pub trait BackendArg {
    /// The backend itself.
    fn as_lock_backend(&self) -> &Self;
}

impl<B: LockBackend + Clone + 'static> BackendArg for B {
    fn as_lock_backend(&self) -> &Self {
        self
    }
}

/// The return types of a `#[locked(skip_if_held = true)]` function, and what a run skipped
/// because the lock was held returns: `Ok(())` for `Result<(), E>`, `Ok(None)` for
/// `Result<Option<T>, E>`. Skipping is a normal outcome, not an error.
#[diagnostic::on_unimplemented(
    message = "`#[locked(skip_if_held = true)]` functions must return `Result<(), E>` or `Result<Option<T>, E>`, not `{Self}`",
    label = "a skipped run has no value of this type to return",
    note = "a run skipped because the lock is held returns `Ok(())` or `Ok(None)`"
)]
pub trait SkippedResult {
    /// The result of a skipped run.
    fn skipped() -> Self;
}

impl<E> SkippedResult for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

impl<T, E> SkippedResult for Result<Option<T>, E> {
    fn skipped() -> Self {
        Ok(None)
    }
}
