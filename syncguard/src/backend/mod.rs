//! The contract between syncguard and a storage backend: what a backend implements, and the
//! types its operations exchange.
//!
//! Users of the built-in backends rarely need this module: [`acquire`](crate::acquire),
//! [`with_lock`](crate::with_lock) and [`LockGuard`](crate::LockGuard) call the backend. It is
//! for writing a backend (run the conformance suite, `syncguard::conformance`, against it),
//! a decorator (as the telemetry ones), or an observer ([`LockObserver`]). [`key`] and
//! [`time`] are the reference design's rules a backend stores by: key normalization and
//! storage names, and expiry in milliseconds with its tolerance.
//!
//! # Why the operations return boxed futures
//!
//! The core keeps every backend as an `Arc<dyn LockBackend>`: a guard and its heartbeat, the
//! process-wide [default backend](crate::set_default_backend) that `#[locked]` falls back on,
//! and the decorators that wrap any backend (telemetry) all hold one, so that one
//! [`LockGuard`](crate::LockGuard) type serves every backend and a backend can be chosen at
//! run time. A trait used as `dyn` cannot have `async fn` methods nor methods returning
//! `impl Future`: their future types differ per implementation, and a vtable needs one type.
//! So each method returns a [`BoxFuture`], one allocation per call, which is small beside the
//! network round trip a backend operation makes. The alternative, an `async fn` trait for
//! implementers and an object-safe twin with a blanket impl (sqlx's
//! `AnyConnectionBackend`), would give implementers nicer signatures at the price of two
//! traits to learn and keep in step; implementing this one is writing
//! `Box::pin(async move { ... })` around each body.

mod holder;
mod info;
pub mod key;
mod observer;
mod outcome;
pub mod time;
mod wake;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::lock_id::LockId;

pub use holder::{MAX_HOLDER_BYTES, check_holder};
pub use info::{LockInfo, RevealedLockInfo};
pub use observer::LockObserver;
pub use outcome::{
    AcquireOutcome, Capabilities, Contention, ExtendOutcome, Lease, Lookup, NotHeldReason,
    ReleaseOutcome, TimeAuthority,
};
#[cfg(feature = "redis-cluster")]
pub(crate) use wake::KeyListener;
pub use wake::{ReleaseNotifier, ReleaseSubscription, ReleaseWatch, Wake};

/// The future every [`LockBackend`] method returns: boxed, so that the trait stays usable as
/// `Arc<dyn LockBackend>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A storage backend for distributed locks: single-attempt, atomic operations on one store.
///
/// Backends do not retry, wait or heartbeat: [`acquire`](crate::acquire),
/// [`with_lock`](crate::with_lock) and [`LockGuard`](crate::LockGuard) do that on top of any
/// backend. Every method validates its arguments before any I/O and fails with
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) without changing anything.
///
/// The trait is object safe (`Arc<dyn LockBackend>` is itself a backend) and its futures are
/// `Send`. To implement it, write `Box::pin(async move { ... })` bodies and run the
/// conformance suite (`syncguard::conformance`, feature `conformance`) against the
/// implementation.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use syncguard::backend::{AcquireOutcome, LockBackend};
/// use syncguard::MemoryBackend;
///
/// let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
/// let AcquireOutcome::Acquired(lease) = backend.acquire("job:1", Duration::from_secs(30)).await? else {
///     unreachable!("nobody else holds job:1");
/// };
/// assert!(backend.acquire("job:1", Duration::from_secs(30)).await?.is_contended());
/// assert!(backend.release(&lease.lock_id).await?.is_released());
/// # Ok(()) }
/// ```
pub trait LockBackend: Send + Sync {
    /// Tries once to take the lock on `key` for `ttl`.
    ///
    /// Returns the new [`Lease`] (lock id, authoritative expiry, fence) or
    /// [`AcquireOutcome::Contended`] if a live lock holds the key (with the holder's expiry
    /// when the backend learns it without extra I/O).
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>>;

    /// Releases the lock held by `lock_id`, if it is still live. At most one release of a lock
    /// succeeds; it never touches another owner's lock.
    fn release<'a>(
        &'a self,
        lock_id: &'a LockId,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, LockError>>;

