//! Diagnostics: who holds a lock, and until when.

use crate::backend::{LockBackend, LockInfo, Lookup};
use crate::error::LockError;
use crate::lock_id::LockId;

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
    /// Who took the lock, when it was taken with
    /// [`LockBackend::acquire_as`](crate::LockBackend::acquire_as).
    pub holder: Option<String>,
}

impl From<LockInfo> for LockInfoRaw {
    fn from(info: LockInfo) -> Self {
        Self {
            key: info.key().to_owned(),
            lock_id: info.lock_id().clone(),
            holder: info.holder().map(str::to_owned),
            info,
        }
    }
}

/// The live lock on `key`, sanitized; `None` if the key is free or its lock expired.
///
/// # Errors
/// [`ErrorCode::InvalidArgument`](crate::ErrorCode::InvalidArgument) for an invalid key; backend
/// errors as they come.
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
