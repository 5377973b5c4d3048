//! The contract every storage backend implements, and the diagnostic helpers built on it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::key::hash_key;
use crate::observe::LockObserver;
use crate::{Fence, LockError, LockId};

/// The future every [`LockBackend`] method returns: boxed, so that the trait stays usable as
/// `Arc<dyn LockBackend>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A storage backend for distributed locks: single-attempt, atomic operations on one store.
///
/// Backends do not retry, wait or heartbeat: [`acquire`](crate::acquire),
/// [`with_lock`](crate::with_lock) and [`LockGuard`](crate::LockGuard) do that on top of any
/// backend. Every method validates its arguments before any I/O and fails with
/// [`LockError::InvalidArgument`] without changing anything.
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
/// use syncguard::{AcquireOutcome, LockBackend, MemoryBackend};
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
    /// [`AcquireOutcome::Contended`] if a live lock holds the key.
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
    /// atomically themselves). Prefer [`get_by_key`] and [`get_by_id`].
    fn lookup<'a>(
        &'a self,
        query: Lookup<'a>,
    ) -> BoxFuture<'a, Result<Option<LockInfo>, LockError>>;

    /// What this backend is and guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Instrumentation that wants the events of acquiring and holding locks through this
    /// backend (waits, heartbeats, hold times, losses). `None` by default; the telemetry
    /// decorators return theirs.
    fn observer(&self) -> Option<Arc<dyn LockObserver>> {
        None
    }

    /// [`acquire`](Self::acquire) without a future, for a backend that answers without
    /// waiting (an in-process store): `Some` with the outcome `acquire` would have given (the
    /// lock is then taken, or not, exactly as by `acquire`), or `None` when the answer needs
    /// I/O, and the caller then calls `acquire`.
    ///
    /// [`acquire`](crate::acquire), [`LockGuard`](crate::LockGuard) and the Tower layer try
    /// this first, which spares them the boxed future. `None` by default, which is always
    /// correct; a backend that overrides it must not block, and counts expiries on the local
    /// clock (guards take its answer as given at the moment of the call).
    fn try_acquire_now(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Option<Result<AcquireOutcome, LockError>> {
        let _ = (key, ttl);
        None
    }

    /// [`release`](Self::release) without a future, as [`try_acquire_now`](Self::try_acquire_now):
    /// `Some` with the outcome `release` would have given, or `None` (the default) when the
    /// answer needs I/O.
    fn try_release_now(&self, lock_id: &LockId) -> Option<Result<ReleaseOutcome, LockError>> {
        let _ = lock_id;
        None
    }
}

macro_rules! forward_backend {
    ($($ty:ty),*) => {$(
        impl<B: LockBackend + ?Sized> LockBackend for $ty {
            fn acquire<'a>(&'a self, key: &'a str, ttl: Duration)
                -> BoxFuture<'a, Result<AcquireOutcome, LockError>> {
                (**self).acquire(key, ttl)
            }
            fn release<'a>(&'a self, lock_id: &'a LockId)
                -> BoxFuture<'a, Result<ReleaseOutcome, LockError>> {
                (**self).release(lock_id)
            }
            fn extend<'a>(&'a self, lock_id: &'a LockId, ttl: Duration)
                -> BoxFuture<'a, Result<ExtendOutcome, LockError>> {
                (**self).extend(lock_id, ttl)
            }
            fn is_locked<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, LockError>> {
                (**self).is_locked(key)
            }
            fn lookup<'a>(&'a self, query: Lookup<'a>)
                -> BoxFuture<'a, Result<Option<LockInfo>, LockError>> {
                (**self).lookup(query)
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn observer(&self) -> Option<Arc<dyn LockObserver>> {
                (**self).observer()
            }
            fn try_acquire_now(&self, key: &str, ttl: Duration)
                -> Option<Result<AcquireOutcome, LockError>> {
                (**self).try_acquire_now(key, ttl)
            }
            fn try_release_now(&self, lock_id: &LockId)
                -> Option<Result<ReleaseOutcome, LockError>> {
                (**self).try_release_now(lock_id)
            }
        }
    )*};
}