    /// Sets the expiry of the live lock held by `lock_id` to *now + `ttl`* (it replaces the
    /// remaining time, it does not add to it) and returns the new authoritative expiry. An
    /// expired lock is never revived.
    fn extend<'a>(
        &'a self,
        lock_id: &'a LockId,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>>;

    /// Whether a live lock holds `key`.
    fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>>;

    /// The live lock on a key, or held by a lock id; `None` when missing or expired.
    ///
    /// For diagnostics only: never gate a release or extend on it (they verify ownership
    /// atomically themselves). Prefer [`get_by_key`](crate::get_by_key) and
    /// [`get_by_id`](crate::get_by_id).
    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>>;

    /// What this backend is and guarantees.
    fn capabilities(&self) -> Capabilities;

    /// [`acquire`](Self::acquire) on behalf of `holder`, an identity the caller chooses
    /// (checked by [`check_holder`]), stored with the lock and shown by
    /// [`lookup`](Self::lookup) (in [`RevealedLockInfo::holder`](crate::RevealedLockInfo::holder)).
    ///
    /// Re-entrant by holder: when a live lock on `key` was taken by the same `holder`, it is
    /// taken again, keeping its lock id and fence, with a fresh lease (it expires at
    /// *now + `ttl`* and counts as acquired now). A live lock of another holder, or one taken
    /// without a holder, is [`AcquireOutcome::Contended`].
    ///
    /// For services that lock on behalf of clients identified by something other than a lock
    /// id (such as `syncguard-server`). Only backends whose
    /// [`capabilities`](Self::capabilities) say `holders` implement it; the others return
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument).
    fn acquire_as<'a>(
        &'a self,
        key: &'a str,
        ttl: Duration,
        holder: &'a str,
    ) -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
        let _ = (key, ttl, holder);
        let error = holder::unsupported(self.capabilities().backend, "acquire_as");
        Box::pin(async move { Err(error) })
    }

    /// Adds `by` to the expiry of the live lock held by `lock_id` (to its current expiry, not
    /// to now; `by` is checked as a ttl is) and returns the new authoritative expiry. An
    /// expired lock is never revived. Implemented with [`acquire_as`](Self::acquire_as).
    fn extend_by<'a>(
        &'a self,
        lock_id: &'a LockId,
        by: Duration,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let _ = (lock_id, by);
        let error = holder::unsupported(self.capabilities().backend, "extend_by");
        Box::pin(async move { Err(error) })
    }

    /// Sets the expiry of the live lock held by `lock_id` to `expires_at_ms` (Unix ms of the
    /// backend's [time authority](TimeAuthority)), earlier or later than it is, and returns
    /// it. An expired lock is never revived; an `expires_at_ms` already past (tolerance
    /// included) leaves the lock expired.
    ///
    /// The end of a hold that must last until a fixed time whenever the request lands:
    /// a release within [`min_hold`](crate::LockOptionsBuilder::min_hold) keeps the lock until
    /// then with this call, so that a request delayed in the network can never keep the lock
    /// past the time it names (an extend counts its ttl from its arrival).
    ///
    /// A guard names the end of its minimum hold as its acquire's expiry less its ttl (when
    /// the backend took the lock) plus `min_hold`: a backend that implements this reports
    /// expiries of exactly *the time it took the lock + ttl*, on the clock this call reads.
    /// Like an extend, it claims the lock (see [`acquire_as`](Self::acquire_as)'s in-doubt
    /// releases in the backends' documentation).
    ///
    /// The built-in backends implement it; the default refuses with
    /// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument), and a guard with
    /// `min_hold` then fails its release (the lock expires at the end of its lease).
    fn expire_at<'a>(
        &'a self,
        lock_id: &'a LockId,
        expires_at_ms: u64,
    ) -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
        let _ = (lock_id, expires_at_ms);
        let error = LockError::invalid_argument(format!(
            "the {} backend cannot set a lock's expiry to a fixed time (`expire_at`), which \
             `min_hold` needs; drop `min_hold` or use a built-in backend",
            self.capabilities().backend
        ));
        Box::pin(async move { Err(error) })
    }

    /// Instrumentation that wants the events of acquiring and holding locks through this
    /// backend (waits, heartbeats, hold times, losses). `None` by default; the telemetry
    /// decorators return theirs.
    fn observer(&self) -> Option<Arc<dyn LockObserver>> {
        None
    }

    /// Where this backend announces the releases it learns of, so that waiters in this
    /// process wake on release instead of polling. `None` (the default): waiters poll.
    ///
    /// A backend that returns one calls [`ReleaseNotifier::released`] for every release it
    /// learns of (its own releases, and those its server announces) and
    /// [`ReleaseNotifier::missed_releases`] when announcements may have been lost. Waiters
    /// never rely on it alone: they also poll, so a lost announcement costs time, never
    /// correctness.
    fn release_notifier(&self) -> Option<ReleaseNotifier> {
        None
    }
}

