//! A live lock as diagnostics see it.

use std::fmt;

use crate::backend::key::hash_key;
use crate::fence::Fence;
use crate::lock_id::LockId;

/// A live lock as diagnostics see it: sanitized, with hashes in place of the raw key and lock
/// id (see [`hash_key`]). [`reveal`](Self::reveal) gives the raw values when debugging calls
/// for them: the one way to them, so that a sensitive value is never printed by accident.
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
    // Only through `reveal`; never printed (a holder may carry a client's secret).
    key: String,
    lock_id: LockId,
    holder: Option<String>,
}

impl LockInfo {
    /// The raw lock id, for a backend's own ownership checks.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn lock_id(&self) -> &LockId {
        &self.lock_id
    }

    /// The raw key, lock id and holder beside this sanitized view. **Sensitive**: a lock id
    /// lets anyone release or extend the lock, and a key or holder may carry personal data or
    /// a client's secret; for debugging and for services that must act on a lock by its id,
    /// never for logs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), syncguard::LockError> {
    /// use std::time::Duration;
    /// use syncguard::{LockBackend, LockInfo, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let lease = backend.acquire("job:1", Duration::from_secs(30)).await?.lease().unwrap();
    /// let found = syncguard::get_by_key(&backend, "job:1").await?.map(LockInfo::reveal).unwrap();
    /// assert_eq!(found.key, "job:1");
    /// assert_eq!(found.lock_id, lease.lock_id);
    /// assert_eq!(found.info.fence, lease.fence);
    /// # Ok(()) }
    /// ```
    pub fn reveal(self) -> RevealedLockInfo {
        RevealedLockInfo {
            key: self.key.clone(),
            lock_id: self.lock_id.clone(),
            holder: self.holder.clone(),
            info: self,
        }
    }

    /// The same lock, taken by `holder` ([`LockBackend::acquire_as`](super::LockBackend::acquire_as));
    /// a backend that stores holders calls this in `lookup`.
    #[must_use]
    pub fn with_holder(mut self, holder: Option<String>) -> Self {
        self.holder = holder;
        self
    }

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
            holder: None,
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

/// A live lock with its raw key, lock id and holder: what [`LockInfo::reveal`] gives.
/// **Sensitive**: for debugging, or to act on the lock by its id; never log it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RevealedLockInfo {
    /// The sanitized view.
    pub info: LockInfo,
    /// The raw (NFC-normalized) key.
    pub key: String,
    /// The raw lock id.
    pub lock_id: LockId,
    /// Who took the lock, when it was taken with
    /// [`LockBackend::acquire_as`](super::LockBackend::acquire_as).
    pub holder: Option<String>,
}