forward_backend!(Arc<B>, Box<B>, &B);

/// A successful acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The handle for release and extend.
    pub lock_id: LockId,
    /// When the lock expires, in Unix milliseconds of the backend's time authority.
    pub expires_at_ms: u64,
    /// The fencing token of this acquisition.
    pub fence: Fence,
}

impl Lease {
    /// A lease, as a backend reports it.
    pub fn new(lock_id: LockId, expires_at_ms: u64, fence: Fence) -> Self {
        Self {
            lock_id,
            expires_at_ms,
            fence,
        }
    }
}

/// The result of one acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum AcquireOutcome {
    /// The lock was taken.
    Acquired(Lease),
    /// A live lock already holds the key (telemetry reason `"locked"`).
    Contended,
}

impl AcquireOutcome {
    /// The lease, if the lock was taken.
    pub fn lease(self) -> Option<Lease> {
        match self {
            Self::Acquired(lease) => Some(lease),
            Self::Contended => None,
        }
    }

    /// Whether another owner holds the key.
    pub const fn is_contended(&self) -> bool {
        matches!(self, Self::Contended)
    }
}

/// Why a release or extend found no live lock for its lock id, when the backend learnt it
/// without extra I/O. Telemetry reports it; the public outcome is just "not held".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// The lock was found but had expired.
    Expired,
    /// No lock was found for the lock id.
    NotFound,
}

impl NotHeldReason {
    /// The telemetry spelling: `"expired"` or `"not-found"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::NotFound => "not-found",
        }
    }
}

impl fmt::Display for NotHeldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ReleaseOutcome {
    /// The lock was live and is now released.
    Released,
    /// No live lock was held by the lock id; nothing changed. The reason is `None` when the
    /// backend could not tell without extra I/O.
    NotHeld(Option<NotHeldReason>),
}

impl ReleaseOutcome {
    /// Whether this call released the lock.
    pub const fn is_released(&self) -> bool {
        matches!(self, Self::Released)
    }
}

/// The result of an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ExtendOutcome {
    /// The lock now expires at `expires_at_ms` (Unix ms, the backend's time authority).
    Extended {
        /// The new authoritative expiry: schedule the next extend from it.
        expires_at_ms: u64,
    },
    /// No live lock was held by the lock id; nothing changed (an expired lock is not revived).
    NotHeld(Option<NotHeldReason>),
}

impl ExtendOutcome {
    /// The new expiry, if the lock was extended.
    pub const fn expires_at_ms(&self) -> Option<u64> {
        match self {
            Self::Extended { expires_at_ms } => Some(*expires_at_ms),
            Self::NotHeld(_) => None,
        }
    }
}

/// What a [`LockBackend::lookup`] looks for.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    /// The live lock on this key (direct access).
    Key(&'a str),
    /// The live lock held by this lock id (reverse lookup, then an ownership check).
    LockId(&'a LockId),
}

/// Whose clock decides expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeAuthority {
    /// The server's clock (PostgreSQL `now()`, Redis `TIME`): client clocks do not matter.
    Server,
    /// Each client's clock: clients must be NTP-synchronized well within the 1 s tolerance.
    Client,
}

/// What a backend is and guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The backend's name (`"memory"`, `"postgres"`, `"redis"`, `"firestore"`).
    pub backend: &'static str,
    /// Whether acquisitions carry fencing tokens (all built-in backends do).
    pub supports_fencing: bool,
    /// Whose clock decides expiry.
    pub time_authority: TimeAuthority,
}

impl Capabilities {
    /// Capabilities of a fencing backend.
    pub const fn new(backend: &'static str, time_authority: TimeAuthority) -> Self {
        Self {
            backend,
            supports_fencing: true,
            time_authority,
        }
    }
}

