//! A live lock as diagnostics see it.

use std::fmt;

use crate::fence::Fence;
use crate::key::hash_key;
use crate::lock_id::LockId;

/// A live lock as diagnostics see it: sanitized, with hashes in place of the raw key and lock
/// id (see [`hash_key`]). [`get_by_key_raw`](crate::get_by_key_raw) and
/// [`get_by_id_raw`](crate::get_by_id_raw) give the raw values when
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
    // Kept for the explicit raw helpers only; never printed (a holder may carry a client's
    // secret).
    key: String,
    lock_id: LockId,
    holder: Option<String>,
}

impl LockInfo {
    /// The raw key, for [`LockInfoRaw`](crate::LockInfoRaw) only.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The raw lock id, for [`LockInfoRaw`](crate::LockInfoRaw) only.
    pub(crate) fn lock_id(&self) -> &LockId {
        &self.lock_id
    }

    /// The holder, for [`LockInfoRaw`](crate::LockInfoRaw) only.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
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
