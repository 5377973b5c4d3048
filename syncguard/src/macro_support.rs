//! What the code `#[locked]` generates uses, beside the public API; not for direct use.
//!
//! The code `#[locked]` generates calls [`LockOptions::builder`](crate::LockOptions::builder),
//! [`acquire`](crate::acquire), [`LockGuard::run`](crate::LockGuard::run) and
//! [`LockGuard::release_logged`](crate::LockGuard::release_logged), as anyone can. It needs
//! two things more, both traits with a blanket implementation: one turns a [`LockError`] into
//! the function's own error type, the other finds the backend behind the expression given as
//! `backend = ...`. They are public, and documented, so that a compile error about a misused
//! `#[locked]` names them plainly.

use crate::LockError;
use crate::backend::LockBackend;

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