/// A live lock as diagnostics see it: sanitized, with hashes in place of the raw key and lock
/// id (see [`hash_key`]). [`get_by_key_raw`] and [`get_by_id_raw`] give the raw values when
/// debugging calls for them.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// Sanitized hash of the key.
    pub key_hash: String,
    /// Sanitized hash of the lock id.
    pub lock_id_hash: String,
    /// When the lock expires (Unix ms, the backend's time authority).
    pub expires_at_ms: u64,
    /// When the lock was acquired (Unix ms, the backend's time authority).
    pub acquired_at_ms: u64,
    /// The fencing token of the acquisition.
    pub fence: Fence,
    // Kept for the explicit raw helpers only; never printed.
    key: String,
    lock_id: LockId,
}

impl LockInfo {
    /// Builds the sanitized view of a stored lock (a backend calls this in `lookup`).
    pub fn new(
        key: String,
        lock_id: LockId,
        expires_at_ms: u64,
        acquired_at_ms: u64,
        fence: Fence,
    ) -> Self {
        Self {
            key_hash: hash_key(&key),
            lock_id_hash: hash_key(lock_id.as_str()),
            expires_at_ms,
            acquired_at_ms,
            fence,
            key,
            lock_id,
        }
    }
}

impl fmt::Debug for LockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockInfo")
            .field("key_hash", &self.key_hash)
            .field("lock_id_hash", &self.lock_id_hash)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("acquired_at_ms", &self.acquired_at_ms)
            .field("fence", &self.fence)
            .finish()
    }
}

/// A live lock with its raw key and lock id. **Sensitive**: for debugging only; do not log it
/// in production.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfoRaw {
    /// The sanitized view.
    pub info: LockInfo,
    /// The raw (NFC-normalized) key.
    pub key: String,
    /// The raw lock id.
    pub lock_id: LockId,
}

impl From<LockInfo> for LockInfoRaw {
    fn from(info: LockInfo) -> Self {
        Self {
            key: info.key.clone(),
            lock_id: info.lock_id.clone(),
            info,
        }
    }
}

/// The live lock on `key`, sanitized; `None` if the key is free or its lock expired.
///
/// # Errors
/// [`LockError::InvalidArgument`] for an invalid key; backend errors as they come.
pub async fn get_by_key<B: LockBackend + ?Sized>(
    backend: &B,
    key: &str,
) -> Result<Option<LockInfo>, LockError> {
    backend.lookup(Lookup::Key(key)).await
}

/// The live lock held by `lock_id`, sanitized; `None` if it was released or expired.
///
/// # Errors
/// Backend errors as they come.
pub async fn get_by_id<B: LockBackend + ?Sized>(
    backend: &B,
    lock_id: &LockId,
) -> Result<Option<LockInfo>, LockError> {
    backend.lookup(Lookup::LockId(lock_id)).await
}

/// As [`get_by_key`], with the raw key and lock id. **Sensitive**: debugging only.
///
/// # Errors
/// As [`get_by_key`].
pub async fn get_by_key_raw<B: LockBackend + ?Sized>(
    backend: &B,
    key: &str,
) -> Result<Option<LockInfoRaw>, LockError> {
    Ok(get_by_key(backend, key).await?.map(LockInfoRaw::from))
}

/// As [`get_by_id`], with the raw key and lock id. **Sensitive**: debugging only.
///
/// # Errors
/// As [`get_by_id`].
pub async fn get_by_id_raw<B: LockBackend + ?Sized>(
    backend: &B,
    lock_id: &LockId,
) -> Result<Option<LockInfoRaw>, LockError> {
    Ok(get_by_id(backend, lock_id).await?.map(LockInfoRaw::from))
}

/// Whether `lock_id` still holds a live lock.
///
/// For diagnostics and UIs only: the answer can be stale by the time it arrives, so never
/// check ownership and then act on it. Release and extend verify ownership atomically.
///
/// # Errors
/// Backend errors as they come.
pub async fn owns<B: LockBackend + ?Sized>(
    backend: &B,
    lock_id: &LockId,
) -> Result<bool, LockError> {
    Ok(get_by_id(backend, lock_id).await?.is_some())
}