/// Implements `LockBackend` for `$ty` by calling the backend that `$inner` reaches from
/// `$this` (`&self`): for smart pointers, and for the telemetry decorators' newtypes.
macro_rules! forward_backend {
    (impl[$($generics:tt)*] $ty:ty => |$this:ident| $inner:expr) => {
        impl<$($generics)*> $crate::backend::LockBackend for $ty {
            fn acquire<'a>(&'a self, key: &'a str, ttl: std::time::Duration)
                -> $crate::backend::BoxFuture<'a, Result<$crate::backend::AcquireOutcome, $crate::LockError>> {
                let $this = self;
                ($inner).acquire(key, ttl)
            }
            fn release<'a>(&'a self, lock_id: &'a $crate::LockId)
                -> $crate::backend::BoxFuture<'a, Result<$crate::backend::ReleaseOutcome, $crate::LockError>> {
                let $this = self;
                ($inner).release(lock_id)
            }
            fn extend<'a>(&'a self, lock_id: &'a $crate::LockId, ttl: std::time::Duration)
                -> $crate::backend::BoxFuture<'a, Result<$crate::backend::ExtendOutcome, $crate::LockError>> {
                let $this = self;
                ($inner).extend(lock_id, ttl)
            }
            fn is_locked<'a>(&'a self, key: &'a str)
                -> $crate::backend::BoxFuture<'a, Result<bool, $crate::LockError>> {
                let $this = self;
                ($inner).is_locked(key)
            }
            fn lookup<'a>(&'a self, query: $crate::backend::Lookup<'a>)
                -> $crate::backend::BoxFuture<'a, Result<Option<$crate::backend::LockInfo>, $crate::LockError>> {
                let $this = self;
                ($inner).lookup(query)
            }
            fn acquire_as<'a>(&'a self, key: &'a str, ttl: std::time::Duration, holder: &'a str)
                -> $crate::backend::BoxFuture<'a, Result<$crate::backend::AcquireOutcome, $crate::LockError>> {
                let $this = self;
                ($inner).acquire_as(key, ttl, holder)
            }
            fn extend_by<'a>(&'a self, lock_id: &'a $crate::LockId, by: std::time::Duration)
                -> $crate::backend::BoxFuture<'a, Result<$crate::backend::ExtendOutcome, $crate::LockError>> {
                let $this = self;
                ($inner).extend_by(lock_id, by)
            }
            fn expire_at<'a>(&'a self, lock_id: &'a $crate::LockId, expires_at_ms: u64)
                -> $crate::backend::BoxFuture<'a, Result<$crate::backend::ExtendOutcome, $crate::LockError>> {
                let $this = self;
                ($inner).expire_at(lock_id, expires_at_ms)
            }
            fn capabilities(&self) -> $crate::backend::Capabilities {
                let $this = self;
                ($inner).capabilities()
            }
            fn observer(&self) -> Option<std::sync::Arc<dyn $crate::backend::LockObserver>> {
                let $this = self;
                ($inner).observer()
            }
            fn release_notifier(&self) -> Option<$crate::backend::ReleaseNotifier> {
                let $this = self;
                ($inner).release_notifier()
            }
        }
    };
}
pub(crate) use forward_backend;

forward_backend!(impl[B: LockBackend + ?Sized] Arc<B> => |this| **this);
forward_backend!(impl[B: LockBackend + ?Sized] Box<B> => |this| **this);
forward_backend!(impl[B: LockBackend + ?Sized] &B => |this| **this);
